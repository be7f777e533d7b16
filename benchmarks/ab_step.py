"""Same-process A/B: this checkout's bertforge against the package at another git revision.

The package at ``--base`` is exported with ``git archive`` into a temporary directory under the
name ``bertforge_base`` (its imports rewritten), both models get the same weights and batch, and
their steps alternate (order swapped every repetition). Prints both medians and the median of the
per-repetition ratios, which is robust to the machine drifting during the run.

    python benchmarks/ab_step.py --base HEAD~1 --case pretrain --precision bf16 --reps 9
    python benchmarks/ab_step.py --base c260361 --case encode
    python benchmarks/ab_step.py --base HEAD~1 --case classify   # `classify`, 64 IMDB reviews
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import log, minilm_dir
from bench_infer import encode_fn, wikitext_windows
from bench_train import make_step, pretraining_batch

ROOT = Path(__file__).resolve().parents[1]


def export_base(revision: str, into: Path) -> str:
    """Write src/bertforge at ``revision`` to ``into/bertforge_base``; return the package name."""
    tar = subprocess.run(
        ["git", "archive", "--format=tar", revision, "src/bertforge"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    package = into / "bertforge_base"
    (into / "src" / "bertforge").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\bbertforge\.", "bertforge_base.", text)
        text = re.sub(r"\b(from|import) bertforge\b", r"\1 bertforge_base", text)
        path.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(into))
    return "bertforge_base"


def module(package: str, *names: str) -> Any:
    """``package.<name>`` for the first of ``names`` that exists (the layout before 62b6752 had
    flat modules: ``config``, ``model``, ``optim``)."""
    for name in names:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(f"none of {names} in {package}")


def pretrain_cases(packages: dict[str, str], size: str, precision: str) -> dict[str, Callable]:
    torch.manual_seed(0)
    batch = pretraining_batch(32, 128, 30522)
    cases, state = {}, None
    for side, name in packages.items():
        config = module(name, "modeling.config", "config").BertConfig.preset(size, vocab_size=30522)
        model = module(name, "modeling.model", "model").BertForPreTraining(config).train()
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        optimizer = module(name, "training.optim", "optim").build_optimizer(model, 1e-4)
        cases[side] = make_step(model, optimizer, batch, precision)
    return cases


def encode_cases(packages: dict[str, str]) -> dict[str, Callable]:
    ids = wikitext_windows()
    cases = {}
    for side, name in packages.items():
        model_cls = module(name, "modeling.model", "model").BertModel
        cases[side] = encode_fn(model_cls.from_pretrained(minilm_dir()).eval(), ids)
    return cases


def classify_cases(packages: dict[str, str]) -> dict[str, Callable]:
    """Each side's ``classify`` (batch 32, 256 tokens at most) of 64 real IMDB test reviews,
    all-MiniLM-L6-v2 with a fresh two-label head (the same head on both sides)."""
    from bench_onnx import MAX_LENGTH, imdb

    texts, _ = imdb("test", 64)
    cases, state = {}, None
    for side, name in packages.items():
        model_cls = module(name, "modeling.model", "model").BertForSequenceClassification
        torch.manual_seed(0)
        model = model_cls.from_pretrained(minilm_dir(), num_labels=2).eval()
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        tok = module(name, "tokenizer.wordpiece", "tokenizer").Tokenizer.from_file(minilm_dir())
        classify = module(name, "inference.predict", "predict").classify

        def run(model: Any = model, tok: Any = tok, classify: Any = classify) -> None:
            classify(model, tok, texts, batch_size=32, max_length=MAX_LENGTH, precision="fp32")

        cases[side] = run
    return cases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="git revision to compare against")
    p.add_argument("--case", choices=["pretrain", "encode", "classify"], default="pretrain")
    p.add_argument("--size", default="mini")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time, robust to other processes on a shared machine "
        "(use it with --threads 1: idle OpenMP threads spin and count as CPU time)",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"base": export_base(args.base, Path(tmp)), "this checkout": "bertforge"}
        if args.case == "pretrain":
            cases = pretrain_cases(packages, args.size, args.precision)
        elif args.case == "classify":
            cases = classify_cases(packages)
        else:
            cases = encode_cases(packages)
        names = list(cases)
        for name in names * 2:  # warm-up (and the first build of each side's C kernels)
            cases[name]()
        log(f"{args.case}: {names} x {args.reps}, alternating")
        times: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(args.reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                t0 = clock()
                cases[name]()
                times[name].append(clock() - t0)
    base, new = times["base"], times["this checkout"]
    what = f"{args.case} {args.size} {args.precision}" if args.case == "pretrain" else args.case
    what += f", {torch.get_num_threads()} threads, {args.clock} time"
    print(
        f"{what}: base {statistics.median(base) * 1e3:.1f} ms, "
        f"this checkout {statistics.median(new) * 1e3:.1f} ms, "
        f"speedup (median of per-repetition ratios) "
        f"{statistics.median(b / n for b, n in zip(base, new, strict=True)):.3f}x"
    )


if __name__ == "__main__":
    from _common import machine_markdown

    print(machine_markdown() + "\n")  # the CPU, its vector features, what `auto` picks
    main()
