"""Running the application under uvicorn: TLS, the access log on stderr, and a graceful stop.

On SIGTERM (what ``docker stop``, Kubernetes and systemd send) the server stops accepting
connections at once, answers 503 to ``/health`` on the connections still open (so a load
balancer takes it out of rotation), lets every request in flight finish within
``--shutdown_timeout`` seconds, and exits with status 0. uvicorn does the draining; what this
module changes is the end: uvicorn raises the caught signal again once it has drained, which
would end a clean stop with SIGTERM's status (143), as if it had been killed.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from bertforge.errors import BertforgeError
from bertforge.serve.access import LOGGER
from bertforge.serve.config import ServeConfig
from bertforge.serve.protocol import timed_protocol


def check_tls(config: ServeConfig) -> None:
    """Load the certificate and key once now, so a wrong file or a key that is not the
    certificate's is one line before anything else happens, not a traceback from uvicorn."""
    if config.ssl_certfile is None:
        return
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    except (ssl.SSLError, OSError) as err:
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or str(err)
        raise BertforgeError(
            f"--ssl_certfile {config.ssl_certfile} / --ssl_keyfile {config.ssl_keyfile}: "
            f"cannot use them ({reason}); give a PEM certificate and its private key"
        ) from None


def log_access_to_stderr() -> None:
    """One line per request on stderr, as the access-log middleware formats it."""
    if not LOGGER.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False


class GracefulServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM drains the requests in flight and then exits 0; SIGINT
    (Ctrl+C) drains too and ends as an interrupt, a second one at once."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_stop()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        caught: list[int] = []

        def handler(sig: int, frame: Any) -> None:
            caught.append(sig)
            self.handle_exit(sig, frame)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        if signal.SIGINT in caught:
            raise KeyboardInterrupt


def make_server(config: ServeConfig, app: Any, on_stop: Callable[[], None]) -> GracefulServer:
    """The uvicorn server of ``app`` under ``config`` (TLS, timeouts); ``on_stop`` is called
    when a signal asks it to stop. ``server.run(sockets=[sock])`` serves until then, and
    ``server.should_exit = True`` stops it from another thread."""
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=timed_protocol(config.request_timeout),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=config.shutdown_timeout,  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,  # ours: one line per request with its id (serve.access)
        ssl_certfile=config.ssl_certfile,
        ssl_keyfile=config.ssl_keyfile,
    )
    return GracefulServer(uvicorn_config, on_stop)


__all__ = ["GracefulServer", "check_tls", "log_access_to_stderr", "make_server"]
