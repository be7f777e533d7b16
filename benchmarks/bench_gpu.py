"""Pretraining speed on a GPU: bertforge vs transformers, tokens/s and MFU, and the CLI run.

For each case (BERT-base at sequence 128 and 512, BERT-large at 128) ours and transformers'
``BertForPreTraining`` get the same weights and the same full-length NSP batch (15% masked);
each step is bf16 autocast forward + backward, gradient clipping at 1.0 and fused AdamW, as
``bertforge pretrain`` and transformers' Trainer run it. The two alternate, which goes first
swapping every repetition. MFU is model FLOPs (``bench_train.train_flops``: the MLM decoder
counted at the masked tokens only) per second over the GPU's dense bf16 peak (:data:`PEAKS`,
by device name; pass ``--peak_tflops`` for a GPU not listed).

Then ``bertforge pretrain`` itself (packed 128-token sequences, MLM, the first case's batch) runs
for ``--cli_seconds`` as a user runs it (compiled on CUDA, its default) and its tokens/s
(results.json: tokens / elapsed; evaluation, saving and compiling left out) is compared with the
same step timed here (``BertForMaskedLM``, compiled alike): the share of the step speed the data
path and the loop keep. ``--dropout 0`` runs every model without dropout (both sides), as
bertforge's recipes and Cramming pretrain.

    python benchmarks/bench_gpu.py --json out.json --markdown out.md    # on a GPU: ~3 minutes
    python benchmarks/bench_gpu.py --smoke                              # tiny, on any device
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import get_args

import torch
from _common import ROOT, hf_adamw, hf_twin, log, markdown_table
from bench_train import pretraining_batch, train_flops

from bertforge.data.loader import masked_rows
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining
from bertforge.progress import read_metrics
from bertforge.training.config import CompileMode
from bertforge.training.optim import build_optimizer
from bertforge.training.profiling import SKIP_STEPS

PEAKS = {  # dense bf16 tensor-core TFLOP/s (no sparsity), from the vendors' data sheets
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,  # SXM (torch names it "NVIDIA H100 80GB HBM3")
    "H200": 989.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
}
"""Checked in order: the first name found in ``torch.cuda.get_device_name()`` wins."""


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (:data:`PEAKS`), or None when not listed."""
    for name, peak in PEAKS.items():
        if name in device_name:
            return peak
    return None


@dataclass
class Case:
    name: str
    preset: str
    batch: int
    seq: int


CASES = [
    Case("BERT-base, seq 128", "base", 256, 128),
    Case("BERT-base, seq 512", "base", 64, 512),
    Case("BERT-large, seq 128", "large", 128, 128),
]
SMOKE = Case("tiny (smoke), seq 32", "tiny", 8, 32)


@dataclass
class Row:
    case: str
    side: str
    batch: int
    seq: int
    tokens_per_s: float
    step_ms: float
    mfu: float | None
    steps: int
    extra: dict = field(default_factory=dict)


def config_of(case: Case, vocab: int, dropout: float | None = None) -> BertConfig:
    """The case's model; ``dropout`` (hidden and attention) instead of BERT's 0.1 when given."""
    cfg = BertConfig.preset(case.preset, vocab_size=vocab, max_position_embeddings=512)
    if dropout is not None:
        cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = dropout
    return cfg


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model, optimizer, batch, device, precision, mlm_only=False, ours=True):  # noqa: ANN001
    """One training step as the loops run it (forward, backward, clip 1.0, AdamW). Ours gets
    the masked positions found on the host, as ``bertforge pretrain`` hands them over."""
    inputs = {k: v.to(device) for k, v in batch.items()}
    if ours:
        inputs["masked_rows"] = masked_rows(batch["labels"]).to(device)
    if mlm_only:
        inputs.pop("next_sentence_label")
        inputs.pop("token_type_ids")
    inputs.pop("attention_mask")  # full-length sequences: no padding, as the loop passes them
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def compiles(args, case: Case) -> bool:  # noqa: ANN001
    """Whether ``--compile`` asks for this case (no numbers: every case)."""
    if args.compile is None:
        return False
    number = next(
        (i for i, c in enumerate(CASES) if (c.preset, c.seq) == (case.preset, case.seq)), -1
    )
    return not args.compile or str(number) in args.compile


