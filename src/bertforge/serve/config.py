"""The settings of ``bertforge serve``: which models, where to listen, and the limits that keep
one client from starving the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertforge.errors import BertforgeError
from bertforge.runtime import Precision
from bertforge.training.config import check_at_least, check_choice


@dataclass(kw_only=True)
class ServeConfig:
    """Options of ``bertforge serve``: which models, where to listen, and the limits."""

    model: list[str] = field(default_factory=list)
    """Model directory to serve, as DIR (named after its folder) or NAME=DIR; repeat the option
    for several models (the first one answers requests that name none)."""
    host: str = "127.0.0.1"
    """Address to listen on; the default answers this machine only."""
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
    """Largest top_k of /fill-mask."""
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

    @property
    def models(self) -> dict[str, str]:
        """Served name -> model directory, in the order given."""
        return dict(parse_model_spec(spec) for spec in self.model)


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


__all__ = ["ServeConfig", "parse_model_spec"]
