"""Which options of ONNX Runtime's dynamic int8 quantization keep an IMDB classifier's accuracy.

Quantizes one fp32 export (``bertforge export --format onnx``, standard operators) four ways: one
scale per weight matrix (ONNX Runtime's default), a scale per output column (``per_channel``),
7-bit weights (``reduce_range``, against the saturation of AVX2's 8-bit multiply-add without
VNNI) and both; scores each and the fp32 export on the same IMDB test reviews, with texts/s at
batch 32 (the accuracy pass itself, 256 tokens at most). ``bertforge export --quantize int8``
uses the winner.

Two more rows try ONNX Runtime's transformer fusion (``bertforge.inference.onnx.fuse_graph``,
``bertforge export --fuse true``): the graph rewritten into its ``Attention``, ``BiasGelu``
and ``SkipLayerNormalization`` operators, run in fp32 and quantized as ``--quantize int8`` does.

    # the fp32 export that bench_onnx.py writes:
    python benchmarks/quantize_options.py --export /tmp/bertforge-bench-onnx/imdb-onnx-fp32-standard
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

from bertforge.inference.onnx import ONNX_FILE, fuse_graph, load_onnx, quantize_int8
from bertforge.modeling.config import BertConfig
from bertforge.tokenizer.wordpiece import Tokenizer

OPTIONS = {
    "one scale per matrix (default)": {},
    "per_channel": {"per_channel": True},
    "reduce_range": {"reduce_range": True},
    "per_channel + reduce_range": {"per_channel": True, "reduce_range": True},
}


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
        log(f"fused: {fuse_graph(fused / ONNX_FILE, BertConfig.load(fused / 'config.json'))}")
        accuracy = score("fp32, fused (onnxruntime.transformers)", fused)
        rows[-1].append(f"{100 * (fp32 - accuracy):+.1f}")
        fused_int8 = Path(tmp) / "fused_int8"
        shutil.copytree(args.export, fused_int8)
        quantize_int8(fused / ONNX_FILE, fused_int8 / ONNX_FILE)  # what the export does
        accuracy = score("int8, per_channel, fused", fused_int8)
        rows[-1].append(f"{100 * (fp32 - accuracy):+.1f}")
    rows[0].append("-")
    print(f"{cpu_kind()}; {args.test:,} IMDB test reviews (seed 0), ONNX Runtime, batch 32\n")
    print(markdown_table(["model", "accuracy", "texts/s", "points lost vs fp32"], rows))


if __name__ == "__main__":
    main()
