"""``bertforge benchmark --curve``: what pretraining time buys, read from finished GLUE benchmarks.

Each ``--curve`` directory is a finished ``bertforge benchmark --suite glue`` output; its
``results.json`` names the model it scored, and that model's run says how many minutes of
pretraining it had: a time snapshot ``RUN/snapshots/model-15m`` (``--train.snapshots``) is 15, a
run's final ``RUN/model`` its ``train.max_time`` (``RUN/pretrain_config.yaml``); ``--curve_minutes``
gives them instead. Each run's random twin (of a benchmark of its models run with ``--baseline``)
stands at minute 0 of its line, and Google's BERT-Tiny and BERT-Mini (their published GLUE *test*
numbers; ours are dev) as horizontal lines. Models of several pretraining runs (two recipes'
snapshots, say) are one line per run, each from its own twin (another run's twin has another
tokenizer and config) or from none.

The scores are the benchmark table's own (:func:`~bertforge.evaluation.benchmark_report.table_rows`:
a task's score the mean of its metrics, the GLUE-5 average the mean of the five), drawn in one
PNG of three panels (GLUE-5 average, STS-B, SST-2) and written beside it as a markdown table and
JSON: ``OUTPUT/curve.png``, ``curve.md``, ``curve.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bertforge.errors import BertforgeError
from bertforge.evaluation.benchmark_report import table_rows
from bertforge.evaluation.plots import plot_score_curves
from bertforge.io import atomic_write_text, make_directory, read_json_object
from bertforge.modeling.checkpoint import RUN_MODEL_DIR
from bertforge.progress import parse_duration
from bertforge.training.checkpoints import SNAPSHOT_PREFIX, snapshot_seconds
from bertforge.training.pretrain import CONFIG_FILE

AVERAGE = "GLUE-5 average"
"""The first panel: the mean of the five task scores, as the benchmark's table's average."""
PANELS = (AVERAGE, "STS-B", "SST-2")
"""What the curve shows, in its panels' order."""
REFERENCES = ("BERT-Tiny", "BERT-Mini")
"""The published models drawn as lines (``results.json``'s ``published``)."""
TWIN = "random twin"
CURVE_PNG, CURVE_MD, CURVE_JSON = "curve.png", "curve.md", "curve.json"
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class CurvePoint:
    """One point of the curve: a scored model and its pretraining minutes."""

    minutes: float
    """Pretraining minutes on the run's budget clock (0 for the random twin)."""
    label: str
    """The model's name in the benchmark's table (``random twin`` for the twin)."""
    results: str
    """The benchmark output it was read from."""
    model: str
    """The model directory the benchmark scored."""
    scores: dict[str, float | None]
    """Per panel (:data:`PANELS`), the score as a fraction; None where a task is missing."""
    run: str = ""
    """The pretraining run the model comes from (:func:`run_of`): one line of the curve each."""


def read_results(directory: str) -> dict[str, Any]:
    """A finished GLUE benchmark's ``results.json`` (its directory, or the file itself)."""
    path = Path(directory)
    path = path if path.name == RESULTS_FILE else path / RESULTS_FILE
    if not path.is_file():
        raise BertforgeError(
            f"--curve {directory}: no {RESULTS_FILE} there; give the --output of a finished "
            "bertforge benchmark --suite glue"
        )
    result = read_json_object(path, "run its benchmark again to rewrite it")
    if result.get("suite") != "glue" or not isinstance(result.get("tasks"), dict):
        raise BertforgeError(
            f"--curve {directory}: a benchmark of --suite {result.get('suite')}; the curve "
            "reads --suite glue benchmarks"
        )
    return result


def run_of(model: str) -> str:
    """The pretraining run a model comes from: ``RUN`` for ``RUN/model`` and
    ``RUN/snapshots/model-<time>``; any other model is a run of its own."""
    path = Path(model)
    if snapshot_seconds(path) is not None:
        return str(path.parent.parent)
    return str(path.parent) if path.name == RUN_MODEL_DIR else str(path)


def pretraining_minutes(model: str) -> float:
    """The pretraining minutes of ``model``, read from its run: a snapshot's name
    (``RUN/snapshots/model-15m`` -> 15) or, for a run's final ``RUN/model``, the run's
    ``train.max_time``."""
    path = Path(model)
    seconds = snapshot_seconds(path)
    if seconds is not None:
        return seconds / 60
    config = path.parent / CONFIG_FILE if path.name == RUN_MODEL_DIR else path / CONFIG_FILE
    if not config.is_file():
        raise BertforgeError(
            f"{model}: not a pretraining run's model/ or snapshots/model-<time> (no {config}), "
            "so its pretraining minutes are unknown; give them with --curve_minutes"
        )
    try:
        train = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("train") or {}
        seconds = parse_duration(train.get("max_time"))
    except (yaml.YAMLError, AttributeError, BertforgeError) as err:
        raise BertforgeError(f"{config}: unreadable ({err}); give --curve_minutes") from None
    if seconds is None:
        raise BertforgeError(
            f"{config}: a run without --train.max_time (a step budget), so its minutes are "
            "unknown; give them with --curve_minutes"
        )
    return seconds / 60


