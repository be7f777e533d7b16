"""Which options of ONNX Runtime's dynamic int8 quantization keep an IMDB classifier's accuracy.

Quantizes one fp32 export (``bertforge export --format onnx``) four ways: one scale per weight
matrix (ONNX Runtime's default), a scale per output column (``per_channel``), 7-bit weights
(``reduce_range``, against the saturation of AVX2's 8-bit multiply-add without VNNI) and both;
scores each and the fp32 export on the same IMDB test reviews, with texts/s at batch 32 (the
accuracy pass itself, 256 tokens at most). ``bertforge export --quantize int8`` uses the winner.

Two more rows try ONNX Runtime's transformer fusion (``onnxruntime.transformers.optimizer``,
``model_type="bert"``): the graph rewritten into its ``Attention``, ``BiasGelu`` and
``SkipLayerNormalization`` contrib operators, run in fp32 and quantized per channel.

    python benchmarks/quantize_options.py --export /tmp/bertforge-bench-onnx/imdb-onnx-fp32
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from _common import cpu_kind, log, markdown_table
from bench_onnx import classifier_accuracy, imdb
from onnxruntime.quantization import QuantType, quantize_dynamic

from bertforge.inference.onnx import ONNX_FILE, load_onnx
from bertforge.modeling.config import BertConfig
from bertforge.tokenizer.wordpiece import Tokenizer

OPTIONS = {
    "one scale per matrix (default)": {},
    "per_channel": {"per_channel": True},
    "reduce_range": {"reduce_range": True},
    "per_channel + reduce_range": {"per_channel": True, "reduce_range": True},
}


def fuse(source: Path, target: Path) -> None:
    """ONNX Runtime's BERT fusion of ``source`` (its config.json beside it) into ``target``."""
    from onnxruntime.transformers.optimizer import optimize_model

    config = BertConfig.load(source.parent / "config.json")
    model = optimize_model(
        str(source),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        opt_level=0,  # the fusions only; the session applies its own optimizations on loading
    )
    log(f"fused: {model.get_fused_operator_statistics()}")
    model.save_model_to_file(str(target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--export", type=Path, required=True, help="an fp32 ONNX export (classifier)"
    )
    parser.add_argument("--test", type=int, default=1000, help="IMDB test reviews (seed 0)")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(args.export)
    texts, labels = imdb("test", args.test, seed=0)
    rows = []

    def score(name: str, directory: Path) -> float:
        model = load_onnx(directory)
        start = time.perf_counter()
        accuracy = classifier_accuracy(model, "fp32", tokenizer, texts, labels)
        rate = len(texts) / (time.perf_counter() - start)
        rows.append([name, f"{accuracy:.2%}", f"{rate:.1f}"])
        log(f"{name}: accuracy {accuracy:.2%}, {rate:.1f} texts/s")
        return accuracy

    fp32 = score("fp32 export", args.export)
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in OPTIONS.items():
            out = Path(tmp) / name.replace(" ", "_")
            shutil.copytree(args.export, out)
            quantize_dynamic(
                str(args.export / ONNX_FILE),
                str(out / ONNX_FILE),
                op_types_to_quantize=["MatMul"],
                weight_type=QuantType.QInt8,
                **options,
            )
            accuracy = score(f"int8, {name}", out)
            rows[-1].append(f"{100 * (fp32 - accuracy):+.1f}")
        fused = Path(tmp) / "fused"
        shutil.copytree(args.export, fused)
        fuse(args.export / ONNX_FILE, fused / ONNX_FILE)
        accuracy = score("fp32, fused (onnxruntime.transformers)", fused)
        rows[-1].append(f"{100 * (fp32 - accuracy):+.1f}")
        fused_int8 = Path(tmp) / "fused_int8"
        shutil.copytree(args.export, fused_int8)
        quantize_dynamic(
            str(fused / ONNX_FILE),
            str(fused_int8 / ONNX_FILE),
            weight_type=QuantType.QInt8,
            per_channel=True,
            # the fused graph's contrib operators carry no type information for the quantizer
            extra_options={"DefaultTensorType": 1},  # float
        )
        accuracy = score("int8, per_channel, fused", fused_int8)
        rows[-1].append(f"{100 * (fp32 - accuracy):+.1f}")
    rows[0].append("-")
    print(f"{cpu_kind()}; {args.test:,} IMDB test reviews (seed 0), ONNX Runtime, batch 32\n")
    print(markdown_table(["model", "accuracy", "texts/s", "points lost vs fp32"], rows))


if __name__ == "__main__":
    main()
