"""``bertforge benchmark``: a model fine-tuned on a suite of public tasks (GLUE; NER and QA once
those fine-tuning tasks exist), scored on each task's dev or test file, beside a constant
baseline, optionally its random twin (as ``bertforge downstream`` makes it), and the published
numbers of Google's BERT miniatures. The suites are declared in
:mod:`bertforge.evaluation.benchmark`; this module runs them.

Protocol per task and seed: ``bertforge finetune`` on the training file for the task's epochs,
evaluated once, at the end, on the scored file (so that file never selects a checkpoint), as
Google's ``run_classifier`` and transformers' ``run_glue`` report dev results; then the final
model's predictions are scored with the GLUE metrics. The median over seeds is reported.

OUTPUT holds ``benchmark_config.json``; ``runs/<column>/<task>/seed-<n>/`` (each a fine-tuning
run: logs, plots; weights deleted once scored unless ``--keep_models``);
``results/<column>/<task>/seed-<n>.json`` and ``results/<column>/<task>.json`` (written atomically
as each finishes: a rerun skips what they hold); ``random_init_model/`` with ``--baseline``; and
the report: ``results.json``, ``results.md``, ``results.png``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.encoding import encode_examples
from bertforge.data.labelled import load_labelled
from bertforge.data.suite_files import data_directory, find_file, sample_file
from bertforge.data.tables import read_table
from bertforge.errors import BertforgeError
from bertforge.evaluation import benchmark as B
from bertforge.evaluation.benchmark_report import format_scores, table_rows, write_report
from bertforge.evaluation.embedding import model_vectors
from bertforge.evaluation.embedding_suite import (
    EMBEDDING_TASKS,
    documents,
    load_task,
    score_task,
    write_suite_report,
)
from bertforge.evaluation.task_scores import class_names, evaluate_sequence_model
from bertforge.io import atomic_write_text, make_directory, read_json_object
from bertforge.modeling.auto import model_class
from bertforge.modeling.checkpoint import RUN_MODEL_DIR, resolve_model
from bertforge.modeling.config import ModernBertConfig, load_config
from bertforge.modeling.pooling import declared_max_length
from bertforge.progress import format_duration, parse_budget, parse_duration, plural
from bertforge.runtime import Precision, pick_device, pick_precision
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.benchmark_curve import write_curve
from bertforge.training.checkpoints import SNAPSHOT_PREFIX, snapshot_seconds
from bertforge.training.config import (
    ClassifierPooling,
    FinetuneConfig,
    check_at_least,
    check_choice,
    check_positive,
)
from bertforge.training.downstream import TWIN_DIR, load_encoder_dir, make_random_twin
from bertforge.training.finetune import finetune

CONFIG_FILE = "benchmark_config.json"
SMOKE = {"train_rows": 48, "eval_rows": 48, "max_steps": 2, "max_length": 64, "batch_size": 8}
"""``--smoke``: rows of each file, steps, length and batch: seconds per task, numbers of no worth."""
SMOKE_WARNING = (
    f"A --smoke run: {SMOKE['eval_rows']} examples per file and {SMOKE['max_steps']} steps; its "
    "numbers mean nothing."
)
"""What stdout says under a --smoke run's table."""
SMOKE_QA_LENGTH = 192
"""``--smoke``'s window for question answering: a question and some context must fit in it."""
EVALUATE_ONCE = 1 << 40
"""``--eval_every`` of the fine-tuning runs: never before the end, so the scored file is seen once,
by the final model (it must not pick a checkpoint)."""


