"""Evaluation. The top of this file holds the masked-language-model metrics the pretraining loop
uses (``evaluate_mlm``, the random-init baseline and the "random init vs trained" table); the
fine-tuned-task metrics, report and plot follow, then MLM batches from a text file. The
``bertforge evaluate`` command is ``bertforge.commands.evaluate``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge import metrics as M
from bertforge.errors import BertforgeError
from bertforge.model import IGNORE_INDEX
from bertforge.runtime import autocast

# ---- masked-language-model metrics ---------------------------------------------------------


@torch.inference_mode()
def evaluate_mlm(
    model: nn.Module,
    batches: Iterable[Mapping[str, Tensor]],
    device: torch.device,
    precision: str = "fp32",
    *,
    reduce_across_ranks: bool = False,
) -> dict[str, float | int | None]:
    """MLM loss (mean cross-entropy per masked token, nats), perplexity, masked-token top-1 and
    top-5 accuracy and, for a model with an NSP head and batches with ``next_sentence_label``,
    next-sentence accuracy.

    ``batches`` yield dicts with ``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels``
    (-100 where not masked) and optionally ``next_sentence_label``. ``model`` is a
    ``BertForPreTraining`` or ``BertForMaskedLM`` (the plain module, not a DDP wrapper). Returns
    ``loss, perplexity, accuracy, top5_accuracy, nsp_accuracy`` (None without NSP),
    ``tokens`` (masked tokens scored) and ``sequences``. With ``reduce_across_ranks`` the sums are
    all-reduced first, so every rank returns the metrics of the whole (sharded) evaluation set.
    """
    was_training = model.training
    model.eval()
    sums = torch.zeros(6, dtype=torch.float64)  # loss, top1, top5, tokens, nsp correct, nsp count
    sequences = 0
    try:
        for batch in batches:
            batch = {
                k: v.to(device, non_blocking=True)
                for k, v in batch.items()
                if isinstance(v, Tensor)
            }
            labels = batch["labels"]
            kwargs = {}
            nsp_labels = batch.get("next_sentence_label")
            has_nsp = nsp_labels is not None and hasattr(
                getattr(model, "cls", None), "seq_relationship"
            )
            if has_nsp:
                kwargs["next_sentence_label"] = nsp_labels
            with autocast(device, precision):
                out = model(
                    batch["input_ids"],
                    attention_mask=batch.get("attention_mask"),
                    token_type_ids=batch.get("token_type_ids"),
                    labels=labels,
                    **kwargs,
                )
            # with labels given, the logits are sparse (n_masked, V) and the loss is their mean CE
            logits = getattr(out, "prediction_logits", None)
            mlm_loss = getattr(out, "mlm_loss", None) if logits is not None else out.loss
            if logits is None:
                logits = out.logits
            target = labels[labels != IGNORE_INDEX]  # (n_masked,)
            logits = logits.float()
            if target.numel():  # the mean over no masked token is NaN: add nothing
                sums[0] += mlm_loss.float().item() * target.numel()
            top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (n_masked, 5)
            sums[1] += (top5[:, 0] == target).sum().item()
            sums[2] += (top5 == target[:, None]).any(-1).sum().item()
            sums[3] += target.numel()
            if has_nsp:
                valid = nsp_labels >= 0
                pred = out.seq_relationship_logits.argmax(-1)  # (B,)
                sums[4] += (pred[valid] == nsp_labels[valid]).sum().item()
                sums[5] += valid.sum().item()
            sequences += int(batch["input_ids"].shape[0])
    finally:
        model.train(was_training)
    if reduce_across_ranks:
        from bertforge.distributed import all_reduce_sum

        sums = all_reduce_sum(
            torch.cat([sums, torch.tensor([float(sequences)], dtype=torch.float64)])
        )
        sequences = int(sums[6].item())
        sums = sums[:6]
    tokens = int(sums[3].item())
    if tokens == 0:
        raise ValueError(
            "evaluate_mlm: no masked token in the evaluation batches; check the labels"
        )
    loss = float(sums[0] / tokens)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "accuracy": float(sums[1] / tokens),
        "top5_accuracy": float(sums[2] / tokens),
        "nsp_accuracy": float(sums[4] / sums[5]) if sums[5] > 0 else None,
        "tokens": tokens,
        "sequences": sequences,
    }


def random_init_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """A freshly initialised network of the same class and config (the untrained baseline)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        fresh = type(model)(model.config)
    finally:
        torch.random.set_rng_state(state)  # do not perturb the caller's random stream
    return fresh.to(next(model.parameters()).device)


