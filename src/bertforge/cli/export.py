"""``bertforge export``: a trained model -> an ONNX model directory (``bertforge.inference.onnx``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from bertforge.cli.options import parse_config
from bertforge.inference.onnx import Quantization, export_onnx
from bertforge.modeling.checkpoint import resolve_model
from bertforge.training.config import check_at_least, check_choice

DESCRIPTION = (
    "Export a model for ONNX Runtime: model.onnx (dynamic batch and length axes) with its config "
    "and tokenizer beside it; run it with `bertforge classify|embed|tag|answer --backend onnx --model DIR2`."
)


@dataclass(kw_only=True)
class ExportConfig:
    """Options of ``bertforge export``."""

    model: str
    """Model directory (config.json, model.safetensors, tokenizer): a fine-tuned classifier
    exports its logits, a question-answering model its start_logits and end_logits, any other
    model its encoder's hidden states."""
    format: Literal["onnx"]
    """onnx (the only format so far)."""
    output: str
    """Directory to create: model.onnx, config.json, tokenizer files, finetune_config.json, and a
    sentence-transformers model's pooling declaration (modules.json, 1_Pooling/) for embed."""
    quantize: Quantization | None = None
    """int8: ONNX Runtime's dynamic quantization of the Linear layers' weights (default fp32)."""
    fuse: bool = False
    """Fuse attention, bias + GELU and residual + LayerNorm into ONNX Runtime's own operators (runs
    in ONNX Runtime only; measured no reliable speed-up on an AVX2 CPU); false keeps standard ONNX
    operators."""

    num_threads: int | None = None
    """CPU threads for the export and the quantization (default: torch's, one per core)."""

    def __post_init__(self) -> None:
        self.model = resolve_model(self.model)
        check_choice(self.format, Literal["onnx"], "--format")
        check_at_least(self, lambda name: f"--{name}", num_threads=1)
        if self.quantize is not None:
            check_choice(self.quantize, Quantization, "--quantize")


def main(argv: list[str]) -> int:
    """``bertforge export --model DIR --format onnx --output DIR2 [--quantize int8]``."""
    cfg = parse_config(ExportConfig, argv, prog="bertforge export", description=DESCRIPTION)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    summary = export_onnx(cfg.model, cfg.output, quantize=cfg.quantize, fuse=cfg.fuse)
    fused = ", ".join(f"{n} {kind}" for kind, n in summary["fused"].items())
    fused = f"fused {fused}" if fused else "standard ONNX operators"
    pooling = ", ".join(summary["pooling"])
    pooling = f"; pooling declaration for embed: {pooling}" if pooling else ""
    print(
        f"wrote {summary['output']} ({summary['quantize']}, {fused}, {summary['megabytes']} MB; "
        f"outputs: {', '.join(summary['outputs'])}{pooling})"
    )
    return 0