def profile_step(label: str, step, device: torch.device, args) -> None:  # noqa: ANN001
    """The kernels of a few steps, by device time (the top 25), into the log and
    ``--profile_dir``: where a step's time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    log(f"  profile of 3 steps, {label}:\n{table}")
    if args.profile_dir:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() else "_" for c in label)[:80]
        (args.profile_dir / f"profile_{name}.txt").write_text(table + "\n")


def timed(step, device: torch.device, n: int) -> float:  # noqa: ANN001
    """Seconds for ``n`` steps, the device drained before and after."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return time.perf_counter() - t0


def bench_case(case, args, device, peak, with_reference=True, mlm_only=False, only=None):  # noqa: ANN001
    """Ours and (when ``with_reference``) transformers alternating on one case; their rows.
    ``only`` names the one side to time instead ("bertforge" or "bertforge (compiled)")."""
    torch.manual_seed(0)
    cfg = config_of(case, args.vocab, args.dropout)
    cls = BertForMaskedLM if mlm_only else BertForPreTraining
    ours = cls(cfg).to(device).train()
    optimizer = build_optimizer(ours, 1e-4)
    sides = {"bertforge": (ours, optimizer)}
    if with_reference and only is None:
        theirs = hf_twin(ours, cls.__name__).to(device).train()
        sides["transformers"] = (theirs, hf_adamw(theirs))
    if (compiles(args, case) and with_reference) or only == "bertforge (compiled)":
        sides["bertforge (compiled)"] = (torch.compile(ours, mode=args.compile_mode), optimizer)
    if only is not None:
        sides = {only: sides[only]}
    batch = pretraining_batch(case.batch, case.seq, cfg.vocab_size)
    n_masked = int((batch["labels"] != -100).sum())
    flops = train_flops(cfg, case.batch, case.seq, 0 if mlm_only else n_masked)
    if mlm_only:  # no pooler / NSP head; the decoder at the masked tokens
        H, V = cfg.hidden_size, cfg.vocab_size
        flops += 3.0 * n_masked * (2 * H * H + 2 * H * V)
    steps = {
        side: make_step(
            m, opt, batch, device, args.precision, mlm_only, ours=side != "transformers"
        )
        for side, (m, opt) in sides.items()
    }
    for side, step in steps.items():  # warm-up: allocator, cuBLAS and SDPA choices, compiling
        took = timed(step, device, args.warmup)
        if "compiled" in side:
            log(f"  {case.name} {side}: compiled in {took:.1f} s (warm-up, not timed)")
    seconds = {side: 0.0 for side in steps}
    peak_mem = {side: 0.0 for side in steps}
    order = list(steps)
    for rep in range(args.reps):
        for side in order if rep % 2 == 0 else order[::-1]:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            seconds[side] += timed(steps[side], device, args.steps)
            if device.type == "cuda":
                peak_mem[side] = max(
                    peak_mem[side], torch.cuda.max_memory_allocated(device) / 2**30
                )
    if args.profile and with_reference:
        for side in steps:
            profile_step(f"{case.name} {side}", steps[side], device, args)
    rows = []
    n = args.steps * args.reps
    for side, total in seconds.items():
        per_step = total / n
        rate = flops / per_step
        mfu = rate / (peak * 1e12) if peak else None
        tok = case.batch * case.seq / per_step
        extra = {"peak_gib": round(peak_mem[side], 2)} if device.type == "cuda" else {}
        rows.append(Row(case.name, side, case.batch, case.seq, tok, 1e3 * per_step, mfu, n, extra))
        log(
            f"  {case.name} {side}: {tok:,.0f} tok/s, {1e3 * per_step:.1f} ms/step"
            + (f", MFU {mfu:.1%}" if mfu else "")
            + (f", peak {peak_mem[side]:.1f} GiB" if device.type == "cuda" else "")
        )
    del sides, steps, ours
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


