"""GLUE-5 distillation study (issue 65, docs/distillation.md "GLUE-5"): all-MiniLM-L6-v2 fine-tuned
per task as the teacher, distilled into a student (our general-recipe BERT-Tiny, or any model
directory), with and without TinyBERT's augmentation; beside the student fine-tuned alone on the
same labels for the same steps, its random twin, the teacher and Google's published miniatures;
with ``--silver DIR``, the pair tasks' students distil on neighbour pairs of their training
sentences as well (``silver_pairs.py``).

Every step is a ``bertforge`` command, skipped when its output exists (a rerun continues; run two
processes with disjoint ``--tasks`` to use two cores). ``--table`` alone scores what exists and
writes OUTPUT/results.md and results.json::

    python benchmarks/distill_glue.py --student runs/general30/run/model --output runs/distill-glue \\
        --augment runs/general30/run/model --tasks CoLA RTE
    python benchmarks/distill_glue.py --student runs/general30/run/model --output runs/distill-glue --table

The students never see the dev set: each keeps its best evaluation on a held-out 10 % of
``--train``; every model is then scored on dev with the GLUE metric of ``bertforge benchmark``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from _common import machine_markdown, markdown_table

from bertforge.evaluation import benchmark as B
from bertforge.training.benchmark import score_sequence_model

TEACHER_OPTIONS = {
    "CoLA": ["--epochs", "3", "--metric", "mcc"],
    "SST-2": ["--max_steps", "600", "--eval_every", "300"],
    "STS-B": ["--epochs", "3", "--metric", "spearman"],
}
"""SST-2's 67k rows: 600 steps of 32 (0.3 epoch) for the teacher; the others 3 epochs. The
teacher validates on dev and keeps its best evaluation (of 2-3): if anything, that flatters the
teacher, and so the student's share of it."""
COPIES = {"CoLA": 6, "SST-2": 1, "MRPC": 5, "STS-B": 5, "RTE": 5}
"""Augmented copies per labelled row: about 12-60k new texts per task, what one core's teacher
pass labels in a few minutes (TinyBERT made 20 of every row, on GPUs)."""


def train_file(spec: B.TaskSpec, data: Path) -> Path:
    folder = data / spec.folder
    train = folder / spec.train
    if not train.exists() and (folder / (spec.train + ".gz")).exists():
        train = folder / (spec.train + ".gz")
    return train


def finetune_options(spec: B.TaskSpec) -> list[str]:
    opts = []
    for key, value in spec.columns.items():
        if value:
            opts += [f"--{key}", value]
    if spec.kind == "regression":
        opts += ["--task", "regression"]
    opts += ["--max_length", "128" if spec.columns.get("text_pair_column") else "64"]
    return opts


def bertforge(args: list[str], log: Path) -> float:
    """Run ``bertforge ARGS`` (output to ``log``); its wall time."""
    t0 = time.perf_counter()
    print("$ bertforge " + " ".join(args), flush=True)
    with open(log, "w") as f:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("bertforge")), *args], stderr=f, stdout=f
        )
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}); see {log}")
    return time.perf_counter() - t0