@dataclass(kw_only=True)
class BenchmarkConfig:
    """Everything ``bertforge benchmark`` needs; written to OUTPUT/benchmark_config.json."""

    model: str | None = None
    """The model directory to benchmark (ours or any BERT checkpoint, e.g. all-MiniLM-L6-v2);
    required unless --curve."""
    output: str
    """Output directory: fine-tuning runs, per-task results, results.json/.md/.png. Run the
    same command again to resume: finished tasks and seeds are skipped. With --curve: where
    curve.png, curve.md and curve.json go."""
    suite: B.Suite = "glue"
    """glue (CoLA, SST-2, MRPC, STS-B, RTE; dev sets), ner (WikiANN-en, WNUT-17; test entity F1),
    qa (XQuAD-en EM/F1) or embedding (a sentence-embedding model scored zero-shot: STS-B dev
    cosine Spearman/Pearson and XQuAD-en question-to-paragraph retrieval; --data_dir is then the
    folder holding glue/ and qa/, docs/embeddings.md)."""
    tasks: list[str] | None = None
    """Run only these tasks of the suite (e.g. --tasks CoLA RTE); default: all."""
    seeds: int | None = None
    """Fine-tuning runs per task, seeds 0..N-1, reporting the median (default: each task's, 3 for
    the small unstable tasks CoLA, MRPC, STS-B, RTE and 1 for SST-2)."""
    baseline: bool = False
    """Also fine-tune the model's random twin (same config and tokenizer, freshly initialised
    weights) on every task alike: what pretraining bought."""
    init_seed: int = 0
    """Seed of the random twin's initialisation."""
    name: str | None = None
    """The model's name in the tables (default: its directory's name; for a directory named
    model, as a training run's, the run's). With --curve: the name in the curve's title (default:
    the runs' names)."""
    data_dir: str | None = None
    """The suite's data folder (glue/: CoLA/train.tsv, CoLA/dev.tsv, ...). Default:
    $BERTFORGE_DATA/<suite> when that variable is set, else ../shared/data/<suite> from the
    current directory."""
    epochs: float | None = None
    """Override every task's epochs (default: each task's, see docs/benchmark.md)."""
    lr: list[float] | None = None
    """Override every task's peak learning rate. Several values (--lr 3e-4 1e-4 5e-5 3e-5) are
    a grid: each is run with every seed, and each task reports its best value's median on the
    scored file, named as such (Google's BERT miniatures report the best of that grid, 4 epochs,
    on GLUE dev)."""
    batch_size: int | None = None
    """Override every task's batch size."""
    max_length: int | None = None
    """Override every task's tokens per example."""
    task_budget: str | None = None
    """Wall-clock training budget of one task for one model, e.g. 5m: its seeds share it, each
    run stops at its epochs or its share of the budget, whichever comes first (the LR schedule
    follows the one further along). Default: no budget."""
    max_train_examples: int | None = None
    """Fine-tune on this many rows of each training file (a fixed random sample) to fit a
    smaller budget; the scored file stays whole. Default: all rows."""
    smoke: bool = False
    """A few seconds per task: 48 rows of each file (the scored one included), 2 steps, one seed.
    Checks that everything runs (CI); its numbers mean nothing."""
    dropout: float | None = None
    """Dropout while fine-tuning (None keeps the model's; 0 is several times faster on CPU)."""
    classifier_pooling: ClassifierPooling | None = None
    """A ModernBERT's classification and regression head reads the [CLS] state (cls) or the
    mean of the real tokens' states (mean), as ``finetune --classifier_pooling``; default the
    model's config.json. Other tasks, and BERT models, ignore it."""
    keep_models: bool = False
    """Keep every fine-tuned model; by default its weights are deleted once scored (logs and
    plots stay)."""
    precision: Precision = "auto"
    """auto (bf16 where the hardware is fast at it), bf16 or fp32."""
    device: str = "auto"
    """auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps."""
    num_threads: int | None = None
    """torch CPU threads (default: torch's; 1 on a machine other jobs share)."""
    progress: bool = False
    """Progress bars of the fine-tuning runs (the benchmark prints a line per run either way)."""
    curve: list[str] | None = None
    """Run nothing; draw what pretraining time buys from these finished --suite glue benchmark
    outputs (one per point, e.g. one per snapshot of a run): the GLUE-5 average, STS-B and SST-2
    against pretraining minutes (each scored model's: ``RUN/snapshots/model-15m`` is 15, a final
    ``RUN/model`` its run's --train.max_time), each run's random twin (of its benchmark run with
    --baseline) at minute 0, Google's BERT-Tiny and BERT-Mini as lines; the models of several
    runs (two recipes' snapshots) one line per run, each from its own twin. Writes curve.png, curve.md and curve.json to
    --output (docs/benchmark.md)."""
    curve_minutes: list[float] | None = None
    """With --curve: the pretraining minutes of each benchmark, in the same order (default: read
    from each scored model's run)."""

    def __post_init__(self) -> None:
        check_choice(self.suite, B.Suite, "--suite")
        if self.curve is not None or self.curve_minutes is not None:
            check_curve(self)
            return
        if self.model is None:
            raise BertforgeError(
                "--model DIR: which model to benchmark (or --curve RESULTS_DIR ... to draw "
                "finished benchmarks against pretraining time)"
            )
        self.model = resolve_model(self.model)
        option = lambda name: f"--{name}"  # noqa: E731
        check_at_least(self, option, seeds=1, batch_size=1, max_length=8, num_threads=1)
        check_at_least(self, option, max_train_examples=2)
        check_positive(self, option, "epochs")
        for lr in self.lr or []:
            if not lr > 0:
                raise BertforgeError(f"--lr {lr:g}: a learning rate must be > 0, e.g. 5e-5")
        if self.lr is not None and len(set(self.lr)) != len(self.lr):
            raise BertforgeError(f"--lr {self.lr}: a value repeats; give each once")
        parse_budget(self.task_budget, "--task_budget")
        if self.suite == "embedding":
            known = [t.name for t in EMBEDDING_TASKS]
            unknown = sorted(set(self.tasks or []) - set(known))
            if unknown:
                raise BertforgeError(
                    f"--tasks {' '.join(unknown)}: not in the embedding suite; choose among "
                    + ", ".join(known)
                )
            return
        try:
            B.select_tasks(self.suite, self.tasks)
        except ValueError as err:
            raise BertforgeError(str(err)) from None