def comparison_table(columns: Mapping[str, Mapping[str, Any]], title: str | None = None) -> str:
    """A plain-text table of MLM metrics, one column per run, e.g.
    ``{"random init": m0, "trained": m1}``; rows without a value anywhere are left out."""
    names = list(columns)
    rows = [
        ("MLM loss (nats)", "loss", "{:.3f}"),
        ("perplexity", "perplexity", "{:,.1f}"),
        ("masked-token accuracy", "accuracy", "{:.2%}"),
        ("masked-token top-5 accuracy", "top5_accuracy", "{:.2%}"),
        ("NSP accuracy", "nsp_accuracy", "{:.2%}"),
        ("masked tokens scored", "tokens", "{:,}"),
    ]
    width = max(12, *(len(n) for n in names))
    lines = []
    if title:
        lines.append(title)
    lines.append(f"{'':<28}" + "".join(f"{n:>{width + 2}}" for n in names))
    for label, key, fmt in rows:
        values = [columns[n].get(key) for n in names]
        if all(v is None for v in values):
            continue
        cells = "".join(f"{'-' if v is None else fmt.format(v):>{width + 2}}" for v in values)
        lines.append(f"{label:<28}{cells}")
    return "\n".join(lines)


# ---- fine-tuned models: task metrics ---------------------------------------------------------

HIGHER_IS_BETTER = {
    "accuracy": True,
    "macro_f1": True,
    "mcc": True,
    "spearman": True,
    "pearson": True,
    "mse": False,
    "mae": False,
    "loss": False,
}
"""Direction of each validation metric (which way is an improvement)."""


