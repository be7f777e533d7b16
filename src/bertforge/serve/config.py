"""The settings of ``bertforge serve``: which models, where to listen, and the limits that keep
one client from starving the others."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import resolve_model
from bertforge.runtime import Precision
from bertforge.training.config import check_at_least, check_choice

LogFormat = Literal["text", "json"]


@dataclass(kw_only=True)
class ServeConfig:
    """Options of ``bertforge serve``: which models, where to listen, and the limits."""

    model: list[str] = field(default_factory=list)
    """Model directory to serve, as DIR (named after its folder) or NAME=DIR; repeat the option
    for several models (the first one answers requests that name none)."""
    host: str = "127.0.0.1"
    """Address to listen on; the default answers this machine only. Any other address (such as
    0.0.0.0) needs --api_key, or --allow_unauthenticated to accept that anyone who can reach
    the port may use the models."""
    port: int = 8000
    """TCP port."""
    device: str = "auto"
    """auto, cpu, cuda or mps."""
    precision: Precision = "auto"
    """auto (bf16 where the hardware is fast at it), bf16 or fp32."""
    max_batch_tokens: int = 16384
    """Token budget of one forward pass: requests waiting for the same model and route are
    merged into one batch while their tokens add up to at most this."""
    workers: int = 1
    """Inference threads, each running its own forward passes (with --num_threads torch threads
    each). On a small CPU, 2 workers x 1 thread keep both cores busy where one pass of small
    batches on 2 threads leaves one waiting."""
    batch_wait_ms: float = 0.0
    """How long a forward pass may wait for more requests to join its batch while the batch is
    under --max_batch_tokens (milliseconds; 0 = start at once). Many concurrent clients: a few
    ms merge their requests into fewer, larger passes (more texts/s); one client: pure delay."""
    max_input_length: int = 512
    """Longest text in tokens (with [CLS]/[SEP]); longer ones are refused with 413, or cut when
    the request says truncate: true. Never more than a model's positions."""
    max_client_batch_size: int = 64
    """Most texts in one request (413 above it)."""
    max_concurrent_requests: int = 128
    """Most inference requests in flight at once; the next one gets 429 at once instead of
    queueing without bound."""
    max_payload_bytes: int = 1_000_000
    """Largest request body (413 above it)."""
    max_top_k: int = 100
    """Largest top_k of /fill-mask and /answer."""
    max_attention_tokens: int = 128
    """Longest text /attention and /attribute take: their answers grow with the square of it."""
    max_attribution_steps: int = 256
    """Largest steps of /attribute (each step is one forward and backward pass)."""
    num_threads: int | None = None
    """torch CPU threads of the inference worker (None = torch's default, one per core). On a
    machine whose cores also run the clients or other services, fewer threads than cores keep
    one forward pass from waiting on a thread the event loop or a client has pushed aside."""
    request_timeout: float = 60.0
    """Seconds a request may take from its first byte to its answer, reading its body included
    (408 while reading, 503 after): a slow or stalled client cannot hold a slot for longer."""
    api_key: str | None = field(default=None, repr=False)
    """Key every route but /health, the page and the API docs requires, as the header
    "Authorization: Bearer KEY" (401 otherwise). Unset: the environment variable
    BERTFORGE_API_KEY, which other users of the machine cannot read in the process list as
    they can an option."""
    allow_unauthenticated: bool = False
    """Listen on a --host other than loopback without --api_key, accepting that anyone who can
    reach the port may use the models."""
    ssl_certfile: str | None = None
    """PEM certificate (chain) to answer HTTPS with; needs --ssl_keyfile."""
    ssl_keyfile: str | None = None
    """PEM private key of --ssl_certfile."""
    shutdown_timeout: float = 30.0
    """Seconds SIGTERM waits for the requests in flight to be answered (new connections are
    refused at once); requests still running then are cut off."""
    log_format: LogFormat = "text"
    """Access log on stderr, one line per request (method, route, status, milliseconds,
    request id): text, or json (one object per line, for a log collector)."""
    access_log: bool = True
    """Write the access log (false: errors only)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise BertforgeError("give at least one --model DIR (or --model NAME=DIR)")
        names: set[str] = set()
        for spec in self.model:
            name, _ = parse_model_spec(spec)
            if name in names:
                raise BertforgeError(f"--model: the name {name!r} is given twice; use NAME=DIR")
            names.add(name)
        check_choice(self.precision, Precision, "--precision")
        check_at_least(
            self,
            lambda name: f"--{name}",
            port=1,
            max_batch_tokens=1,
            max_input_length=2,  # [CLS] and [SEP]
            max_client_batch_size=1,
            max_concurrent_requests=1,
            max_payload_bytes=1,
            max_top_k=1,
            max_attention_tokens=2,
            max_attribution_steps=1,
            num_threads=1,
            batch_wait_ms=0,
            workers=1,
        )
        if self.port > 65535:
            raise BertforgeError(f"--port {self.port} is not a TCP port (1..65535)")
        if not self.request_timeout > 0:
            raise BertforgeError("--request_timeout must be a positive number of seconds")
        if not self.shutdown_timeout >= 0:
            raise BertforgeError("--shutdown_timeout must be a number of seconds, 0 or more")
        check_choice(self.log_format, LogFormat, "--log_format")
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None
        if self.api_key is not None and not self.api_key.strip():
            raise BertforgeError(f"--api_key (or {API_KEY_ENV}) is empty; give a key or unset it")
        if self.api_key is None and not self.allow_unauthenticated and not is_loopback(self.host):
            raise BertforgeError(
                f"--host {self.host} answers other machines, and no key is set: set "
                f"{API_KEY_ENV}=KEY (or --api_key KEY) so clients must send 'Authorization: "
                "Bearer KEY', or pass --allow_unauthenticated to let anyone use the models"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise BertforgeError("TLS needs both --ssl_certfile and --ssl_keyfile")
        tls = (("--ssl_certfile", self.ssl_certfile), ("--ssl_keyfile", self.ssl_keyfile))
        for option, path in tls:
            if path is not None and not Path(path).is_file():
                raise BertforgeError(f"{option} {path}: no such file")

    @property
    def models(self) -> dict[str, str]:
        """Served name -> model directory, in the order given."""
        return {name: resolve_model(d) for name, d in map(parse_model_spec, self.model)}

    @property
    def scheme(self) -> str:
        return "http" if self.ssl_certfile is None else "https"

    def limits(self) -> dict[str, object]:
        """The limits and settings /info shows: never the key, nor where the TLS files are."""
        private = {"model", "api_key", "ssl_certfile", "ssl_keyfile"}
        shown = {k: v for k, v in asdict(self).items() if k not in private}
        return {**shown, "authenticated": self.api_key is not None, "tls": self.scheme == "https"}


API_KEY_ENV = "BERTFORGE_API_KEY"


def is_loopback(host: str) -> bool:
    """Whether ``host`` answers this machine only: a loopback address or ``localhost``."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def parse_model_spec(spec: str) -> tuple[str, str]:
    """``NAME=DIR`` -> (NAME, DIR); a bare ``DIR`` is named after its last folder."""
    name, sep, directory = spec.partition("=")
    if not sep:
        directory = spec
        name = directory.rstrip("/").rsplit("/", 1)[-1] or "model"
    if not name or not directory:
        raise BertforgeError(f"--model {spec!r}: write DIR or NAME=DIR")
    if not all(c.isalnum() or c in "-_." for c in name):
        raise BertforgeError(
            f"--model {spec!r}: the name {name!r} may hold letters, digits, '-', '_' and '.' only"
        )
    return name, directory


__all__ = ["API_KEY_ENV", "ServeConfig", "is_loopback", "parse_model_spec"]