CURVE_OPTIONS = ("model", "output", "suite", "name", "curve", "curve_minutes")
"""The options ``--curve`` reads (``--model`` is refused with its own message)."""


def check_curve(cfg: BenchmarkConfig) -> None:
    """``--curve``'s options: benchmark outputs, a minute (0 or more) for each with
    ``--curve_minutes``, the glue suite, no ``--model`` and none of the options of a run."""
    if not cfg.curve:
        raise BertforgeError(
            "--curve_minutes: the minutes of the --curve benchmarks; give them with --curve "
            "RESULTS_DIR ..."
        )
    if cfg.model is not None:
        raise BertforgeError(
            f"--curve draws finished benchmarks, --model {cfg.model} runs one; give one of them"
        )
    if cfg.suite != "glue":
        raise BertforgeError(f"--curve draws --suite glue benchmarks, not {cfg.suite}")
    for f in fields(cfg):  # an option of a benchmark that is not run: refused, not ignored
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if f.name not in CURVE_OPTIONS and getattr(cfg, f.name) != default:
            raise BertforgeError(
                f"--{f.name}: an option of the benchmark run, and --curve runs none (it draws "
                "finished ones); drop it"
            )
    minutes = cfg.curve_minutes
    if minutes is not None and len(minutes) != len(cfg.curve):
        raise BertforgeError(
            f"--curve_minutes gives {len(minutes)} values for {len(cfg.curve)} --curve "
            "benchmarks; give one per benchmark, in the same order"
        )
    if minutes is not None and not all(m >= 0 for m in minutes):
        raise BertforgeError(f"--curve_minutes {minutes}: minutes are 0 or more")


# ---- one task -------------------------------------------------------------------------------