def run_task(spec: B.TaskSpec, a: argparse.Namespace) -> None:
    out, data = Path(a.output), Path(a.data_dir)
    threads = ["--num_threads", str(a.num_threads)]
    train = ["--train", str(train_file(spec, data))]
    teacher = Path(a.teachers or out) / f"teacher-{spec.name}"
    if not (teacher / "eval_results.json").exists():  # written last (the model: at every best)
        args = ["finetune", "--model", a.teacher, *train, *finetune_options(spec), *threads]
        args += ["--validation", str(data / spec.folder / spec.evaluate)]
        args += ["--batch_size", "32", "--lr", "5e-5", "--seed", "0"]
        args += TEACHER_OPTIONS.get(spec.name, ["--epochs", "3"])
        bertforge([*args, "--output", str(teacher)], teacher.with_suffix(".log"))
    if a.teachers_only:
        return
    # the students validate on a held-out 10 % of --train (never on dev, which scores them)
    common = ["distill", "--teacher", str(teacher), "--student", a.student, *train, *threads]
    common += ["--batch_size", "32", "--lr", str(a.lr), "--dropout", "0", "--seed", "0"]
    common += ["--alpha", str(a.alpha), "--temperature", "2"]
    if spec.name == "CoLA":  # by accuracy, CoLA's students stop at the majority class
        common += ["--metric", "mcc"]
    plain = out / f"distilled-{spec.name}"
    if not (plain / "model.safetensors").exists() or not (plain / "report.json").exists():
        args = [*common, "--epochs", str(a.epochs), "--report", "true", "--report_alone", "true"]
        bertforge([*args, "--output", str(plain)], out / f"distilled-{spec.name}.log")
    if a.silver and spec.columns.get("text_pair_column"):
        pairs = Path(a.silver) / f"silver-{spec.name}.jsonl"
        if not pairs.exists():
            script = Path(__file__).with_name("silver_pairs.py")
            cmd = [sys.executable, str(script), "--task", spec.name, "--output", str(pairs)]
            print("$ " + " ".join(cmd), flush=True)
            subprocess.run([*cmd, "--num_threads", str(a.num_threads)], check=True)
        silver = out / f"silver-{spec.name}"
        if not (silver / "report.json").exists():
            args = [*common, "--unlabelled", str(pairs), "--epochs", str(a.silver_epochs)]
            args += ["--report", "true", "--report_compare", str(plain)]
            bertforge([*args, "--output", str(silver)], out / f"silver-{spec.name}.log")
    if a.augment:
        augmented = out / f"augmented-{spec.name}"
        if not (augmented / "report.json").exists():
            args = [*common, "--augment", a.augment, "--augment_copies", str(COPIES[spec.name])]
            args += ["--epochs", str(a.augment_epochs), "--report", "true"]
            args += ["--report_compare", str(plain)]
            bertforge([*args, "--output", str(augmented)], out / f"augmented-{spec.name}.log")


ROWS = (
    ("teacher", "teacher: all-MiniLM-L6-v2 fine-tuned (6 x 384)"),
    ("twin", "student's random twin, fine-tuned alone"),
    ("alone", "student fine-tuned alone (same labels, same steps)"),
    ("distilled", "student distilled (labelled rows only)"),
    ("augmented", "student distilled + TinyBERT augmentation"),
    ("silver", "student distilled + silver pairs (silver_pairs.py)"),
)


def model_dirs(spec: B.TaskSpec, out: Path, teachers: Path) -> dict[str, Path]:
    plain = out / f"distilled-{spec.name}"
    return {
        "teacher": teachers / f"teacher-{spec.name}",
        "twin": plain / "report" / "twin",
        "alone": plain / "report" / "alone",
        "distilled": plain,
        "augmented": out / f"augmented-{spec.name}",
        "silver": out / f"silver-{spec.name}",
    }


def score_all(a: argparse.Namespace) -> dict[str, Any]:
    out, data = Path(a.output), Path(a.data_dir)
    cfg = cast(Any, SimpleNamespace(device="cpu"))
    scores: dict[str, dict[str, float]] = {}
    for spec in B.GLUE:
        if a.tasks and spec.name not in a.tasks:
            continue
        settings = {"max_length": 128 if spec.columns.get("text_pair_column") else 64}
        settings["precision"] = "fp32"
        for row, path in model_dirs(spec, out, Path(a.teachers or out)).items():
            if (path / "model.safetensors").exists():
                metrics, _ = score_sequence_model(
                    path, data / spec.folder / spec.evaluate, spec, settings, cfg
                )
                points = 100 * sum(metrics[m] for m in spec.metrics) / len(spec.metrics)
                scores.setdefault(row, {})[spec.name] = points
    speed = {}
    for spec in B.GLUE:
        if a.tasks and spec.name not in a.tasks:
            continue
        for run in ("silver", "augmented", "distilled"):  # the last report has the most rows
            report = out / f"{run}-{spec.name}" / "report.json"
            if report.exists():
                speed[spec.name] = json.loads(report.read_text())["ratio"]["texts_per_second"]
                break
    return {"scores": scores, "student_over_teacher_texts_per_s": speed}


