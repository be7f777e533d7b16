"""Time to quality: bertforge's pretraining recipe against transformers.Trainer, same budget.

Both sides train the same BERT config on the same prepared (packed) data, MLM only
(``DataCollatorForLanguageModeling`` has no NSP), with the same settings: masking rate, batch
size, peak learning rate, warmup share and linear decay to zero over the steps the budget allows,
AdamW (weight decay 0.01 off biases and LayerNorm, eps 1e-6), clipping at 1.0, the recipe's
dropout. transformers gets its fastest CPU setup: SDPA attention, bf16 autocast where the CPU has
AVX512-BF16/AMX, its ``DataCollatorForLanguageModeling``. Its step count is fixed from a timed
calibration so that its LR schedule ends with the budget, as bertforge's time-tied schedule does.
transformers starts from BERT's random initialisation; bertforge from the recipe's start: since
2026-11-24 ``configs/imdb-20m.yaml`` starts the word embeddings from co-occurrence vectors of the
same training data (``--train.word_init cooccurrence``, seconds charged to bertforge's clock);
``--word_init normal`` gives both sides the random start (the measurements before that date).

Both are scored on the SAME validation sequences with the SAME masks: the bertforge run's own
validation batches, rebuilt here (and checked against the loss the run logged), each
transformers checkpoint loaded into bertforge's model (the module names are Hugging Face's).
The clocks count training only (data loading, forward, backward, optimizer), not evaluation.

Reports each side's validation MLM loss at the end of the budget and the training time
bertforge needs to reach transformers' final loss (interpolated between its evaluations).

    python benchmarks/time_to_quality.py --data runs/imdb/data-8192-128 --budget 20m \\
        --output runs/time-to-quality
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import ROOT, cpu_kind, fmt, log, machine_markdown, markdown_table

from bertforge.cli.options import parse_config
from bertforge.data.loader import validation_batches
from bertforge.evaluation.mlm import evaluate_mlm
from bertforge.modeling.model import BertForMaskedLM
from bertforge.progress import parse_duration
from bertforge.runtime import pick_precision
from bertforge.training.config import PretrainConfig
from bertforge.training.setup import open_data

RUN_CONFIG = "pretrain_config.yaml"  # what `bertforge pretrain` writes into its output directory


# ---- bertforge --------------------------------------------------------------------------------
def run_bertforge(args: argparse.Namespace, out: Path) -> list[dict[str, float]]:
    """``bertforge pretrain`` with the recipe for the budget; its validation curve as
    ``[{"seconds", "step", "loss"}]`` (seconds of training, evaluation excluded)."""
    cmd = [
        sys.executable, "-m", "bertforge", "pretrain", "--config", str(args.config),
        "--data", str(args.data), "--output", str(out),
        "--train.max_time", args.budget, "--train.eval_every", str(args.eval_every),
        "--train.precision", args.precision, "--train.num_threads", str(args.threads),
        "--train.progress", "false",
        # transformers' DataCollatorForLanguageModeling trains MLM only, so both sides do (the
        # 20-minute recipe's NSP would need sentence-pair data and cost steps transformers skips;
        # its bag-of-words loss trains the pooler through those pairs, so it goes too)
        "--train.objective", "mlm", "--train.bow_weight", "0",
    ]  # fmt: skip
    if args.word_init != "recipe":
        cmd += ["--train.word_init", args.word_init]
    log("bertforge: " + " ".join(cmd[1:]))
    subprocess.run(cmd, check=True, cwd=ROOT)
    return logged_curve(out)


def logged_curve(out: Path) -> list[dict[str, float]]:
    """A finished ``bertforge pretrain`` run's validation curve from its metrics.jsonl, with the
    training seconds (evaluation excluded) at each evaluated step."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = {r["step"]: r["elapsed"] for r in records if r.get("split") == "train"}
    seconds[0] = 0.0  # (a co-occurrence start's seconds are charged to the first steps' clock)
    return [
        {"seconds": seconds[r["step"]], "step": r["step"], "loss": r["loss"]}
        for r in records
        if r.get("split") == "val" and r["step"] in seconds
    ]