def evaluate_sequence_model(
    model: nn.Module,
    encoded: Sequence[tuple[np.ndarray, int]],
    labels: np.ndarray,
    pad_id: int,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    scale: Sequence[float] | None = None,
) -> tuple[dict[str, float], np.ndarray]:
    """Metrics of a ``BertForSequenceClassification`` on encoded examples, and its predictions.

    Classification: ``loss`` (mean cross-entropy), ``accuracy``, ``macro_f1``, ``mcc``; the
    predictions are class ids. Regression: ``loss`` plus ``mse``, ``mae``, ``pearson``,
    ``spearman`` in the labels' units; with ``scale = (mean, std)`` the model's outputs are
    z-scores (as while training on normalised targets), ``loss`` is their MSE and predictions are
    mapped back to ``z * std + mean``.
    """
    from bertforge.predict import sequence_logits

    logits = sequence_logits(model, encoded, pad_id, batch_size=batch_size, precision=precision)
    if model.config.is_regression:
        raw = logits[:, 0].astype(np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if scale is not None:
            mean, std = scale
            loss = float(np.mean((raw - (y - mean) / std) ** 2))
            predictions = raw * std + mean
        else:
            predictions = raw
            loss = M.mse(y, predictions)
        return {
            "loss": loss,
            **M.regression_metrics(y, predictions),
            "examples": len(y),
        }, predictions
    target = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    loss = float(F.cross_entropy(torch.from_numpy(logits), target))
    predictions = logits.argmax(-1)
    metrics = M.classification_metrics(labels, predictions, model.config.num_labels)
    return {"loss": loss, **metrics, "examples": len(labels)}, predictions


def class_names(config: Any) -> list[str]:
    """The class names of a classifier's config in id order (``"0"``, ``"1"``, ... without
    ``id2label``)."""
    if config.id2label:
        return [config.id2label[i] for i in range(config.num_labels)]
    return [str(i) for i in range(config.num_labels)]


def task_report(
    config: Any,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    baseline_value: Any = None,
    *,
    plot: str | Path | None = None,
    plot_title: str | None = None,
) -> dict[str, Any]:
    """The per-class report (classification) and a trivial baseline for comparison: the majority
    class, or for regression ``baseline_value`` (e.g. the training mean) predicted for every
    example (its correlations are 0 by definition). With ``plot`` (a PNG path) the
    :func:`save_task_plot` goes there too."""
    y_true = np.asarray(y_true)
    if plot is not None:
        save_task_plot(config, y_true, y_pred, plot, title=plot_title)
    if config.is_regression:
        value = float(y_true.mean()) if baseline_value is None else float(baseline_value)
        base = M.regression_metrics(y_true, np.full(y_true.shape, value))
        return {"baseline": {"predicts": value, **base}}
    names = class_names(config)
    report = M.per_class_report(y_true, y_pred, names)
    majority = int(np.bincount(y_true.astype(np.int64), minlength=len(names)).argmax())
    base = M.classification_metrics(y_true, np.full(y_true.shape, majority), len(names))
    metrics = M.classification_metrics(y_true, y_pred, len(names))
    return {
        "per_class": report,
        "report_text": M.format_report(report, metrics),
        "confusion_matrix": M.confusion_matrix(y_true, y_pred, len(names)).tolist(),
        "baseline": {"predicts": names[majority], **base},
    }


def task_plot_name(config: Any) -> str:
    """File name of the task plot: ``predicted_vs_true.png`` or ``confusion_matrix.png``."""
    return "predicted_vs_true.png" if config.is_regression else "confusion_matrix.png"


def save_task_plot(
    config: Any,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    output: str | Path,
    title: str | None = None,
) -> Path:
    """A confusion matrix (classification) or predicted-vs-true scatter (regression) PNG."""
    from bertforge.plots import plot_confusion_matrix, plot_regression_scatter

    if config.is_regression:
        return plot_regression_scatter(y_true, y_pred, output, title)
    names = class_names(config)
    cm = M.confusion_matrix(y_true, y_pred, len(names))
    return plot_confusion_matrix(cm, names, output, title)


# ---- masked-language models on a text file ---------------------------------------------------


def mlm_text_batches(
    tokenizer: Any,
    path: str | Path,
    *,
    max_seq_length: int = 128,
    batch_size: int = 32,
    mlm_probability: float = 0.15,
    seed: int = 0,
    text_column: str | None = None,
    max_sequences: int | None = None,
) -> list[dict[str, Tensor]]:
    """A text file as packed ``[CLS] ... [SEP]`` sequences with fixed 80/10/10 masks (MLM only).

    Uses the pretraining pipeline (documents -> sentences -> ``InstanceBuilder``'s packed
    sequences -> masking collator with the validation epoch), so the numbers compare with
    pretraining's.
    """
    from bertforge.data.corpus import read_documents
    from bertforge.data.instances import InstanceBuilder
    from bertforge.data.loader import VALIDATION_EPOCH, PretrainingCollator

    if max_seq_length < 8:  # the shortest sequences bertforge prepare makes
        raise BertforgeError(
            f"--max-length {max_seq_length}: use at least 8 for an MLM (default 128)"
        )
    if max_sequences is not None and max_sequences < 1:
        raise BertforgeError(f"--max-sequences {max_sequences} must be at least 1")
    instances: list[Any] = []
    builder = InstanceBuilder(  # packed mode: no NSP, so no randomness and no short sequences
        tokenizer,
        instances.extend,
        "packed",
        max_seq_length,
        short_seq_prob=0.0,
        rng=np.random.default_rng(seed),
        stats={},
        chunk_chars=100_000,
    )
    for doc in read_documents(path, text_column=text_column):
        builder.add(list(doc))
        if max_sequences is not None and len(instances) >= max_sequences:
            break
    builder.finish()
    instances = instances[:max_sequences]
    if not instances:
        raise BertforgeError(f"{path}: no text to evaluate on (the file is empty)")
    examples = [
        {
            "input_ids": np.concatenate([[tokenizer.cls_id], inst.tokens_a, [tokenizer.sep_id]]),
            "token_type_ids": np.zeros(len(inst.tokens_a) + 2, dtype=np.int64),
        }
        for inst in instances
    ]
    collator = PretrainingCollator(tokenizer, mlm_probability=mlm_probability, seed=seed)
    return [
        collator(
            examples[i : i + batch_size],
            list(range(i, min(i + batch_size, len(examples)))),
            VALIDATION_EPOCH,
        )
        for i in range(0, len(examples), batch_size)
    ]


__all__ = [
    "HIGHER_IS_BETTER",
    "class_names",
    "comparison_table",
    "evaluate_mlm",
    "evaluate_sequence_model",
    "mlm_text_batches",
    "random_init_like",
    "save_task_plot",
    "task_plot_name",
    "task_report",
]