# ---- the CLI run ------------------------------------------------------------------------------
def synthetic_data(root: Path, vocab: int, seq: int, sequences: int) -> Path:
    """Prepared packed sequences of random words over a ``vocab``-sized WordPiece vocabulary
    (``[PAD] [UNK] [CLS] [SEP] [MASK] w5 w6 ...``): the CLI's data path at BERT's vocabulary
    size, without downloading a corpus."""
    from bertforge.data.shards import PrepareConfig, prepare

    words = [f"w{i}" for i in range(5, vocab)]
    vocab_file = root / "vocab.txt"
    vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    rng = random.Random(0)
    # each document fills whole sequences ([CLS] + seq - 2 words + [SEP], 4 to a document): no
    # padding, as the timed step has none (documents of seq * 4 words left a 10-token last
    # sequence each, 18% of the CLI's positions padding, and its tok/s counts real tokens)
    docs = [" ".join(rng.choices(words, k=(seq - 2) * 4)) for _ in range(max(20, sequences // 4))]
    text = root / "text.txt"
    text.write_text("\n\n".join(docs) + "\n")
    out = root / "data"
    prepare(
        PrepareConfig(
            [str(text)],
            str(vocab_file),
            str(out),
            max_seq_length=seq,
            mode="packed",
            validation_fraction=0.1,
            progress=False,
        )
    )
    return out


STEADY_AFTER = 20
"""The CLI's steady rate is taken from its first log line at or past this step: the first steps
carry one-time costs the step timed alone does not (after compiling: the device's libraries'
first calls, attention plans, the allocator's growth)."""


def steady_rate(records: list[dict], after: int) -> tuple[float, int] | None:
    """Tokens per second of a run's training between its first logged step at or past ``after``
    and its last (the ``tokens`` and ``elapsed`` totals of its metrics lines), and that first
    step; None without two such lines."""
    train = sorted((r for r in records if r.get("split") == "train"), key=lambda r: r["step"])
    start = next((r for r in train if r["step"] >= after), None)
    if start is None or train[-1]["step"] <= start["step"]:
        return None
    end = train[-1]
    seconds = end["elapsed"] - start["elapsed"]
    return ((end["tokens"] - start["tokens"]) / seconds if seconds > 0 else 0.0), start["step"]


def cli_run(case: Case, args, device: torch.device, root: Path, compiled: bool = False) -> dict:  # noqa: ANN001
    """``bertforge pretrain`` on :func:`synthetic_data` for ``args.cli_seconds``: its tokens/s
    (``compiled``: ``--train.compile true``, compile seconds left out of its time; else
    ``false``)."""
    data = synthetic_data(root, args.vocab, case.seq, max(4 * case.batch, 64))
    layers, hidden = {"tiny": (2, 128), "base": (12, 768), "large": (24, 1024)}[case.preset]
    argv = [
        sys.executable, "-m", "bertforge.cli", "pretrain",
        "--data", str(data), "--output", str(root / "run"),
        "--model.preset", case.preset,
        "--model.max_position_embeddings", "512",
        "--train.objective", "mlm",
        "--train.batch_size", str(case.batch),
        "--train.device", str(device), "--train.precision", args.precision,
        "--train.max_time", f"{args.cli_seconds}s",
        "--train.eval_examples", str(case.batch), "--train.eval_every", "0",
        "--train.save_every", "0", "--train.log_every", "10", "--train.progress", "false",
    ]  # fmt: skip
    if args.cli_steps:
        argv += ["--train.max_steps", str(args.cli_steps)]
    argv += ["--train.compile", "true" if compiled else "false"]
    if compiled and args.compile_mode != "default":
        argv += ["--train.compile_mode", args.compile_mode]
    if args.cli_profile:  # the loop's own profile: where the CLI's time beside the step goes
        argv += ["--train.profile", str(args.cli_profile)]
    if args.dropout is not None:
        argv += ["--train.dropout", str(args.dropout)]
    if device.type == "cpu":  # the smoke run: one thread, as this process
        argv += ["--train.num_threads", str(torch.get_num_threads())]
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    started = time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=args.cli_seconds + 240
    )
    if done.returncode != 0:
        raise RuntimeError(f"bertforge pretrain failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads((root / "run" / "results.json").read_text())
    out = {
        "tokens_per_s": result["tokens"] / max(result["elapsed"], 1e-9),
        "steps": result["step"],
        "elapsed": result["elapsed"],
        "wall": time.perf_counter() - started,
        "layers": layers,
        "hidden": hidden,
    }
    steady = steady_rate(read_metrics(root / "run"), STEADY_AFTER)
    if steady is not None:
        out["steady_tokens_per_s"], out["steady_from_step"] = steady
    profiled = root / "run" / "profile.txt"
    if args.cli_profile and profiled.exists():
        text = profiled.read_text()
        out["profile"] = text.split("\n\n", 1)[0].splitlines()  # the summary above the table
        log("  " + "\n  ".join(out["profile"]))
        if args.profile_dir:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            name = "compiled" if compiled else "eager"
            (args.profile_dir / f"profile_cli_{name}.txt").write_text(text)
    return out


# ---- the report -------------------------------------------------------------------------------
def gib(row: Row | None) -> str:
    """A row's peak GPU memory (``torch.cuda.max_memory_allocated``), or "-"."""
    return f"{row.extra['peak_gib']:.1f}" if row is not None and "peak_gib" in row.extra else "-"


def report(
    rows: list[Row],
    clis: list[dict],
    device_name: str,
    peak: float | None,
    compile_mode: str = "default",
) -> str:
    if peak:
        head = f"GPU: {device_name}; MFU against {peak:g} TFLOP/s dense bf16"
    elif device_name.startswith("CPU"):
        head = f"{device_name}: no GPU, no MFU (a smoke run checks the script, not a speed)"
    else:
        head = f"GPU: {device_name}: its peak is UNKNOWN (not in PEAKS): no MFU; pass --peak_tflops"
    if compile_mode != "default":
        head += f"; compiled with torch.compile mode {compile_mode}"
    lines = [head, ""]
    by_case: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault(r.case, {})[r.side] = r
    table = []
    for case, sides in by_case.items():
        ours, theirs = sides.get("bertforge"), sides.get("transformers")
        if ours is None or ours.extra.get("role") == "cli":
            continue
        table.append(
            [
                case,
                str(ours.batch),
                f"{ours.tokens_per_s:,.0f}",
                f"{theirs.tokens_per_s:,.0f}" if theirs else "-",
                f"{ours.tokens_per_s / theirs.tokens_per_s:.2f}x" if theirs else "-",
                f"{ours.mfu:.1%}" if ours.mfu is not None else "-",
                f"{theirs.mfu:.1%}" if theirs and theirs.mfu is not None else "-",
                gib(ours),
                gib(theirs),
            ]
        )
    header = [
        "case",
        "batch",
        "ours tok/s",
        "transformers tok/s",
        "ours / theirs",
        "ours MFU",
        "theirs MFU",
        "ours peak GiB",
        "theirs peak GiB",
    ]
    compiled = {
        c: s["bertforge (compiled)"] for c, s in by_case.items() if "bertforge (compiled)" in s
    }
    if compiled:
        header.append("ours compiled tok/s (MFU)")
        for row in table:
            c = compiled.get(row[0])
            mfu = f" ({c.mfu:.1%})" if c is not None and c.mfu is not None else ""
            row.append(f"{c.tokens_per_s:,.0f}{mfu}" if c is not None else "-")
    lines.append(markdown_table(header, table))
    if clis:
        header = [
            "CLI run (`bertforge pretrain`, MLM)",
            "tok/s",
            "its step timed alone",
            "CLI / step",
            f"steady tok/s (from step {STEADY_AFTER})",
            "steady / step",
        ]
        table = []
        for cli in clis:
            step, steady = cli["step_tokens_per_s"], cli.get("steady_tokens_per_s")
            table.append(
                [
                    cli["case"],
                    f"{cli['tokens_per_s']:,.0f}",
                    f"{step:,.0f}",
                    f"{cli['tokens_per_s'] / step:.0%}",
                    "-" if steady is None else f"{steady:,.0f}",
                    "-" if steady is None else f"{steady / step:.0%}",
                ]
            )
        lines += ["", markdown_table(header, table)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny model, 2 timed steps: checks the script on any device",
    )
    parser.add_argument("--device", default="auto", help="auto (cuda, else cpu), cuda, cpu")
    parser.add_argument(
        "--precision",
        default=None,
        choices=["bf16", "fp32"],
        help="default: bf16 on CUDA, fp32 elsewhere",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps per repetition (default 20; smoke 2)"
    )
    parser.add_argument(
        "--reps", type=int, default=2, help="repetitions, alternating ours and transformers"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default 3; smoke 1)"
    )
    parser.add_argument(
        "--vocab", type=int, default=None, help="vocabulary size (default 30522; smoke 2000)"
    )
    parser.add_argument(
        "--cases",
        nargs="*",
        default=None,
        help="case numbers (0: base-128, 1: base-512, 2: large-128)",
    )
    parser.add_argument(
        "--peak_tflops", type=float, default=None, help="dense bf16 peak of an unlisted GPU"
    )
    parser.add_argument(
        "--cli_seconds",
        type=float,
        default=None,
        help="length of the CLI run (default 40; smoke 3)",
    )
    parser.add_argument(
        "--cli_steps", type=int, default=None, help="stop the CLI run after N steps"
    )
    parser.add_argument(
        "--compile",
        nargs="*",
        default=None,
        help="also time ours through torch.compile, for these case numbers (none named: all)",
    )
    parser.add_argument(
        "--compile_mode",
        default="default",
        choices=get_args(CompileMode),
        help="torch.compile's mode for ours compiled and the compiled CLI run "
        "(--train.compile_mode)",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="batch size for every case (default: the case's)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print each side's top kernels over 3 steps"
    )
    parser.add_argument("--profile_dir", type=Path, default=None, help="also write them here")
    parser.add_argument(
        "--cli_profile",
        type=int,
        default=0,
        help="trace N steps of the CLI run (--train.profile N): its loop's phases, the GPU's "
        "busy share; the traced steps are slower, so its tok/s is a little low",
    )
    parser.add_argument("--no-reference", dest="reference", action="store_false", help="ours only")
    parser.add_argument("--no-cli", dest="cli", action="store_false", help="skip the CLI run")
    parser.add_argument(
        "--cli_also_eager",
        action="store_true",
        help="on CUDA, also run the CLI with --train.compile false, against the eager step",
    )
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="hidden and attention dropout of every model, both sides (default BERT's 0.1)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    args = parser.parse_args(argv)

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else args.device
        if args.device != "auto"
        else "cpu"
    )
    args.precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    args.steps = args.steps or (2 if args.smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    args.vocab = args.vocab or (2000 if args.smoke else 30522)
    args.cli_seconds = args.cli_seconds or (3.0 if args.smoke else 40.0)
    if args.smoke:
        traced = SKIP_STEPS + 1 + args.cli_profile if args.cli_profile else 0
        args.reps, args.cli_steps = 1, args.cli_steps or 2 + traced
        if device.type == "cpu":
            torch.set_num_threads(1)
    cases = [SMOKE] if args.smoke else [CASES[int(i)] for i in (args.cases or range(len(CASES)))]
    if args.batch:
        for i, case in enumerate(CASES):
            CASES[i] = Case(case.name, case.preset, args.batch, case.seq)
        cases = (
            [SMOKE] if args.smoke else [CASES[int(i)] for i in (args.cases or range(len(CASES)))]
        )
    if args.dropout is not None:  # said in every row
        cases = [
            Case(f"{c.name}, dropout {args.dropout:g}", c.preset, c.batch, c.seq) for c in cases
        ]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({device})"
    peak = args.peak_tflops or (peak_tflops(device_name) if device.type == "cuda" else None)
    if device.type == "cuda" and peak is None:
        log(
            f"!! {device_name}: peak not in the table (PEAKS); MFU is left out. Pass --peak_tflops."
        )
    log(f"bench_gpu on {device_name}, {args.precision}, {args.steps} x {args.reps} timed steps")

    rows: list[Row] = []
    clis: list[dict] = []
    payload: dict = {"device": device_name, "peak_tflops": peak, "precision": args.precision}
    payload["compile_mode"] = args.compile_mode

    def save() -> None:  # after every case: a run cut short keeps what it measured
        payload["rows"] = [asdict(r) for r in rows]
        payload["cli"] = clis
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(payload, indent=2) + "\n")

    for case in cases:
        rows += bench_case(case, args, device, peak, args.reference)
        save()
    # the CLI as a user runs it (compiled on CUDA, its default; eager elsewhere), against the
    # same step timed here; --cli_also_eager adds the eager CLI on CUDA
    modes = [device.type == "cuda"] if args.cli else []
    if args.cli and args.cli_also_eager and device.type == "cuda":
        modes.append(False)
    for compiled in modes:
        case = cases[0]
        side = "bertforge (compiled)" if compiled else "bertforge"
        step = bench_case(case, args, device, peak, mlm_only=True, only=side)[0]
        step.extra["role"] = "cli"
        what = "compiled MLM step" if compiled else "MLM step"
        step.case = f"{case.name} ({what} for the CLI)"
        rows.append(step)
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
            cli = cli_run(case, args, device, Path(tmp), compiled=compiled)
        flag = "true" if compiled else "false"
        cli |= {
            "case": f"{case.name}, --train.compile {flag}",
            "step_tokens_per_s": step.tokens_per_s,
        }
        steady = cli.get("steady_tokens_per_s")
        log(
            f"  CLI (--train.compile {flag}): {cli['tokens_per_s']:,.0f} tok/s over "
            f"{cli['steps']} steps"
            + ("" if steady is None else f", {steady:,.0f} from step {cli['steady_from_step']}")
            + f"; its step alone {step.tokens_per_s:,.0f}"
        )
        clis.append(cli)
        save()
    text = report(rows, clis, device_name, peak, args.compile_mode)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