def task_settings(
    cfg: BenchmarkConfig, spec: B.TaskSpec, lr: float | None = None
) -> dict[str, Any]:
    """What a task's numbers depend on: its defaults with the command's overrides (``lr``: one
    value of the --lr grid, else the task's own), the budget, the data sample and the smoke
    mode."""
    d = spec.defaults
    if lr is None and cfg.lr and len(cfg.lr) == 1:
        lr = cfg.lr[0]
    seeds = 1 if cfg.smoke else cfg.seeds or d.seeds
    budget = parse_duration(cfg.task_budget)
    return {
        "epochs": cfg.epochs or d.epochs,
        "lr": lr or d.lr,
        "batch_size": SMOKE["batch_size"] if cfg.smoke else cfg.batch_size or d.batch_size,
        "max_length": (
            SMOKE_QA_LENGTH if spec.kind == "question_answering" else SMOKE["max_length"]
        )
        if cfg.smoke
        else cfg.max_length or d.max_length,
        "seeds": seeds,
        "max_time_per_seed": None if budget is None else round(budget / seeds, 1),
        "max_steps": SMOKE["max_steps"] if cfg.smoke else None,
        "train_rows": SMOKE["train_rows"] if cfg.smoke else cfg.max_train_examples,
        "eval_rows": SMOKE["eval_rows"] if cfg.smoke else None,
        "dropout": cfg.dropout,
        "classifier_pooling": cfg.classifier_pooling,
        "precision": cfg.precision,
    }


