"""Masked-language-model evaluation: the metrics the pretraining loop uses (``evaluate_mlm``), the
random-init baseline and the "random init vs trained" table, and MLM batches from a text file.
The fine-tuned-task metrics are in ``bertforge.evaluation.task_scores``; the ``bertforge evaluate``
command is ``bertforge.training.evaluate.evaluate``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertforge.data.corpus import read_documents
from bertforge.data.encoding import check_max_length
from bertforge.data.instances import InstanceBuilder
from bertforge.data.loader import VALIDATION_EPOCH, PretrainingCollator
from bertforge.distributed import all_reduce_sum
from bertforge.errors import BertforgeError
from bertforge.modeling.model import IGNORE_INDEX, contrastive_loss
from bertforge.progress import item_bar
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
    progress: bool = False,
    desc: str = "evaluate",
) -> dict[str, float | int | str | None]:
    """MLM loss (mean cross-entropy per masked token, nats), perplexity, masked-token top-1 and
    top-5 accuracy and, for a model with an NSP head and batches with ``next_sentence_label``,
    next-sentence accuracy; for an ELECTRA model (objective rtd) the MLM numbers are its
    generator's and ``rtd_accuracy`` is the share of real tokens its discriminator labels right
    (replaced or original); for batches with ``partner`` (objective mlm_contrastive)
    ``contrastive_accuracy`` is the share of rows whose pooled output is closest to its partner's
    among the batch.

    ``batches`` yield dicts with ``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels``
    (-100 where not masked) and optionally ``next_sentence_label``. ``model`` is a
    ``BertForPreTraining`` or ``BertForMaskedLM`` (the plain module, not a DDP wrapper). Returns
    ``loss, perplexity, accuracy, top5_accuracy, nsp_accuracy`` (None without NSP),
    ``nsp_majority`` (the accuracy of always guessing the more frequent NSP label, the baseline),
    ``tokens`` (masked tokens scored) and ``sequences``. With ``reduce_across_ranks`` the sums are
    all-reduced first, so every rank returns the metrics of the whole (sharded) evaluation set.
    NSP pairs that are all IsNext (or all NotNext) say nothing about the NSP head: then
    ``nsp_accuracy`` is None and ``nsp_note`` says why. ``progress`` draws a bar over the batches
    on a terminal's stderr.
    """

    was_training = model.training
    model.eval()
    sums = dict.fromkeys(SUMS, 0.0)
    total = len(batches) if hasattr(batches, "__len__") else None
    bar = item_bar(total, desc, enabled=progress, unit=" batches")
    try:
        for batch in batches:
            bar.update(1)
            for name, value in batch_sums(model, batch, device, precision).items():
                sums[name] += value
    finally:
        bar.close()
        model.train(was_training)
    if reduce_across_ranks:
        summed = all_reduce_sum(torch.tensor([sums[name] for name in SUMS], dtype=torch.float64))
        sums = dict(zip(SUMS, summed.tolist(), strict=True))
    return mlm_metrics(sums)


SUMS = (
    "loss",
    "top1",
    "top5",
    "tokens",
    "nsp_correct",
    "nsp_pairs",
    "not_next",
    "rtd_correct",
    "rtd_tokens",
    "contrastive_hits",
    "contrastive_rows",
    "sequences",
)
"""What :func:`evaluate_mlm` sums over its batches (and ranks), by name: the masked tokens'
cross-entropy and top-1/top-5 hits, NSP hits over labelled pairs (and the NotNext ones among
them), the discriminator's right calls over real tokens, rows that found their partner."""


def batch_sums(
    model: nn.Module, batch: Mapping[str, Tensor], device: torch.device, precision: str
) -> dict[str, float]:
    """One batch's contribution to :data:`SUMS`, from each head the model and the batch have."""
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, Tensor)}
    labels = batch["labels"]
    nsp_labels = batch.get("next_sentence_label")
    has_nsp = nsp_labels is not None and hasattr(getattr(model, "cls", None), "seq_relationship")
    kwargs = {"next_sentence_label": nsp_labels} if has_nsp else {}
    with autocast(device, precision):
        out = model(
            batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            token_type_ids=batch.get("token_type_ids"),
            labels=labels,
            **kwargs,
        )
    sums = _masked_lm_sums(out, labels)
    if has_nsp:
        valid = nsp_labels >= 0
        pred = out.seq_relationship_logits.argmax(-1)  # (B,)
        sums["nsp_correct"] = (pred[valid] == nsp_labels[valid]).sum().item()
        sums["nsp_pairs"] = valid.sum().item()
        sums["not_next"] = (nsp_labels[valid] == 1).sum().item()
    if getattr(out, "rtd_tokens", None) is not None:  # an ELECTRA discriminator
        sums["rtd_correct"] = out.rtd_correct.item()
        sums["rtd_tokens"] = out.rtd_tokens.item()
    partner = batch.get("partner")
    if partner is not None and getattr(out, "pooler_output", None) is not None:
        _, hits = contrastive_loss(out.pooler_output, partner, 1.0)
        sums["contrastive_hits"] = float(hits)
        sums["contrastive_rows"] = float((partner >= 0).sum())
    sums["sequences"] = int(batch["input_ids"].shape[0])
    return sums


