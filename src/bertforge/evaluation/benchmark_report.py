"""The report of ``bertforge benchmark``: from the per-task results to the table rows (our model,
its random twin, the constant baseline, the published models), the markdown tables, the chart,
and results.json / results.md / results.png."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bertforge.evaluation import benchmark as B
from bertforge.evaluation.plots import plot_grouped_bars
from bertforge.io import atomic_write_text
from bertforge.progress import format_duration

COLUMN_LABELS = {"random_init": "random twin", "constant": "constant baseline"}
"""How the tables name our columns besides the model (named by ``--name``)."""
SIZES = ("Tiny", "Mini", "Small", "Medium", "Base", "Large")


def format_scores(scores: Mapping[str, float]) -> str:
    """``F1 81.2, acc 70.3``: metrics in points."""
    return ", ".join(f"{B.METRIC_NAMES[k]} {100 * v:.1f}" for k, v in scores.items())


def _size_rank(model: str) -> int:
    return next((i for i, size in enumerate(SIZES) if model.endswith(size)), len(SIZES))


def table_rows(
    suite: str, name: str, tasks: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The table's rows: our model (``name``), its random twin, the constant baseline, then the
    published models (smallest first), each ``{column, label, published, tasks: {task: scores},
    scores: {task: task score}, average}`` (the average only over every task, else None)."""
    spec_of = {s.name: s for s in B.SUITES[suite]}
    columns: list[tuple[str, str, dict[str, Mapping[str, float]]]] = []
    for column in ("model", "random_init", "constant"):
        cells = {t: e[column]["scores"] for t, e in tasks.items() if e.get(column)}
        # a baseline of its own kind (no entity, the context's first words) names itself
        named = [e[column]["label"] for e in tasks.values() if (e.get(column) or {}).get("label")]
        if cells:
            columns.append((column, named[0] if named else COLUMN_LABELS.get(column, name), cells))
    published = {m for e in tasks.values() for m in e["published"]}
    for model in sorted(published, key=_size_rank):
        cells = {t: e["published"][model] for t, e in tasks.items() if model in e["published"]}
        columns.append((model, f"{model} (test)*", cells))
    rows = []
    for column, label, cells in columns:
        scores = {t: B.task_score(cells[t], spec_of[t]) if t in cells else None for t in tasks}
        rows.append(
            {
                "column": column,
                "label": label,
                "published": column not in ("model", "random_init", "constant"),
                "tasks": cells,
                "scores": {t: v for t, v in scores.items() if v is not None},
                "average": B.suite_average(scores),
            }
        )
    return rows


def average_label(suite: str, tasks: int) -> str | None:
    """The average column's name: ``average`` over the whole suite, ``average (2 of 5 tasks)``
    over part of it (not comparable with a whole suite's), none for a single task."""
    total = len(B.SUITES[suite])
    if tasks < 2:
        return None
    return "average" if tasks == total else f"average ({tasks} of {total} tasks)"


def _cell(scores: Mapping[str, float] | None, metrics: Sequence[str]) -> str:
    if not scores:
        return "–"
    return "/".join(f"{100 * scores[m]:.1f}" for m in metrics)


