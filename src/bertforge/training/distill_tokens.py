"""Token classification in ``bertforge distill``: per-word soft targets (docs/distillation.md).

Teacher and student each split the sentences' words into pieces with their own tokenizer; the
soft and the gold terms sit on each word's first piece under the student's tokenizer, against
the teacher's logits at that word's first piece under its own (the ``run_ner`` convention of
``finetune``: a word's label is on its first piece). With the same tokenizer that is every
labelled position; with another vocabulary the two models still meet word by word, whatever
pieces each makes of a word. A word that one tokenizer gives no pieces (only control
characters) has no target.

The teacher's outputs are one row per word (:func:`~bertforge.training.teacher.
token_teacher_outputs`): float16, ``C x 2`` bytes a word, where a (texts, T, C) float32 cache
would hold ``T x C x 4`` bytes a text, padding and later pieces included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.labelled import random_split
from bertforge.data.tagging import IGNORE, TaggedData, Windows, encode_tagged, read_tagged, tag_ids
from bertforge.errors import BertforgeError
from bertforge.evaluation.tagging import evaluate_tagging_model, tag_metrics
from bertforge.progress import count_progress
from bertforge.runtime import explain_precision
from bertforge.training.distill_config import DistillConfig
from bertforge.training.teacher import Teacher, token_teacher_outputs, word_offsets


@dataclass
class TokenDistillData:
    """Training (gold, then transfer) and validation sentences, encoded for the student as
    windows, with the teacher's word-aligned logits of both."""

    train: TaggedData
    val: TaggedData
    windows: Windows
    """The training sentences' windows under the student's tokenizer (the loop's units)."""
    val_windows: Windows
    val_tags: list[np.ndarray]
    labelled_windows: np.ndarray
    """(windows,) True where a window's sentence has gold tags."""
    targets: list[np.ndarray]
    """Per training window and position: the row of the teacher's outputs it learns (-1: none)."""
    outputs: np.ndarray
    """(train words + validation words, C) teacher logits (memory-mapped float16)."""
    scale: None = None

    @property
    def encoded(self) -> list[tuple[np.ndarray, int]]:
        return self.windows.encoded

    @property
    def texts(self) -> list[list[str]]:
        return self.train.words

    @property
    def labelled(self) -> np.ndarray:
        return self.labelled_windows

    @property
    def val_outputs(self) -> np.ndarray:
        return np.asarray(self.outputs[int(word_offsets(self.train.words)[-1]) :])

    def batch(
        self, rows: Sequence[int], length: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, teacher, labels, labelled)`` of windows ``rows`` padded to ``length``:
        the (P,) flat indices into (B * length) of the positions that learn, the teacher's (P,
        C) float32 logits there, the gold tag ids (P,) (0 where none) and (P,) True where gold."""
        flat_rows, where, gold, has_gold = [], [], [], []
        for r, i in enumerate(rows):
            i = int(i)
            target = self.targets[i]
            at = np.flatnonzero(target >= 0)
            flat_rows.append(target[at])
            where.append(r * length + at)
            labels = self.windows.labels[i] if self.windows.labels is not None else None
            tags = np.zeros(len(at), dtype=np.int64) if labels is None else labels[at]
            gold.append(np.where(tags == IGNORE, 0, tags))
            has_gold.append(np.full(len(at), bool(self.labelled_windows[i])) & (tags != IGNORE))
        target_rows = np.concatenate(flat_rows)
        teacher = np.asarray(self.outputs[target_rows], dtype=np.float32)
        keep = np.isfinite(teacher).all(-1)  # a word without pieces for the teacher
        return (
            torch.from_numpy(np.concatenate(where)[keep]),
            torch.from_numpy(teacher[keep]),
            torch.from_numpy(np.concatenate(gold)[keep]),
            torch.from_numpy(np.concatenate(has_gold)[keep]),
        )


def _targets(windows: Windows, offsets: np.ndarray) -> list[np.ndarray]:
    """Per window and position the teacher row of the word whose first piece sits there."""
    out = []
    for w, at in enumerate(windows.word):
        rows = np.full(len(at), -1, dtype=np.int64)
        keep = at >= 0
        rows[keep] = offsets[int(windows.sentence[w])] + at[keep]
        out.append(rows)
    return out


def transfer_sentences(texts: Sequence[str]) -> list[list[str]]:
    """Transfer texts as sentences of words (split at white space), for the teacher to tag."""
    return [t.split() for t in texts if t.split()]


def load_token_data(
    cfg: DistillConfig,
    teacher: Teacher,
    tokenizer: Any,
    transfer: Sequence[str],
    cache: Path,
    device: torch.device,
    before_teacher: Callable[[int], None],
) -> TokenDistillData:
    """Read the tagged gold sentences (--train, --validation or its held-out share) in the
    teacher's tags and the transfer sentences, get the teacher's per-word logits (cached) and
    encode the sentences for the student."""
    read = dict(encoding_errors=cfg.encoding_errors)
    label2id = {v: k for k, v in (teacher.config.id2label or {}).items()}
    source = f"teacher's ({teacher.directory})"
    gold = read_tagged(cfg.train, **read) if cfg.train else TaggedData([], [])
    if cfg.validation:
        val = read_tagged(cfg.validation, **read)
    elif not cfg.train:
        raise BertforgeError(
            "a token_classification teacher needs tagged sentences to validate on: give "
            "--validation (or --train, whose share --validation_fraction is held out)"
        )
    else:
        rows, val_rows = random_split(len(gold), cfg.validation_fraction, cfg.seed, "sentences")
        val, gold = gold.subset(val_rows), gold.subset(rows)
    gold_ids = tag_ids(gold, label2id, source) if cfg.train else []
    val_tags = tag_ids(val, label2id, source)
    words = gold.words + transfer_sentences(transfer)
    ids = gold_ids + [np.zeros(len(w), dtype=np.int64) for w in words[len(gold) :]]
    train = TaggedData(words, None)
    before_teacher(len(train))
    precision, _ = explain_precision(cfg.precision, device, teacher.config.hidden_size)
    teacher.model.to(device)
    outputs = token_teacher_outputs(
        teacher,
        words + val.words,
        cache,
        batch_size=cfg.eval_batch_size,
        precision=precision,
        progress=count_progress("teacher", "sentences"),
    )
    teacher.model.to("cpu")
    encode = dict(max_length=teacher.max_length)
    windows = encode_tagged(tokenizer, words, ids, **encode)
    val_windows = encode_tagged(tokenizer, val.words, val_tags, **encode)
    labelled = windows.sentence < len(gold)
    return TokenDistillData(
        train,
        val,
        windows,
        val_windows,
        val_tags,
        labelled,
        _targets(windows, word_offsets(words)),
        outputs,
    )


def teacher_predictions(data: TokenDistillData) -> list[np.ndarray]:
    """The teacher's tag id of every validation word (0, ``O``, where it has no logits)."""
    logits = np.nan_to_num(np.asarray(data.val_outputs, dtype=np.float32), nan=0.0)
    offsets = word_offsets(data.val.words)
    return [logits[offsets[s] : offsets[s + 1]].argmax(-1) for s in range(len(data.val))]


def teacher_token_scores(teacher: Teacher, data: TokenDistillData) -> dict[str, float]:
    """The teacher's validation scores from its cached word logits."""
    return tag_metrics(teacher.config, data.val_tags, teacher_predictions(data))


def validate_tokens(
    model: torch.nn.Module,
    data: TokenDistillData,
    pad_id: int,
    *,
    batch_size: int,
    precision: str,
) -> dict[str, float]:
    """The student's entity scores on the validation sentences and its ``agreement`` with the
    teacher's tags (the share of words tagged alike)."""
    metrics, predicted = evaluate_tagging_model(
        model,
        data.val_windows,
        data.val_tags,
        pad_id,
        batch_size=batch_size,
        precision=precision,
    )
    teacher = teacher_predictions(data)
    both = np.concatenate(predicted) if predicted else np.zeros(0)
    ref = np.concatenate(teacher) if teacher else np.zeros(0)
    metrics["agreement"] = float(np.mean(both == ref)) if len(ref) else float("nan")
    return metrics


__all__ = [
    "TokenDistillData",
    "load_token_data",
    "teacher_token_scores",
    "transfer_sentences",
    "validate_tokens",
]
