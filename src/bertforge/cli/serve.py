"""``bertforge serve --model DIR [--model NAME=DIR ...]``: load the models once and serve them
over HTTP with uvicorn (an ASGI server: FastAPI's standard companion, one process, asyncio)."""

from __future__ import annotations

import errno
import socket
import sys

import torch

from bertforge.cli.options import parse_config
from bertforge.errors import BertforgeError
from bertforge.runtime import fix_mmap_threshold
from bertforge.serve.config import ServeConfig
from bertforge.serve.models import check_served_directory, load_served_model

MMAP_THRESHOLD_BYTES = 4 << 20
"""Allocations of this size or more get mappings of their own in the serving process
(:func:`~bertforge.runtime.fix_mmap_threshold`): in a paired 5-minute soak the resident memory
grew 1.8% instead of 7.7%, for 5% fewer answers (docs/reliability.md)."""


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn to serve on: bound here, before the models
    load and before "serving on" is printed, so a taken port is one line and exit 2 (uvicorn
    would log its own error and exit 3), and no other process can take the port in between."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn's default too
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise BertforgeError(f"port {port} on {host} is in use; pass another --port") from None
        reason = err.strerror or str(err)
        raise BertforgeError(
            f"cannot listen on {host}:{port} ({reason}); pass another --host or --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def main(argv: list[str]) -> int:
    """``bertforge serve``: load every model, then serve until interrupted."""
    config = parse_config(
        ServeConfig,
        argv,
        prog="bertforge serve",
        description="Serve models over HTTP: a JSON API (/docs) and an explorer page (/).",
    )
    try:
        import uvicorn  # noqa: F401

        from bertforge.serve import lifecycle
        from bertforge.serve.app import create_app
    except ImportError as err:
        raise BertforgeError(
            f"bertforge serve needs the serve extra ({err.name} is missing): "
            "pip install 'bertforge[serve]'"
        ) from err

    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    for name, directory in config.models.items():
        check_served_directory(name, directory)
    lifecycle.check_tls(config)
    sock = listen(config.host, config.port)  # a taken port fails now, not after the loading

    def load() -> dict:
        models = {}
        for name, directory in config.models.items():
            served = load_served_model(name, directory, config.device, config.precision)
            models[name] = served
            print(
                f"{name}: {served.kind} from {directory} ({served.options['precision']})",
                file=sys.stderr,
                flush=True,
            )
        return models

    def stop(err: BaseException) -> None:
        server.should_exit = True  # the error is raised below, once uvicorn has stopped

    # the serving process only (not a library's caller, nor the tests' in-process servers)
    fix_mmap_threshold(MMAP_THRESHOLD_BYTES)
    with sock:
        app = create_app(config, load, on_load_failure=stop)
        server = lifecycle.make_server(config, app, on_stop=app.state.server.begin_draining)
        if config.access_log:
            lifecycle.log_access_to_stderr()
        url = f"{config.scheme}://{config.host}:{config.port}"
        key = ", API key required" if config.api_key is not None else ""
        n = len(config.models)
        print(
            f"serving on {url} (page at /, API docs at /docs{key}); loading {n} "
            f"model{'s' if n > 1 else ''}: /health answers 200 once "
            f"{'they are' if n > 1 else 'it is'} ready",
            file=sys.stderr,
            flush=True,
        )
        server.run(sockets=[sock])
    error = app.state.server.load_error
    if error is not None:
        raise error
    return 0


__all__ = ["main"]