def panel_scores(row: dict[str, Any]) -> dict[str, float | None]:
    """A row of the benchmark's table (:func:`table_rows`) as the curve's panels."""
    return {
        AVERAGE: row["average"],
        **{task: row["scores"].get(task) for task in PANELS if task != AVERAGE},
    }


def curve_points(
    results: list[tuple[str, dict[str, Any]]], minutes: list[float] | None = None
) -> tuple[list[CurvePoint], dict[str, CurvePoint], dict[str, dict[str, float | None]]]:
    """The curve of ``results`` (``(directory, results.json)`` pairs): one point per benchmark,
    at ``minutes`` (or each model's :func:`pretraining_minutes`), earliest first; each run's
    random twin (``{run: point}``, at minute 0), from the first of its benchmarks that has one;
    and the published :data:`REFERENCES`' scores (each by :func:`panel_scores`). Models of
    several runs are several lines (:func:`series`); two benchmarks at the same minute of one
    run are an error."""
    points: list[CurvePoint] = []
    twins: dict[str, CurvePoint] = {}
    references: dict[str, dict[str, float | None]] = {}
    for i, (directory, result) in enumerate(results):
        rows = {r["column"]: r for r in table_rows("glue", result["name"], result["tasks"])}
        at = minutes[i] if minutes is not None else pretraining_minutes(result["model"])
        run = run_of(result["model"])
        clash = next((p for p in points if p.minutes == at and p.run == run), None)
        if clash is not None:
            raise BertforgeError(
                f"--curve {clash.results} and {directory} both score a model of {at:g} minutes "
                f"of one run ({run}); give one benchmark per point (or set --curve_minutes)"
            )
        scores = panel_scores(rows["model"])
        points.append(CurvePoint(at, result["name"], directory, result["model"], scores, run))
        if run not in twins and "random_init" in rows:
            twins[run] = CurvePoint(
                0.0, TWIN, directory, result["model"], panel_scores(rows["random_init"]), run
            )
        for name in REFERENCES:
            if name in rows and name not in references:
                references[name] = panel_scores(rows[name])
    order = list(dict.fromkeys(p.run for p in points))  # the runs in the order given
    return sorted(points, key=lambda p: (order.index(p.run), p.minutes)), twins, references


def series(points: list[CurvePoint]) -> dict[str, list[CurvePoint]]:
    """The points by run (the curve's lines), each run named by its first snapshot's name
    without the time (:func:`run_name`), else by its model's name; runs that share a name
    (benchmarks named by default after runs that are all ``.../run``) are named by the ends of
    their paths instead, as far up as tells them apart (``bench-a/run``, ``bench-b/run``)."""
    runs: dict[str, list[CurvePoint]] = {}
    for p in points:
        runs.setdefault(p.run, []).append(p)
    names = {}
    for run, pts in runs.items():
        snapshots = [p for p in pts if snapshot_seconds(p.model) is not None]
        names[run] = run_name((snapshots or pts)[0]).rstrip(" ,;:")
    shared = [run for run in runs if list(names.values()).count(names[run]) > 1]
    names |= dict(zip(shared, distinct_tails(shared), strict=True))
    return {names[run]: pts for run, pts in runs.items()}


def distinct_tails(paths: list[str]) -> list[str]:
    """The shortest ends of ``paths`` (their last parts, joined by /) that tell them apart:
    ``x/a/run`` and ``x/b/run`` are ``a/run`` and ``b/run``; a path shorter than the others
    stays whole."""
    parts = [Path(p).parts for p in paths]
    depth = 1
    while depth < max((len(p) for p in parts), default=1):
        tails = ["/".join(p[-depth:]) for p in parts]
        if len(set(tails)) == len(tails):
            break
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


def point_label(point: CurvePoint, line: str) -> str:
    """A point's name in curve.md: its benchmark's (``pt at 15m``), or, where its line was
    renamed to tell two runs apart, the line's with the snapshot's time (``a/run at 15m``)."""
    if run_name(point).rstrip(" ,;:") == line:
        return point.label
    if snapshot_seconds(point.model) is not None:
        return f"{line} at {Path(point.model).name.removeprefix(SNAPSHOT_PREFIX)}"
    return line


def run_name(point: CurvePoint) -> str:
    """The name of the run a point's model comes from: a snapshot's (``pt at 15m``) without its
    time, any other model's as it is."""
    if snapshot_seconds(point.model) is None:
        return point.label
    return point.label.rpartition(" at ")[0] or point.label


def in_points(scores: dict[str, float | None]) -> dict[str, float]:
    """Scores (fractions) in GLUE points, the missing ones left out: what a panel draws."""
    return {k: 100 * v for k, v in scores.items() if v is not None}


