"""The settings of ``bertforge serve``: which models, where to listen, and the limits that keep
one client from starving the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertforge.errors import BertforgeError


@dataclass
class ServeConfig:
    """Everything ``bertforge serve`` needs besides the models themselves."""

    models: dict[str, str] = field(default_factory=dict)
    """Served model name -> model directory (``--model NAME=DIR``; a bare DIR is named after
    its folder)."""
    host: str = "127.0.0.1"
    """Address to listen on; the default answers this machine only."""
    port: int = 8000
    """TCP port."""
    device: str = "auto"
    """auto, cpu, cuda or mps."""
    precision: str = "auto"
    """auto, bf16 or fp32: bf16 autocast only where the hardware runs it fast."""
    max_batch_tokens: int = 16384
    """Token budget of one forward pass: requests waiting for the same model and route are
    merged into one batch while their tokens add up to at most this."""
    max_input_length: int = 512
    """Longest text in tokens (with [CLS]/[SEP]); longer ones are refused with 413, or cut when
    the request says ``truncate: true``. Never more than a model's positions."""
    max_client_batch_size: int = 64
    """Most texts in one request (413 above it)."""
    max_concurrent_requests: int = 128
    """Most inference requests in flight at once; the next one gets 429 at once instead of
    queueing without bound."""
    max_payload_bytes: int = 1_000_000
    """Largest request body (413 above it)."""
    max_top_k: int = 100
    """Largest ``top_k`` of /fill-mask."""
    max_attention_tokens: int = 128
    """Longest text /attention and /attribute take: their answers grow with the square of it."""
    max_attribution_steps: int = 256
    """Largest ``steps`` of /attribute (each step is one forward and backward pass)."""
    request_timeout: float = 60.0
    """Seconds a request may take from its first byte to its answer, reading its body included
    (408 while reading, 503 after): a slow or stalled client cannot hold a slot for longer."""

    def __post_init__(self) -> None:
        for name in (
            "max_batch_tokens",
            "max_input_length",
            "max_client_batch_size",
            "max_concurrent_requests",
            "max_payload_bytes",
            "max_top_k",
            "max_attention_tokens",
            "max_attribution_steps",
        ):
            if getattr(self, name) < 1:
                raise BertforgeError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_input_length < 2:
            raise BertforgeError("--max-input-length must hold [CLS] and [SEP]: at least 2")
        if not self.request_timeout > 0:
            raise BertforgeError("--request-timeout must be a positive number of seconds")
        if not 0 < self.port < 65536:
            raise BertforgeError(f"--port {self.port} is not a TCP port (1..65535)")


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