def markdown_table(result: Mapping[str, Any]) -> str:
    """The suite's results as a markdown table: one row per entry of ``result["rows"]``, one
    column per task (its metrics joined by /) and the average (:func:`average_label`); every
    value in points (x 100)."""
    tasks = result["tasks"]
    header = ["model"]
    for n, entry in tasks.items():
        metrics = "/".join(B.METRIC_NAMES[m] for m in entry["metrics"])
        header.append(f"{n} ({metrics}, {entry['split']})")
    average = average_label(result["suite"], len(tasks))
    if average:
        header.append(average)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["rows"]:
        cells = [
            row["label"],
            *(_cell(row["tasks"].get(n), e["metrics"]) for n, e in tasks.items()),
        ]
        if average:
            cells.append("–" if row["average"] is None else f"{100 * row['average']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_table(name: str, tasks: Mapping[str, Mapping[str, Any]]) -> str:
    """Per task and fine-tuned column: every seed's scores, the median, steps and training time."""
    lines = [
        "| task | model | seeds | per seed | median | steps | epochs | training time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task, entry in tasks.items():
        for column in ("model", "random_init"):
            res = entry.get(column)
            if not res:
                continue
            seeds = res["seeds"]
            lines.append(
                f"| {task} | {COLUMN_LABELS.get(column, name)} | {len(seeds)} | "
                + "; ".join(format_scores(s["scores"]) for s in seeds)
                + f" | {format_scores(res['scores'])} | "
                + "/".join(str(s["steps"]) for s in seeds)
                + " | "
                + "/".join(f"{s['epochs']:g}" for s in seeds)
                + f" | {format_duration(res['train_seconds'])} |"
            )
    return "\n".join(lines)


def lr_grid_note(tasks: Mapping[str, Mapping[str, Any]], name: str) -> str | None:
    """What a learning-rate grid chose (``bertforge benchmark --lr`` with several values): the
    grid, and per task and fine-tuned column the value whose median scored best; None without a
    grid."""
    chosen = []
    grid: list[str] = []
    for task, entry in tasks.items():
        for column in ("model", "random_init"):
            res = entry.get(column)
            if res and res.get("grid"):
                grid = grid or list(res["grid"])
                label = COLUMN_LABELS.get(column, name)
                chosen.append(f"{task} {label} {res['settings']['lr']:g}")
    if not chosen:
        return None
    return (
        f"Learning rate: the best of the grid {', '.join(grid)} for each task and model, chosen "
        "on the scored file itself, as Google's miniature numbers were (an upper estimate of a "
        "held-out score). Chosen: " + "; ".join(chosen) + "."
    )


def write_report(output: Path, result: dict[str, Any]) -> str:
    """Write ``result`` (with its ``rows``) to results.json, results.md and results.png in
    ``output``; return the markdown table."""
    name, tasks, rows = result["name"], result["tasks"], result["rows"]
    splits = "/".join(sorted({e["split"] for e in tasks.values()}))
    table = markdown_table(result)
    average = average_label(result["suite"], len(tasks))
    notes = [
        f"# bertforge benchmark: {name} on {result['suite']}",
        "",
        table,
        "",
        "Points (x 100). A task's score is the mean of its metrics, the average the mean of the "
        f"task scores (the GLUE convention). Ours: the median over seeds on each task's {splits} "
        "file."
        + (
            " The constant baseline predicts the training split's majority label (mean score)."
            if any(row["column"] == "constant" for row in rows)
            else ""
        ),
    ]
    grid_note = lr_grid_note(tasks, name)
    if grid_note:
        notes.append(grid_note)
    for task, entry in tasks.items():
        base = entry.get("constant") or {}
        if base.get("label"):  # the task's own baseline, scored on its test file
            notes.append(f"{task}'s baseline predicts {base['predicts']} ({base['definition']}).")
    if result.get("published_source"):
        notes.append(f"\\* {result['published_source']}: GLUE *test*-set numbers; ours are dev.")
    if result.get("smoke"):
        notes.append(
            "\n**A --smoke run: 48 examples per file and 2 steps; its numbers mean nothing.**"
        )
    notes += ["", seed_table(name, tasks), ""]
    atomic_write_text(output / "results.md", "\n".join(notes))
    atomic_write_text(output / "results.json", json.dumps(result, indent=2) + "\n")
    shown = {t: category_label(t, e["metrics"]) for t, e in tasks.items()}
    bars = {}
    for row in rows:
        values = {shown[t]: 100 * v for t, v in row["scores"].items()}
        if average and row["average"] is not None:
            values[average] = 100 * row["average"]
        bars[row["label"]] = values
    published = any(r["published"] for r in rows)
    plot_grouped_bars(
        bars,
        [*shown.values(), *([average] if average else [])],
        output / "results.png",
        title=f"{name} on {result['suite']} ({splits}{'; * = GLUE test set' if published else ''})"
        + (
            "\n--smoke run (48 examples, 2 steps): the numbers mean nothing"
            if result.get("smoke")
            else ""
        ),
        ylabel="task score (points)",
        hatched=tuple(r["label"] for r in rows if r["published"]),
    )
    return table


def category_label(task: str, metrics: Sequence[str]) -> str:
    """A task's name under its bars: with ``(mean of`` / ``EM, F1)`` when its score averages
    several metrics (the GLUE convention), which the bar alone does not say; on lines of their
    own, so that neighbours' labels ("Pearson, Spearman" beside "F1, acc") do not run together."""
    if len(metrics) < 2:
        return task
    return f"{task}\n(mean of\n{', '.join(B.METRIC_NAMES[m] for m in metrics)})"


__all__ = [
    "COLUMN_LABELS",
    "category_label",
    "format_scores",
    "lr_grid_note",
    "markdown_table",
    "seed_table",
    "table_rows",
    "write_report",
]