def _points(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def curve_table(
    lines: dict[str, list[CurvePoint]],
    twins: dict[str, CurvePoint],
    references: dict[str, dict[str, Any]],
) -> str:
    """The curve as a markdown table in GLUE points: each line (:func:`series`) from its random
    twin to its points by minutes, then the published references."""
    header = "| pretraining minutes | model | " + " | ".join(PANELS) + " | benchmark |"
    rows = [header, "|" + "---|" * (len(PANELS) + 3)]
    for line, points in lines.items():
        twin = twins.get(points[0].run)
        named = [(twin, TWIN if len(lines) == 1 else f"{TWIN} of {line}")] if twin else []
        for p, label in named + [(p, point_label(p, line)) for p in points]:
            cells = " | ".join(_points(p.scores[k]) for k in PANELS)
            rows.append(f"| {p.minutes:g} | {label} | {cells} | {p.results} |")
    for name, scores in references.items():
        cells = " | ".join(_points(scores[k]) for k in PANELS)
        rows.append(f"| – | {name} (Google, test)* | {cells} | published |")
    return "\n".join(rows)


def write_curve(
    directories: list[str],
    output: str,
    minutes: list[float] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Read the ``--curve`` benchmarks, then write ``curve.png``, ``curve.md`` and
    ``curve.json`` in ``output``; return curve.json's content. ``name`` is the title's (default:
    the names of the runs the models come from)."""
    results = [(d, read_results(d)) for d in directories]
    points, twins, references = curve_points(results, minutes)
    out = make_directory(output)
    smoke = any(r.get("smoke") for _, r in results)
    source = next((r["published_source"] for _, r in results if r.get("published_source")), None)
    caveat = "ours: GLUE dev sets (median over seeds)" + (
        "; Google's BERT-Tiny/Mini: published GLUE test-set numbers, not like for like"
        if references
        else ""
    )
    lines = series(points)
    names = [name] if name else list(lines)
    title = f"What pretraining time buys on GLUE: {', '.join(names)}" + (
        " (--smoke: the numbers mean nothing)" if smoke else ""
    )
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in PANELS}
    starts: dict[str, tuple[str, dict[str, float]]] = {}
    for label, run_points in lines.items():
        one = len(lines) == 1
        legend = (
            "ours after N minutes of pretraining (dev)"
            if one
            else f"{label}: after N minutes (dev)"
        )
        for p in run_points:
            for k, v in in_points(p.scores).items():
                panels[k].setdefault(legend, []).append((p.minutes, v))
        twin = twins.get(run_points[0].run)
        if twin is not None:  # the line starts at its own run's twin
            what = "random twin: not pretrained, minute 0 (dev)"
            starts[legend] = (what if one else f"{label}: {what}", in_points(twin.scores))
    plot_score_curves(
        panels,
        out / CURVE_PNG,
        starts=starts,
        references={
            f"Google {name} (published, GLUE test)": in_points(scores)
            for name, scores in references.items()
        },
        title=title,
        subtitle=caveat,
        xlabel="pretraining minutes (budget clock)",
        ylabel="score (GLUE points)",
    )
    table = curve_table(lines, twins, references)
    notes = [
        f"# What pretraining time buys on GLUE: {', '.join(names)}",
        "",
        table,
        "",
        "GLUE points (x 100). STS-B: the mean of Pearson and Spearman; SST-2: accuracy; "
        f"{AVERAGE}: the mean of the five task scores (CoLA, SST-2, MRPC, STS-B, RTE), as in each "
        "benchmark's results.md. Ours are GLUE dev scores, the median over seeds. Minutes are "
        "on the pretraining run's budget clock (--train.max_time); a snapshot of a longer run "
        "was trained under that run's learning-rate schedule.",
    ]
    for line, run_points in lines.items():
        twin = twins.get(run_points[0].run)
        whose = "" if len(lines) == 1 else f" of {line}"
        if twin:
            notes.append(
                f"The random twin{whose} (minute 0) is the one benchmarked in {twin.results}."
            )
        elif len(lines) > 1:
            notes.append(
                f"{line} has no random twin (none of its benchmarks ran --baseline): its line "
                "starts at its first model."
            )
    if source:
        notes.append(f"\\* {source}: GLUE *test*-set numbers; ours are dev.")
    if smoke:
        notes.append("\n**--smoke benchmarks: their numbers mean nothing.**")
    atomic_write_text(out / CURVE_MD, "\n".join(notes) + "\n")
    curve = {
        "suite": "glue",
        "panels": list(PANELS),
        "points": [asdict(p) for p in points],
        "lines": {line: [p.results for p in pts] for line, pts in lines.items()},
        "random_twins": {
            line: asdict(twins[pts[0].run]) for line, pts in lines.items() if pts[0].run in twins
        },
        # the first line's twin, as curve.json held it before lines had a twin each
        "random_twin": next((asdict(twins[p.run]) for p in points if p.run in twins), None),
        "references": references,
        "published_source": source,
        "smoke": smoke,
        "png": str(out / CURVE_PNG),
    }
    atomic_write_text(out / CURVE_JSON, json.dumps(curve, indent=2) + "\n")
    print(table)
    return curve


__all__ = [
    "AVERAGE",
    "PANELS",
    "CurvePoint",
    "curve_points",
    "curve_table",
    "distinct_tails",
    "point_label",
    "pretraining_minutes",
    "read_results",
    "run_of",
    "series",
    "write_curve",
]