def _masked_lm_sums(out: Any, labels: Tensor) -> dict[str, float]:
    """The masked tokens' summed cross-entropy, top-1 and top-5 hits and their number."""
    # with labels given, the logits are sparse (n_masked, V) and the loss is their mean CE
    logits = getattr(out, "prediction_logits", None)
    mlm_loss = getattr(out, "mlm_loss", None) if logits is not None else out.loss
    if logits is None:
        logits = out.logits
    target = labels[labels != IGNORE_INDEX]  # (n_masked,)
    logits = logits.float()
    sums = {}
    if target.numel():  # the mean over no masked token is NaN: add nothing
        sums["loss"] = mlm_loss.float().item() * target.numel()
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (n_masked, 5)
    sums["top1"] = (top5[:, 0] == target).sum().item()
    sums["top5"] = (top5 == target[:, None]).any(-1).sum().item()
    sums["tokens"] = target.numel()
    return sums


def mlm_metrics(sums: Mapping[str, float]) -> dict[str, float | int | str | None]:
    """:func:`evaluate_mlm`'s metrics from the :data:`SUMS` of a whole evaluation set."""
    tokens = int(sums["tokens"])
    if tokens == 0:
        raise ValueError(
            "evaluate_mlm: no masked token in the evaluation batches; check the labels"
        )
    loss = sums["loss"] / tokens
    nsp_pairs, not_next = int(sums["nsp_pairs"]), int(sums["not_next"])
    one_sided = nsp_pairs > 0 and not_next in (0, nsp_pairs)
    nsp = sums["nsp_correct"] / sums["nsp_pairs"] if nsp_pairs > 0 and not one_sided else None
    result: dict[str, float | int | str | None] = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "accuracy": sums["top1"] / tokens,
        "top5_accuracy": sums["top5"] / tokens,
        "nsp_accuracy": nsp,
        # always guessing the evaluation set's more frequent NSP label: what nsp_accuracy must beat
        "nsp_majority": max(not_next, nsp_pairs - not_next) / nsp_pairs
        if nsp is not None
        else None,
        "rtd_accuracy": sums["rtd_correct"] / sums["rtd_tokens"] if sums["rtd_tokens"] else None,
        "contrastive_accuracy": (
            sums["contrastive_hits"] / sums["contrastive_rows"]
            if sums["contrastive_rows"]
            else None
        ),
        "tokens": tokens,
        "sequences": int(sums["sequences"]),
    }
    if one_sided:
        result["nsp_note"] = "no NotNext pairs" if not_next == 0 else "no IsNext pairs"
    return result


def random_init_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """A freshly initialised network of the same class and config (the untrained baseline)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        fresh = type(model)(model.config)
    finally:
        torch.random.set_rng_state(state)  # do not perturb the caller's random stream
    return fresh.to(next(model.parameters()).device)


def frequency_guesser(batches: Sequence[Mapping[str, Tensor]]) -> dict[str, Any]:
    """The best a guesser without context can do on these masked tokens: each predicted from
    the masked tokens' own frequencies (so a lower bound on what it would score with the
    training text's): loss is their entropy in nats; accuracy and top-5 accuracy always guess
    the most frequent token(s). What a model must beat to have learned more than word counts."""
    labels = torch.cat([batch["labels"].reshape(-1) for batch in batches])
    counts = torch.bincount(labels[labels >= 0]).double()
    counts = counts[counts > 0].sort(descending=True).values
    n = float(counts.sum())
    if not n:
        return {}
    loss = float(-(counts * (counts / n).log()).sum() / n)
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "accuracy": float(counts[0]) / n,
        "top5_accuracy": float(counts[:5].sum()) / n,
        "tokens": int(n),
    }


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
        ("NSP majority class", "nsp_majority", "{:.2%}"),  # the NSP score to beat
        ("replaced-token accuracy", "rtd_accuracy", "{:.2%}"),
        ("same-document accuracy", "contrastive_accuracy", "{:.2%}"),
        ("masked tokens scored", "tokens", "{:,}"),
    ]
    width = max(12, *(len(n) for n in names))
    lines = []
    if title:
        lines.append(title)
    lines.append(f"{'':<28}" + "".join(f"{n:>{width + 2}}" for n in names))
    notes = {"nsp_accuracy": "nsp_note"}  # why a value is missing, shown instead of "-"
    for label, key, fmt in rows:
        values = [columns[n].get(key) for n in names]
        why = [columns[n].get(notes.get(key, "")) for n in names]
        if all(v is None for v in values) and not any(why):
            continue
        shown = [
            fmt.format(v) if v is not None else "n/a" if w else "-"
            for v, w in zip(values, why, strict=True)
        ]
        reasons = sorted({w for w in why if w})
        note = f"  ({'; '.join(reasons)}: the score would say nothing)" if reasons else ""
        lines.append(f"{label:<28}" + "".join(f"{c:>{width + 2}}" for c in shown) + note)
    return "\n".join(lines)


# ---- fine-tuned models: task metrics ---------------------------------------------------------


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
    encoding_errors: str = "strict",
) -> list[dict[str, Tensor]]:
    """A text file as packed ``[CLS] ... [SEP]`` sequences with fixed 80/10/10 masks (MLM only).

    Uses the pretraining pipeline (documents -> sentences -> ``InstanceBuilder``'s packed
    sequences -> masking collator with the validation epoch), so the numbers compare with
    pretraining's.
    """

    # 8: the shortest sequences bertforge prepare makes
    check_max_length(max_seq_length, 8, "an MLM's shortest sequences; the default is 128")
    if max_sequences is not None and max_sequences < 1:
        raise BertforgeError(f"--max_sequences {max_sequences} must be at least 1")
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
    for doc in read_documents(path, text_column=text_column, encoding_errors=encoding_errors):
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
    "comparison_table",
    "frequency_guesser",
    "evaluate_mlm",
    "mlm_text_batches",
    "random_init_like",
]