# ---- the shared evaluation -------------------------------------------------------------------
class Evaluation:
    """The bertforge run's validation batches (same sequences, same masks) and its scorer."""

    def __init__(self, run_dir: Path) -> None:
        self.cfg = parse_config(
            PretrainConfig, ["--config", str(run_dir / RUN_CONFIG)], prog="time_to_quality",
            description="",
        )  # fmt: skip
        self.data = open_data(self.cfg)
        tc = self.cfg.train
        self.batches = list(
            validation_batches(
                self.data.val, self.data.collator, tc.eval_batch_size or self.data.micro,
                max_examples=tc.eval_examples,
            )
        )  # fmt: skip
        self.precision = pick_precision(tc.precision, torch.device("cpu"))

    def loss_of_directory(self, model_dir: Path) -> float:
        model = BertForMaskedLM.from_pretrained(model_dir)
        return float(evaluate_mlm(model, self.batches, torch.device("cpu"), self.precision)["loss"])

    def loss_of_hf(self, hf_model: Any) -> float:
        """Load a transformers model's weights into bertforge's model and score it."""
        with tempfile.TemporaryDirectory() as tmp:
            hf_model.save_pretrained(tmp)
            return self.loss_of_directory(Path(tmp))


# ---- transformers ---------------------------------------------------------------------------
class _Sequences(torch.utils.data.Dataset):
    """The prepared training sequences as the token-id lists ``DataCollatorForLanguageModeling``
    pads and masks."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.dataset[i]["input_ids"].tolist()}


def hf_trainer(
    ev: Evaluation, run_dir: Path, out: Path, max_steps: int, callbacks: list, bf16: bool
) -> Any:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bar per score
    tc, masking = ev.cfg.train, ev.cfg.masking
    config = transformers.BertConfig.from_pretrained(run_dir / "model", attn_implementation="sdpa")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = tc.dropout
    torch.manual_seed(tc.seed)
    model = transformers.BertForMaskedLM(config)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(Path(ev.cfg.data) / "tokenizer")
    if tokenizer.mask_token_id != ev.data.tokenizer.mask_id:
        raise SystemExit("the transformers tokenizer disagrees with bertforge's on [MASK]")
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=tc.batch_size,
        learning_rate=tc.lr,
        weight_decay=tc.weight_decay,
        adam_epsilon=1e-6,
        max_grad_norm=tc.max_grad_norm,
        lr_scheduler_type="linear",
        warmup_steps=round(tc.warmup_ratio * max_steps),
        max_steps=max_steps,
        bf16=bf16,
        use_cpu=True,
        seed=tc.seed,
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    collator = transformers.DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=masking.mlm_probability
    )
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=_Sequences(ev.data.train),
        data_collator=collator,
        callbacks=callbacks,
    )


def make_clock_callback(
    ev: Evaluation | None, budget: float, every: float, curve: list[dict[str, float]]
) -> Any:
    """A TrainerCallback that keeps a training-only clock, scores the model every ``every``
    seconds of it (when ``ev`` is given) and stops training at ``budget``."""
    import transformers

    class Clock(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.start = 0.0
            self.paused = 0.0
            self.next_eval = every
            self.step_times: list[float] = []
            self.last = 0.0

        def seconds(self) -> float:
            return time.perf_counter() - self.start - self.paused

        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            self.start = self.last = time.perf_counter()
            if ev is not None:
                curve.append({"seconds": 0.0, "step": 0, "loss": ev.loss_of_hf(model)})
                self.paused += time.perf_counter() - self.start

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
            now = time.perf_counter()
            self.step_times.append(now - self.last)
            t = self.seconds()
            if ev is not None and (t >= self.next_eval or t >= budget):
                paused = time.perf_counter()
                self.score(state.global_step, t, model)
                self.next_eval += every
                self.paused += time.perf_counter() - paused
            if t >= budget:
                control.should_training_stop = True
            self.last = time.perf_counter()

        def on_train_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
            # the schedule can end before the budget (steps faster than calibrated): score the
            # final weights too, or the curve would stop at the last periodic evaluation
            if ev is not None and curve and curve[-1]["step"] != state.global_step:
                self.score(state.global_step, self.seconds(), model, " (end of its schedule)")

        def score(self, step: int, t: float, model: Any, why: str = "") -> None:
            assert ev is not None
            curve.append({"seconds": t, "step": step, "loss": ev.loss_of_hf(model)})
            log(f"transformers: step {step}, {t:.0f} s{why}: val loss {curve[-1]['loss']:.3f}")

    return Clock()


def run_transformers(
    args: argparse.Namespace, ev: Evaluation, run_dir: Path, out: Path, budget: float
) -> tuple[list[dict[str, float]], int, float]:
    """Calibrate transformers' step time, then train it for the budget with its LR schedule tied
    to the steps that fit; its validation curve, the step count planned and its step time."""
    bf16 = pick_precision(args.precision, torch.device("cpu")) == "bf16"
    calibrate = make_clock_callback(None, float("inf"), float("inf"), [])
    hf_trainer(ev, run_dir, out, args.calibration_steps, [calibrate], bf16).train()
    step_time = sorted(calibrate.step_times[2:])[len(calibrate.step_times[2:]) // 2]
    max_steps = max(1, int(budget / step_time))
    log(f"transformers: {step_time:.3f} s per step (median of {args.calibration_steps - 2}) "
        f"-> its schedule runs {max_steps} steps in the budget")  # fmt: skip
    curve: list[dict[str, float]] = []
    every = budget / args.hf_evals
    clock = make_clock_callback(ev, budget, every, curve)
    hf_trainer(ev, run_dir, out, max_steps, [clock], bf16).train()
    return curve, max_steps, step_time


# ---- the comparison ------------------------------------------------------------------------
def time_to_reach(curve: list[dict[str, float]], target: float) -> float | None:
    """Training seconds at which ``curve`` first reaches ``target`` loss, linearly interpolated
    between evaluations; None when it never does."""
    for before, after in zip(curve, curve[1:], strict=False):
        if after["loss"] <= target:
            if before["loss"] <= target:
                return before["seconds"]
            share = (before["loss"] - target) / (before["loss"] - after["loss"])
            return before["seconds"] + share * (after["seconds"] - before["seconds"])
    return None


def plot(
    ours: list[dict],
    theirs: list[dict],
    target: float,
    reached: float | None,
    path: Path,
    precision: str,
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for curve, name, colour in (
        (ours, "bertforge", "#1f77b4"),
        (theirs, "transformers.Trainer", "#d62728"),
    ):
        ax.plot([p["seconds"] / 60 for p in curve], [p["loss"] for p in curve], "o-", ms=3,
                color=colour, label=name)  # fmt: skip
    ax.axhline(target, color="#d62728", ls=":", lw=1)
    if reached is not None:
        ax.axvline(reached / 60, color="#1f77b4", ls=":", lw=1)
        ax.annotate(
            f"transformers' final loss: bertforge\nreached it after {reached / 60:.1f} min",
            (reached / 60, target),
            xytext=(0.3, 0.5),
            textcoords="axes fraction",
            fontsize=8,
            arrowprops={"arrowstyle": "->", "lw": 0.8},
        )
    ax.set_xlabel("training time (minutes, evaluation excluded)")
    ax.set_ylabel("validation MLM loss (nats, same masks)")
    ax.set_title(f"Time to quality on {cpu_kind()}, {precision}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="prepared (packed) data directory")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "imdb-20m.yaml",
                        help="the bertforge recipe (default configs/imdb-20m.yaml)")  # fmt: skip
    parser.add_argument("--budget", default="20m", help="training time per side (default 20m)")
    parser.add_argument(
        "--word_init",
        default="recipe",
        choices=["recipe", "normal", "cooccurrence"],
        help="bertforge's word-embedding start: the config's (default), or override it",
    )
    parser.add_argument("--precision", default="auto", help="auto (bf16 where fast), fp32, bf16")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument(
        "--eval_every", type=int, default=200, help="bertforge steps per evaluation"
    )
    parser.add_argument("--hf_evals", type=int, default=8, help="transformers evaluations")
    parser.add_argument("--calibration_steps", type=int, default=12)
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "time-to-quality")
    args = parser.parse_args()
    # the runs start in the repository root: paths given from elsewhere must still point home
    args.data, args.output, args.config = (
        p.resolve() for p in (args.data, args.output, args.config)
    )
    torch.set_num_threads(args.threads)
    budget = parse_duration(args.budget)
    args.output.mkdir(parents=True, exist_ok=True)
    ours_dir = args.output / "bertforge"
    if (ours_dir / "results.json").exists():
        log(f"bertforge: reusing the finished run in {ours_dir}")
        ours = logged_curve(ours_dir)
    else:
        ours = run_bertforge(args, ours_dir)
    ev = Evaluation(ours_dir)
    check = ev.loss_of_directory(ours_dir / "model")
    if abs(check - ours[-1]["loss"]) > 1e-3:
        raise SystemExit(f"rebuilt validation batches score {check:.4f}, the run logged "
                         f"{ours[-1]['loss']:.4f}: the evaluations would not be comparable")  # fmt: skip
    theirs, hf_steps, hf_step_time = run_transformers(
        args, ev, ours_dir, args.output / "transformers", budget
    )
    target = theirs[-1]["loss"]
    reached = time_to_reach(ours, target)
    ours_tok = json.loads((ours_dir / "results.json").read_text())
    result = {
        "machine": machine_markdown(),
        "budget_seconds": budget,
        "precision": ev.precision,
        "bertforge": {"curve": ours, "steps": ours[-1]["step"], "final_loss": ours[-1]["loss"],
                      "seconds": ours_tok["elapsed"]},
        "transformers": {"curve": theirs, "steps": theirs[-1]["step"], "planned_steps": hf_steps,
                         "step_seconds": hf_step_time, "final_loss": target,
                         "seconds": theirs[-1]["seconds"]},
        "bertforge_seconds_to_transformers_final_loss": reached,
        "speedup_to_quality": (theirs[-1]["seconds"] / reached) if reached else None,
    }  # fmt: skip
    (args.output / "time_to_quality.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(ours, theirs, target, reached, args.output / "time_to_quality.png", ev.precision)
    rows = [
        ["bertforge", fmt(ours[-1]["step"]), f"{ours_tok['elapsed'] / 60:.1f}",
         f"{ours[-1]['loss']:.3f}", f"{reached / 60:.1f}" if reached else "not reached"],
        ["transformers.Trainer", fmt(theirs[-1]["step"]), f"{theirs[-1]['seconds'] / 60:.1f}",
         f"{target:.3f}", f"{theirs[-1]['seconds'] / 60:.1f}"],
    ]  # fmt: skip
    print(machine_markdown())
    print(f"- precision: {ev.precision}; budget {args.budget} of training per side\n")
    print(
        markdown_table(
            ["", "steps", "minutes", "val MLM loss", "minutes to transformers' final loss"], rows
        )
    )
    if reached:
        print(
            f"\nbertforge reached transformers' final loss {theirs[-1]['seconds'] / reached:.1f}x sooner"
        )
    else:
        print("\nbertforge did not reach transformers' final loss within the budget")
    print(f"curve: {args.output / 'time_to_quality.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