def modern_directory(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds a ModernBERT (its config.json's ``model_type``)."""
    return isinstance(load_config(model_dir), ModernBertConfig)


def training_plan(settings: dict[str, Any]) -> str:
    """What one seed's fine-tuning runs, for the line that starts it: ``--smoke``'s step cap (not
    the epochs it never reaches), else the epochs and any time share, then lr, batch and length."""
    if settings["max_steps"] is not None:
        length = plural(settings["max_steps"], "step")
    else:
        epochs = settings["epochs"]
        length = f"{epochs:g} epoch{'' if epochs == 1 else 's'}"
        if settings["max_time_per_seed"]:
            length += f" or {format_duration(settings['max_time_per_seed'])}"
    return (
        f"{length}, lr {settings['lr']:g}, batch {settings['batch_size']}, length "
        f"{settings['max_length']}"
    )


def default_name(model: str) -> str:
    """The name of ``model`` in tables without ``--name``: its folder's, or for a folder named
    ``model`` (where a training run keeps its model) the run's folder's; a time snapshot
    (``RUN/snapshots/model-15m``) is the run's at that time (``RUN at 15m``)."""
    path = Path(model).resolve()
    if snapshot_seconds(path) is not None and path.parent.parent.name:
        return f"{path.parent.parent.name} at {path.name.removeprefix(SNAPSHOT_PREFIX)}"
    return path.parent.name if path.name == RUN_MODEL_DIR and path.parent.name else path.name


def score_sequence_model(
    run_dir: Path,
    eval_file: Path,
    spec: B.TaskSpec,
    settings: dict[str, Any],
    cfg: BenchmarkConfig,
) -> tuple[dict[str, float], int]:
    """The task's metrics of the fine-tuned classifier/regressor in ``run_dir`` on ``eval_file``
    (encoded as fine-tuning encoded its training text), and the number of examples."""
    device = pick_device(cfg.device)
    model = model_class(run_dir, "sequence").from_pretrained(run_dir).to(device)
    tokenizer = Tokenizer.from_file(run_dir)
    regression = spec.kind == "regression"
    data, _ = load_labelled(
        [str(eval_file)],
        text_column=spec.columns["text_column"],
        label_column=spec.columns["label_column"],
        text_pair_column=spec.columns.get("text_pair_column"),
        task=spec.kind,
        label2id=None if regression else model.config.label2id,
    )
    encoded = encode_examples(
        tokenizer, data.texts, data.pairs, max_length=settings["max_length"], truncation="head"
    )
    precision = pick_precision(settings["precision"], device)
    _, predictions = evaluate_sequence_model(
        model, encoded, data.labels, tokenizer.pad_id, batch_size=64, precision=precision
    )
    if regression:
        truth, predicted = list(data.labels), list(predictions)
    else:
        names = class_names(model.config)
        truth = [names[int(i)] for i in data.labels]
        predicted = [names[int(i)] for i in predictions]
    scores = B.sequence_scores(truth, predicted, regression=regression, positive=spec.positive)
    return B.pick(scores, spec), len(truth)


def run_seed(
    cfg: BenchmarkConfig,
    spec: B.TaskSpec,
    model_dir: str,
    files: tuple[Path, Path],
    run_dir: Path,
    seed: int,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """Fine-tune ``model_dir`` on the task with ``seed`` into ``run_dir`` and score it."""
    train, scored = files
    max_time = settings["max_time_per_seed"]
    run_cfg = FinetuneConfig(
        model=model_dir,
        train=[str(train)],
        validation=[str(scored)],
        output=str(run_dir),
        task=spec.kind,  # type: ignore[arg-type]
        **{k: v for k, v in spec.columns.items()},
        epochs=settings["epochs"],
        lr=settings["lr"],
        batch_size=settings["batch_size"],
        max_length=settings["max_length"],
        # run_qa's 128-token stride belongs to 384-token windows: a shorter window (--smoke,
        # --max_length) keeps the same third of it, so the question still fits
        **(
            {"doc_stride": min(128, settings["max_length"] // 3)}
            if spec.kind == "question_answering"
            else {}
        ),
        max_steps=settings["max_steps"],
        max_time=None if max_time is None else f"{max_time}s",
        eval_every=EVALUATE_ONCE,
        seed=seed,
        dropout=settings["dropout"],
        classifier_pooling=(
            settings["classifier_pooling"]
            if spec.kind in ("classification", "regression") and modern_directory(model_dir)
            else None
        ),
        precision=settings["precision"],
        device=cfg.device,
        num_threads=cfg.num_threads,
        progress=cfg.progress,
    )
    run = finetune(run_cfg)
    if run.get("stopped"):
        raise BertforgeError(
            f"fine-tuning {spec.name} (seed {seed}) was interrupted at step {run['step']}; run "
            "the same command again to resume"
        )
    baseline = None
    if spec.kind in ("classification", "regression"):
        scores, examples = score_sequence_model(run_dir, scored, spec, settings, cfg)
    else:  # evaluated once, at the end, on the scored file: its metrics are the test scores
        try:
            scores, examples = B.pick(run["validation"], spec), run["validation"].get("examples")
        except KeyError as err:
            raise BertforgeError(
                f"{err.args[0]}: bertforge finetune --task {spec.kind} reports other metrics; "
                "name them in the suite's TaskSpec (bertforge.evaluation.benchmark)"
            ) from None
        baseline = task_baseline(run.get("baseline"), spec)
    return {
        "seed": seed,
        "scores": scores,
        "examples": examples,
        "steps": run["steps"],
        "epochs": run["epochs"],
        "train_seconds": run["train_seconds"],
        "baseline": baseline,
    }


def task_baseline(base: dict[str, Any] | None, spec: B.TaskSpec) -> dict[str, Any] | None:
    """The baseline fine-tuning scored beside the model on the test file (token classification:
    no entity; question answering: the context's first words), as the baseline column."""
    if not base:
        return None
    scores = B.pick(base, spec)
    return {"label": "baseline", "predicts": base["predicts"], "definition": base["definition"],
            "scores": scores, "score": B.task_score(scores, spec)}  # fmt: skip


def _saved(
    path: Path, settings: dict[str, Any], may_differ: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """A finished result of these settings (or of settings that differ only in ``may_differ``),
    None when there is none; one of other settings is an error naming everything that differs."""
    if not path.is_file():
        return None
    saved = read_json_object(path, "delete it to run that part again")
    old = saved.get("settings") or {}
    if _without(old, may_differ) != _without(settings, may_differ):
        changed = [
            f"{k} was {old.get(k)!r}, now {v!r}" for k, v in settings.items() if old.get(k) != v
        ]
        raise BertforgeError(
            f"{path} holds a result of other settings ({'; '.join(changed)}); choose another "
            "--output, or delete it to run again with these"
        )
    return saved


def _without(settings: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in keys}


def run_grid(
    cfg: BenchmarkConfig,
    spec: B.TaskSpec,
    column: str,
    model_dir: str,
    files: tuple[Path, Path],
    say: Any,
) -> dict[str, Any]:
    """:func:`run_task` at the one learning rate of --lr (or the task's own); with several, at
    each of them (under ``lr-<value>/``), returning the best one's summary with ``grid``: the
    task score of every value (a tie goes to the value given first)."""
    if not cfg.lr or len(cfg.lr) == 1:
        return run_task(cfg, spec, column, model_dir, files, say)
    tried = {
        lr: run_task(cfg, spec, column, model_dir, files, say, lr, f"lr-{lr:g}") for lr in cfg.lr
    }
    best = max(cfg.lr, key=lambda lr: tried[lr]["score"])
    grid = {f"{lr:g}": tried[lr]["score"] for lr in cfg.lr}
    say(
        f"[{spec.name}] {column}: best lr {best:g} of "
        + ", ".join(f"{k} ({100 * v:.1f})" for k, v in grid.items())
    )
    return {**tried[best], "grid": grid}


def run_task(
    cfg: BenchmarkConfig,
    spec: B.TaskSpec,
    column: str,
    model_dir: str,
    files: tuple[Path, Path],
    say: Any,
    lr: float | None = None,
    tag: str | None = None,
) -> dict[str, Any]:
    """All seeds of one task for one column at ``lr`` (None: the task's own), each skipped when
    its result is on disk; the median and the seeds, written to ``results/<column>/<task>.json``
    (``results/<column>/<tag>/...`` and ``runs/<column>/<tag>/...`` with ``tag``)."""
    out = Path(cfg.output)
    settings = task_settings(cfg, spec, lr)
    if column == "random_init":
        settings["init_seed"] = cfg.init_seed
    folder = f"{column}/{tag}" if tag else column
    task_file = out / "results" / folder / f"{spec.name}.json"
    # a seed's result holds for any number of seeds (its time budget share is in the settings):
    # a task done with other --seeds is summed up again from its seeds, run where missing
    seed_settings = _without(settings, ("seeds",))
    done = _saved(task_file, settings, may_differ=("seeds",))
    if done is not None and done["settings"] == settings:
        say(f"[{spec.name}] {column}: done before ({task_file}), skipped")
        return done
    runs = []
    for seed in range(settings["seeds"]):
        seed_file = out / "results" / folder / spec.name / f"seed-{seed}.json"
        result = _saved(seed_file, seed_settings)
        where = f"[{spec.name}] {column} seed {seed + 1}/{settings['seeds']}"
        if result is None:
            say(f"{where}: fine-tuning {model_dir} ({training_plan(settings)})")
            run_dir = out / "runs" / folder / spec.name / f"seed-{seed}"
            result = {
                "settings": seed_settings,
                **run_seed(cfg, spec, model_dir, files, run_dir, seed, settings),
            }
            atomic_write_text(make_parent(seed_file), json.dumps(result, indent=2) + "\n")
            if not cfg.keep_models:  # only now: a rerun before this line scores the model again
                (run_dir / "model.safetensors").unlink(missing_ok=True)
            say(
                f"{where}: {format_scores(result['scores'])} in {format_duration(result['train_seconds'])}"
            )
        else:
            say(f"{where}: done before ({seed_file}), skipped")
        runs.append(result)
    scores = B.median_scores([r["scores"] for r in runs], spec.metrics)
    summary = {
        "settings": settings,
        "scores": scores,
        "score": B.task_score(scores, spec),
        "seeds": [
            {k: r[k] for k in ("seed", "scores", "steps", "epochs", "train_seconds")} for r in runs
        ],
        "examples": runs[0]["examples"],
        "train_seconds": round(sum(r["train_seconds"] for r in runs), 1),
        "baseline": runs[0].get("baseline"),  # the same for every seed: it reads the data only
    }
    atomic_write_text(make_parent(task_file), json.dumps(summary, indent=2) + "\n")
    median = "median of " + str(len(runs)) if len(runs) > 1 else "one seed"
    say(f"[{spec.name}] {column}: {format_scores(scores)} ({median})")
    return summary


def make_parent(path: Path) -> Path:
    make_directory(path.parent)
    return path


def constant_column(spec: B.TaskSpec, files: tuple[Path, Path]) -> dict[str, Any] | None:
    """The constant baseline of a table task (None for the others): see
    :func:`bertforge.evaluation.benchmark.constant_baseline`."""
    if spec.kind not in ("classification", "regression"):
        return None
    label = spec.columns["label_column"]
    train = [row[label] for row in read_table(files[0])[1]]
    scored = [row[label] for row in read_table(files[1])[1]]
    base = B.constant_baseline(train, scored, spec)
    return {**base, "score": B.task_score(base["scores"], spec)}


# ---- the suite --------------------------------------------------------------------------------


def benchmark(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Run (or resume) the suite as configured; write and return results.json's content."""

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if cfg.curve:
        return write_curve(cfg.curve, cfg.output, cfg.curve_minutes, name=cfg.name)
    assert cfg.model is not None  # BenchmarkConfig requires it without --curve
    if cfg.suite == "embedding":
        return embedding_benchmark(cfg, say)
    specs = B.select_tasks(cfg.suite, cfg.tasks)  # names checked by BenchmarkConfig
    first = B.SUITES[cfg.suite][0]
    data_dir = data_directory(cfg.data_dir, cfg.suite, f"{first.folder}/{first.train}")
    files = {
        spec.name: (
            find_file(data_dir, spec.folder, spec.train, "training"),
            find_file(data_dir, spec.folder, spec.evaluate, spec.split),
        )
        for spec in specs
    }
    load_encoder_dir(cfg.model)
    out = make_directory(cfg.output)
    atomic_write_text(out / CONFIG_FILE, json.dumps(asdict(cfg), indent=2) + "\n")
    files = {name: _sampled(cfg, out, name, pair) for name, pair in files.items()}
    columns = {"model": cfg.model}
    if cfg.baseline:
        # made anew each time (seconds): the same seed gives the same weights, another seed
        # another twin, whose results the settings check below keeps apart
        twin = make_random_twin(cfg.model, out / TWIN_DIR, seed=cfg.init_seed)
        say(f"random twin of {cfg.model} (initialisation seed {cfg.init_seed}) -> {twin}")
        columns["random_init"] = str(twin)
    t0 = time.perf_counter()
    tasks: dict[str, dict[str, Any]] = {}
    for i, spec in enumerate(specs, start=1):
        say(f"== task {i}/{len(specs)}: {spec.name} ({spec.split} {', '.join(spec.metrics)})")
        entry: dict[str, Any] = {"metrics": list(spec.metrics), "split": spec.split}
        for column, model_dir in columns.items():
            entry[column] = run_grid(cfg, spec, column, model_dir, files[spec.name], say)
        entry["constant"] = constant_column(spec, files[spec.name]) or entry["model"].get(
            "baseline"
        )
        entry["published"] = B.published_scores(spec)
        entry["examples"] = entry["model"]["examples"]
        tasks[spec.name] = entry
    name = cfg.name or default_name(cfg.model)
    published = any(entry["published"] for entry in tasks.values())
    result = {
        "suite": cfg.suite,
        "model": cfg.model,
        "name": name,
        "smoke": cfg.smoke,
        "data_dir": str(data_dir),
        "tasks": tasks,
        "rows": table_rows(cfg.suite, name, tasks),
        "published_source": B.GOOGLE_SOURCE if published else None,
        "config": asdict(cfg),
    }
    print(write_report(out, result))
    if cfg.smoke:  # the table alone reads as real numbers
        print(f"\n{SMOKE_WARNING}")
    say(f"benchmark finished in {format_duration(time.perf_counter() - t0)}; {out / 'results.md'}")
    return result


def embedding_benchmark(cfg: BenchmarkConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """``--suite embedding``: the model's vectors scored on each task beside constant and random
    vectors (no training); writes results.json, results.md and results.png."""
    data_dir = data_directory(cfg.data_dir, ".", "glue/STS-B/dev.tsv and qa/xquad_en_test.json.gz")
    tasks = [t for t in EMBEDDING_TASKS if not cfg.tasks or t.name in cfg.tasks]
    device = pick_device(cfg.device)
    load_encoder_dir(cfg.model)  # a one-line error for anything that is not a BERT directory
    model = model_class(cfg.model, "encoder").from_pretrained(cfg.model).to(device)
    tokenizer = Tokenizer.from_file(cfg.model)
    positions = model.config.max_position_embeddings
    max_length = cfg.max_length or min(declared_max_length(cfg.model) or positions, positions)
    options = dict(precision=pick_precision(cfg.precision, device), max_length=max_length)
    vectors = model_vectors(model, tokenizer, batch_size=cfg.batch_size or 64, **options)
    out = make_directory(cfg.output)
    atomic_write_text(out / CONFIG_FILE, json.dumps(asdict(cfg), indent=2) + "\n")
    results: dict[str, Any] = {}
    for task in tasks:
        t0 = time.perf_counter()
        data = load_task(data_dir, task)
        whole = len(data)
        if cfg.smoke:
            data = data.subset(np.arange(min(len(data), SMOKE["eval_rows"])))
        entry: dict[str, Any] = score_task(data, task, vectors, model.config.hidden_size)
        entry |= {"examples": len(data), "of": whole}
        if data.kind == "pairs":  # retrieval: the paragraphs the questions search
            entry["documents"] = documents(data)
        results[task.name] = entry
        say(f"{task.name}: {len(data):,} pairs scored in {time.perf_counter() - t0:.1f}s")
    name = cfg.name or Path(cfg.model).resolve().name
    result = {"suite": "embedding", "model": cfg.model, "name": name, "smoke": cfg.smoke,
              "data_dir": str(data_dir), "max_length": max_length, "tasks": results,
              "config": asdict(cfg)}  # fmt: skip
    print(write_suite_report(out, result), end="")
    say(f"max length {max_length} tokens; {out / 'results.md'}")
    return result


def _sampled(
    cfg: BenchmarkConfig, out: Path, name: str, pair: tuple[Path, Path]
) -> tuple[Path, Path]:
    """The task's files, or fixed samples of them (``--smoke``, ``--max_train_examples``) in
    OUTPUT/data/<task>/."""
    train_rows = SMOKE["train_rows"] if cfg.smoke else cfg.max_train_examples
    eval_rows = SMOKE["eval_rows"] if cfg.smoke else None
    train, scored = pair
    if eval_rows:
        scored = sample_file(scored, eval_rows, out / "data" / name, "eval")
    if train_rows:
        train = sample_file(train, train_rows, out / "data" / name, "train", cover=scored)
    return train, scored


__all__ = [
    "CONFIG_FILE", "EVALUATE_ONCE", "SMOKE", "BenchmarkConfig", "benchmark", "check_curve",
    "run_grid", "run_task", "task_settings",
]  # fmt: skip
