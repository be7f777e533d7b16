"""Same-process A/B: this checkout's bertforge against the package at another git revision.

The package at ``--base`` is exported with ``git archive`` into a temporary directory under the
name ``bertforge_base`` (its imports rewritten), both models get the same weights and batch, and
their steps alternate (order swapped every repetition). Prints both medians and the median of the
per-repetition ratios, which is robust to the machine drifting during the run.

    python benchmarks/ab_step.py --base HEAD~1 --case pretrain --precision bf16 --reps 9
    python benchmarks/ab_step.py --base c260361 --case encode
    python benchmarks/ab_step.py --base HEAD~1 --case classify   # `classify`, 64 IMDB reviews
    python benchmarks/ab_step.py --base HEAD --size minilm --precision bf16 --varied --reps 9
    python benchmarks/ab_step.py --base HEAD --case finetune --size minilm --precision bf16
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
from bench_train import FIRST_WORD, make_step, pretraining_batch

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


def varied_batch(seed: int) -> dict[str, torch.Tensor]:
    """A 32 x 128 pretraining batch as packed data gives them: ~30% of the sequences end early
    (a document's last piece: padding after it), 15% of the real tokens masked; the masked and
    real counts change from batch to batch."""
    batch = pretraining_batch(32, 128, 30522, seed=seed)
    g = torch.Generator().manual_seed(seed)
    short = torch.rand(32, generator=g) < 0.3
    lengths = torch.where(short, torch.randint(16, 128, (32,), generator=g), 128)
    mask = (torch.arange(128)[None, :] < lengths[:, None]).long()  # (B, T)
    batch["attention_mask"] = mask
    batch["input_ids"] = batch["input_ids"] * mask
    batch["labels"] = batch["labels"].masked_fill(mask == 0, -100)
    return batch


def finetune_batch(seed: int) -> dict[str, torch.Tensor]:
    """A fine-tuning batch as bucketed batches of reviews come: 32 texts of similar length
    (within 20% of a length drawn from 48-128 tokens), padded to the longest, a label each."""
    g = torch.Generator().manual_seed(seed)
    top = int(torch.randint(48, 129, (1,), generator=g))
    lengths = torch.randint(int(top * 0.8), top + 1, (32,), generator=g)
    lengths[0] = top
    mask = (torch.arange(top)[None, :] < lengths[:, None]).long()  # (B, T)
    ids = torch.randint(FIRST_WORD, 30522, (32, top), generator=g) * mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "labels": torch.randint(0, 2, (32,), generator=g),
    }


def finetune_cases(packages: dict[str, str], size: str, precision: str, n: int) -> dict:
    """Each side's fine-tuning step (sequence classification, 2 labels) on a new
    :func:`finetune_batch` each call, the same ``n`` batches on both sides."""
    batches = [finetune_batch(seed) for seed in range(n)]
    cases, state = {}, None
    for side, name in packages.items():
        config = sized_config(name, size)
        config.num_labels = 2
        torch.manual_seed(0)
        model_cls = module(name, "modeling.model", "model").BertForSequenceClassification
        model = model_cls(config).train()
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        optimizer = module(name, "training.optim", "optim").build_optimizer(model, 1e-4)
        steps = [make_step(model, optimizer, b, precision) for b in batches]
        calls = iter(range(10**9))
        cases[side] = lambda steps=steps, calls=calls: steps[next(calls) % len(steps)]()
    return cases


def sized_config(name: str, size: str) -> Any:
    """The preset ``size``, or ``minilm``: all-MiniLM-L6-v2's shape (6 x 384, 12 heads)."""
    config_cls = module(name, "modeling.config", "config").BertConfig
    if size == "minilm":
        return config_cls(
            vocab_size=30522,
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=1536,
        )
    return config_cls.preset(size, vocab_size=30522)


def pretrain_cases(
    packages: dict[str, str], size: str, precision: str, varied: int = 0
) -> dict[str, Callable]:
    """Each side's training step; ``varied`` > 0: a new batch each call (:func:`varied_batch`,
    the same sequence of ``varied`` batches on both sides), else one full batch repeated."""
    torch.manual_seed(0)
    batch = pretraining_batch(32, 128, 30522)
    batches = [varied_batch(seed) for seed in range(varied)]
    cases, state = {}, None
    for side, name in packages.items():
        config = sized_config(name, size)
        model = module(name, "modeling.model", "model").BertForPreTraining(config).train()
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        optimizer = module(name, "training.optim", "optim").build_optimizer(model, 1e-4)
        if not batches:
            cases[side] = make_step(model, optimizer, batch, precision)
            continue
        steps = [make_step(model, optimizer, b, precision) for b in batches]
        calls = iter(range(10**9))
        cases[side] = lambda steps=steps, calls=calls: steps[next(calls) % len(steps)]()
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
    p.add_argument(
        "--case", choices=["pretrain", "finetune", "encode", "classify"], default="pretrain"
    )
    p.add_argument("--size", default="mini", help="a preset, or minilm (6 x 384)")
    p.add_argument(
        "--varied",
        action="store_true",
        help="pretrain: a new padded batch each step (as training sees them), not one repeated",
    )
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
            varied = 2 * args.reps + 4 if args.varied else 0  # never a batch seen before
            cases = pretrain_cases(packages, args.size, args.precision, varied)
        elif args.case == "finetune":
            cases = finetune_cases(packages, args.size, args.precision, 2 * args.reps + 4)
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
    trains = args.case in ("pretrain", "finetune")
    what = f"{args.case} {args.size} {args.precision}" if trains else args.case
    what += ", a new padded batch each step" if args.varied and args.case == "pretrain" else ""
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
