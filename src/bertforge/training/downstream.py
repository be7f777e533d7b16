"""``bertforge downstream``: what a pretrained encoder is worth on a labelled task.

The encoder and its *random twin* (the same config and tokenizer, the weights of a fresh
initialisation from a fixed seed, saved in the same layout) are fine-tuned with identical
settings (``FinetuneConfig``: the same seed, so the same head initialisation, validation split and
batch order) and scored on a test file; an optional baseline model (e.g. all-MiniLM-L6-v2) gets
the same treatment. The difference between the first two columns is what pretraining bought.

OUTPUT holds one fine-tuning run per column (``pretrained/``, ``random_init/``, ``baseline/``,
each a ``bertforge finetune`` output), the twin itself (``random_init_model/``) and
``downstream.json``: ``{"pretrained": {...}, "random_init": {...}, ["baseline": {...}], ...}``.

A column that does not beat the *majority baseline* (the training split's most frequent class,
or mean target, predicted for every test example: ``"majority_baseline"``) learned nothing from
the texts; it carries ``"beats_baseline": false``, and a difference against it measures the
fine-tuning settings, not pretraining: the table says so, with the fix.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from bertforge.data.encoding import encode_examples
from bertforge.data.labelled import LabelledData, load_labelled
from bertforge.errors import BertforgeError
from bertforge.evaluation.mlm import random_init_like
from bertforge.evaluation.task_scores import (
    TRAINING_BASELINE,
    baseline_metrics,
    beats_baseline,
    evaluate_sequence_model,
)
from bertforge.io import atomic_write_text
from bertforge.modeling.auto import model_class
from bertforge.modeling.config import CONFIG_NAME, AnyConfig, load_config
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining
from bertforge.modeling.modernbert import ModernBertForMaskedLM
from bertforge.runtime import peak_memory_bytes, pick_device, pick_precision
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import FinetuneConfig
from bertforge.training.finetune import finetune
from bertforge.training.model_card import Score, finetune_card, write_model_card

RESULTS_FILE = "downstream.json"
TWIN_DIR = "random_init_model"
COLUMNS = {"pretrained": "pretrained", "random_init": "random init", "baseline": "baseline"}

# The network a model directory holds, by its config's ``architectures``; anything else (a
# fine-tuned classifier, a sentence-embedding encoder) is twinned as its encoder.
_TWIN_CLASSES: dict[str, type[torch.nn.Module]] = {
    "BertForPreTraining": BertForPreTraining,
    "BertForMaskedLM": BertForMaskedLM,
    "ModernBertForMaskedLM": ModernBertForMaskedLM,
}


def load_encoder_dir(
    directory: str | Path, option: str = "--model"
) -> tuple[torch.nn.Module, Tokenizer]:
    """The network and tokenizer of a BERT or ModernBERT model directory (``BertForPreTraining``,
    ``BertForMaskedLM``, ``ModernBertForMaskedLM`` or else the encoder of its architecture), with a one-line error naming ``option`` for anything
    that is not one."""
    path = Path(directory)
    if not path.is_dir():
        raise BertforgeError(
            f"{option} {directory}: no such directory; pass a BERT model directory"
        )
    if not (path / CONFIG_NAME).is_file():
        raise BertforgeError(
            f"{option} {directory}: no {CONFIG_NAME}, so not a BERT model directory "
            "(a pretraining run keeps its model in RUN/model)"
        )
    config = load_config(path)
    encoder = model_class(config, "encoder")
    cls = next(
        (_TWIN_CLASSES[a] for a in config.architectures or [] if a in _TWIN_CLASSES), encoder
    )
    return cls.from_pretrained(path), Tokenizer.from_file(path)


def make_random_twin(model_dir: str | Path, output: str | Path, seed: int = 0) -> Path:
    """Write the random twin of ``model_dir`` to ``output``: the same class, config and tokenizer,
    the weights of ``torch.manual_seed(seed); cls(config)`` (BERT's initialisation)."""
    model, tokenizer = load_encoder_dir(model_dir)
    return random_init_like(model, seed=seed).save_pretrained(output, tokenizer=tokenizer)


def score_on_file(
    model_dir: str | Path, test: Sequence[str], cfg: FinetuneConfig
) -> dict[str, Any]:
    """Test metrics of a fine-tuned model on labelled file(s), read with the fine-tuning columns
    and the model's own label ids, encoded the way fine-tuning encoded its training text
    (``cfg.max_length``, ``cfg.truncation``)."""
    device = pick_device(cfg.device)
    model = model_class(model_dir, "sequence").from_pretrained(model_dir).to(device)
    tokenizer = Tokenizer.from_file(model_dir)
    data = read_test(cfg, test, model.config)
    encoded = encode_examples(
        tokenizer, data.texts, data.pairs, max_length=cfg.max_length, truncation=cfg.truncation
    )
    metrics, _ = evaluate_sequence_model(
        model,
        encoded,
        data.labels,
        tokenizer.pad_id,
        batch_size=cfg.eval_batch_size,
        precision=pick_precision(cfg.precision, device, model.config.hidden_size),
    )
    return metrics


def majority_on_file(
    model_dir: str | Path, test: Sequence[str], cfg: FinetuneConfig, predicts: Any
) -> dict[str, Any]:
    """The test metrics of predicting ``predicts`` (the training baseline a fine-tuning run
    reported: a class name, or the mean target) for every test example."""
    config = load_config(model_dir)
    regression = config.is_regression
    data = read_test(cfg, test, config)
    value = float(predicts) if regression else config.label2id[str(predicts)]
    kind = "regression" if regression else "classification"
    return {
        "predicts": predicts,
        "definition": TRAINING_BASELINE[kind],
        **baseline_metrics(config, data.labels, value),
    }


def train_labels(cfg: FinetuneConfig) -> dict[str, int] | None:
    """The label map fine-tuning will build from ``cfg.train`` (None for regression): read
    before any training, so a test label it lacks fails at once, not after every column."""
    if cfg.task != "classification":
        return None
    _, id2label = load_labelled(
        list(cfg.train),
        text_column=cfg.text_column,
        label_column=cfg.label_column,
        text_pair_column=cfg.text_pair_column,
        task=cfg.task,
        allow_rare_labels=cfg.allow_rare_labels,
        encoding_errors=cfg.encoding_errors,
    )
    return {name: i for i, name in (id2label or {}).items()}


def read_test(
    cfg: FinetuneConfig,
    test: Sequence[str],
    config: AnyConfig | None = None,
    label2id: dict[str, int] | None = None,
) -> LabelledData:
    """The test file(s), read with the fine-tuning columns; fails before any training if a column
    is missing or a label is empty, or (with ``label2id``, :func:`train_labels`) a label the
    training file lacks. With a trained model's ``config``, labels become its ids."""
    if config is not None:
        label2id = None if config.is_regression else config.label2id
    data, _ = load_labelled(
        list(test),
        text_column=cfg.text_column,
        label_column=cfg.label_column,
        text_pair_column=cfg.text_pair_column,
        task=cfg.task,
        encoding_errors=cfg.encoding_errors,
        label2id=label2id,
    )
    if not len(data):
        raise BertforgeError(f"--test {', '.join(test)}: no rows; pass a labelled test file")
    return data


def downstream(
    cfg: FinetuneConfig,
    test: Sequence[str],
    *,
    baseline: str | None = None,
    init_seed: int = 0,
) -> dict[str, Any]:
    """Fine-tune ``cfg.model``, its random twin and optionally ``baseline`` with the settings of
    ``cfg`` (each into ``cfg.output/<column>``) and score all on ``test``; write and return the
    side-by-side results (see the module docstring)."""
    out = Path(cfg.output)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    read_test(cfg, test, label2id=train_labels(cfg))  # bad input fails here, before training
    load_encoder_dir(cfg.model)
    if baseline is not None:
        load_encoder_dir(baseline, option="--baseline")
    twin = out / TWIN_DIR
    make_random_twin(cfg.model, twin, seed=init_seed)
    say(f"random twin of {cfg.model} (initialisation seed {init_seed}) -> {twin}")

    sources = {"pretrained": cfg.model, "random_init": str(twin)}
    if baseline is not None:
        sources["baseline"] = baseline
    columns: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    majority: dict[str, Any] | None = None
    for name, model_dir in sources.items():
        say(f"== {COLUMNS[name]}: fine-tuning {model_dir}")
        run = runs[name] = finetune(replace(cfg, model=model_dir, output=str(out / name)))
        if run.get("stopped"):
            raise BertforgeError(
                f"fine-tuning {name} was interrupted at step {run['step']}; run the same "
                "command again to resume"
            )
        metrics = score_on_file(out / name, test, cfg)
        if majority is None:  # the same training split, so the same for every column
            majority = majority_on_file(out / name, test, cfg, run["baseline"]["predicts"])
        columns[name] = {
            "model": model_dir,
            **metrics,
            "validation": {k: run["validation"][k] for k in _metric_keys(cfg)},
            "steps": run["steps"],
            "best_step": run["best_step"],
            "train_seconds": run["train_seconds"],
            "beats_baseline": beats_baseline(cfg.metric, metrics[cfg.metric], majority[cfg.metric]),
        }
    result = {
        "task": cfg.task,
        "test": list(test),
        "init_seed": init_seed,
        "metric": cfg.metric,
        "majority_baseline": majority,
        **columns,
        "difference": {
            k: columns["pretrained"][k] - columns["random_init"][k] for k in _metric_keys(cfg)
        },
        "finetune": {k: v for k, v in asdict(cfg).items() if k not in ("model", "output")},
        "peak_memory_bytes": peak_memory_bytes(),
    }
    atomic_write_text(out / RESULTS_FILE, json.dumps(result, indent=2) + "\n")
    write_twin_card(cfg, out, test, runs["pretrained"], columns, majority or {})
    print(downstream_table(result))
    say(f"results: {out / RESULTS_FILE}")
    return result


def write_twin_card(
    cfg: FinetuneConfig,
    out: Path,
    test: Sequence[str],
    run: dict[str, Any],
    columns: dict[str, dict[str, Any]],
    majority: dict[str, Any],
) -> None:
    """The fine-tuned pretrained model's card, its test scores beside the random-init twin's
    (fine-tuned the same way) and the majority baseline's."""
    directory = out / "pretrained"
    card = finetune_card(
        replace(cfg, output=str(directory)), run, directory, pick_device(cfg.device)
    )
    twin = "random-init twin (fine-tuned the same way)"
    scores = [
        Score(k, columns["pretrained"][k], {twin: columns["random_init"][k]})
        for k in _metric_keys(cfg)
    ]
    for s in scores:
        if isinstance(majority.get(s.metric), int | float):
            s.baselines["majority baseline"] = float(majority[s.metric])
    where = "the test file(s) " + ", ".join(f"`{Path(t).name}`" for t in test)
    card.more_results.append((where, scores))
    write_model_card(directory, card)


def _metric_keys(cfg: FinetuneConfig) -> tuple[str, ...]:
    if cfg.task == "regression":
        return ("spearman", "pearson", "mse", "mae")
    return ("accuracy", "macro_f1", "mcc")


_ROWS = {
    "accuracy": "accuracy",
    "macro_f1": "macro-F1",
    "mcc": "MCC",
    "spearman": "Spearman",
    "pearson": "Pearson",
    "mse": "MSE",
    "mae": "MAE",
}


def _beats(result: dict[str, Any], name: str) -> bool:
    return result[name].get("beats_baseline", True)


def downstream_table(result: dict[str, Any]) -> str:
    """The side-by-side table of a ``downstream`` result (test metrics, then the run facts)."""
    names = [n for n in COLUMNS if n in result]
    keys = [k for k in _ROWS if k in result["pretrained"]]
    examples = result["pretrained"]["examples"]
    width = max(13, *(len(COLUMNS[n]) for n in names))
    lines = [
        f"test: {', '.join(result['test'])} ({examples:,} examples)",
        f"{'':<22}" + "".join(f"{COLUMNS[n]:>{width + 2}}" for n in names),
    ]
    for key in keys:
        cells = "".join(f"{result[n][key]:>{width + 2}.4f}" for n in names)
        lines.append(f"{_ROWS[key]:<22}{cells}")
    for label, key, fmt in (
        ("fine-tuning steps", "steps", "{:,}"),
        ("best step", "best_step", "{}"),
        ("training time (s)", "train_seconds", "{:,.0f}"),
    ):
        cells = "".join(f"{fmt.format(result[n][key]):>{width + 2}}" for n in names)
        lines.append(f"{label:<22}{cells}")
    majority = result.get("majority_baseline")  # absent from results written before it
    if majority is not None:
        metric = result.get("metric", keys[0])
        cells = "".join(
            f"{'yes' if result[n]['beats_baseline'] else 'NO':>{width + 2}}" for n in names
        )
        lines.append(f"{'beats majority baseline':<22}{cells}")
        lines.append(
            f"majority baseline (always {majority['predicts']!r}, {majority['definition']}): "
            f"{_ROWS[metric]} {majority[metric]:.4f}"
        )
    first = keys[0]
    diff = result["difference"][first]
    scale, unit = (100, " points") if first == "accuracy" else (1, "")
    if math.isfinite(diff):
        lines.append(
            f"pretraining vs random init: {_ROWS[first]} {diff * scale:+.2f}{unit}"
            + (" (lower is better)" if first in ("mse", "mae") else "")
        )
    failed = [COLUMNS[n] for n in ("pretrained", "random_init") if not _beats(result, n)]
    if failed:
        lines.append(
            f"  NOT a fair comparison: {' and '.join(failed)} did not beat the majority baseline "
            "(the model learned nothing from the texts), so the difference measures the "
            "fine-tuning settings, not pretraining; run again with a higher --lr (e.g. 1e-3) "
            "or more --epochs until both columns beat it"
        )
    return "\n".join(lines)


__all__ = [
    "RESULTS_FILE",
    "TWIN_DIR",
    "downstream",
    "downstream_table",
    "load_encoder_dir",
    "majority_on_file",
    "make_random_twin",
    "read_test",
    "score_on_file",
]