def speed_table(result: dict[str, Any], tasks: list[str]) -> str:
    """The student's texts/s over the teacher's, per task (each report's own interleaved run)."""
    speeds = result["student_over_teacher_texts_per_s"]
    keys = ("eager_b1", "eager_b32", "onnx_int8_b1", "onnx_int8_b32")
    rows = [[t, *(f"{speeds[t][k]:.1f}x" for k in keys)] for t in tasks if t in speeds]
    return markdown_table(["task", *keys], rows)


def table(result: dict[str, Any], tasks: list[str]) -> str:
    header = ["model", *tasks, "GLUE-5" if len(tasks) == 5 else f"mean of {len(tasks)}"]
    rows = []
    for key, name in ROWS:
        got = result["scores"].get(key, {})
        cells = [f"{got[t]:.1f}" if t in got else "" for t in tasks]
        mean = f"**{sum(got.values()) / len(tasks):.1f}**" if len(got) == len(tasks) else ""
        rows.append([name, *cells, mean])
    for google in ("BERT-Tiny", "BERT-Mini", "BERT-Small"):
        cells = []
        for t in tasks:
            spec = next(s for s in B.GLUE if s.name == t)
            pub = spec.published[google]
            cells.append(f"{sum(pub.values()) / len(pub):.1f}")
        mean = sum(float(c) for c in cells) / len(cells)
        rows.append([f"Google {google} (GLUE test)", *cells, f"{mean:.1f}"])
    return markdown_table(header, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", required=True, help="the student's start (a model directory)")
    p.add_argument("--output", required=True)
    p.add_argument(
        "--teacher", default="all-MiniLM-L6-v2", help="the model each teacher starts from"
    )
    p.add_argument("--augment", help="a masked-LM directory for --augment (default: none)")
    p.add_argument(
        "--teachers",
        help="the folder of the teacher-TASK models (made there when missing; default: --output), "
        "so that several students' studies share one set of teachers",
    )
    p.add_argument("--data_dir", default=str(Path(__file__).parents[1].parent / "shared/data/glue"))
    p.add_argument("--tasks", nargs="*", default=[t.name for t in B.GLUE])
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--augment_epochs", type=float, default=2)
    p.add_argument(
        "--silver",
        help="a folder of silver-TASK.jsonl neighbour pairs (made there by silver_pairs.py when "
        "missing): the pair tasks' students also distil on them (default: none)",
    )
    p.add_argument("--silver_epochs", type=float, default=3)
    p.add_argument("--num_threads", type=int, default=1)
    p.add_argument("--table", action="store_true", help="score what exists and write the table")
    p.add_argument("--teachers_only", action="store_true", help="fine-tune the teachers alone")
    a = p.parse_args()
    Path(a.output).mkdir(parents=True, exist_ok=True)
    if not a.table:
        for spec in B.GLUE:
            if spec.name in a.tasks:
                run_task(spec, a)
        return
    result = score_all(a)
    tasks = [t.name for t in B.GLUE if t.name in a.tasks]
    text = f"# GLUE-5 distillation\n\n{machine_markdown()}\n\nStudent: `{a.student}`; teachers in "
    text += f"`{a.teachers or a.output}`.\n\n{table(result, tasks)}\n"
    text += "\nThe student's texts/s over the teacher's:\n\n" + speed_table(result, tasks) + "\n"
    (Path(a.output) / "results.md").write_text(text)
    (Path(a.output) / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
