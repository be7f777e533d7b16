"""The teacher of ``bertforge distill``: what its directory says about the task (the model class,
labels, text columns, pooling, maximum length), and its outputs behind one function,
:func:`teacher_outputs`, which computes them once and caches them on disk.

The cache: the teacher runs once over every training and transfer text (in eval mode its
outputs are a pure function of the text), a chunk at a time into a memory-mapped ``.npy`` file
in OUTPUT (float32: 4 bytes x the number of classes, or x the vector width, a text), moved into
place only when complete. Memory stays bounded whatever the number of texts (one chunk of
encoded texts and the pages the loop touches); an epoch then costs the student's pass alone,
where recomputing would add a teacher forward per text and epoch (a 6-layer teacher beside a
2-layer student: about 3x the student's cost). A resumed run reads the same file. A token classifier's outputs are a row per word (its logits
at the word's first piece, float16: :func:`token_teacher_outputs`); a QA teacher's, its
start/end logits a window (:mod:`bertforge.training.distill_qa`). What cannot be
cached so cheaply, the teacher's hidden states or attention (T x H numbers a text and layer),
is for the intermediate losses, computed live beside the student at each step
(:func:`bertforge.training.distill.traced_step`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.data.encoding import encode_examples
from bertforge.data.tagging import encode_tagged
from bertforge.errors import BertforgeError
from bertforge.evaluation.embedding import model_vectors
from bertforge.inference.predict import sequence_logits
from bertforge.inference.tagging import token_logits
from bertforge.io import atomic_write_text
from bertforge.modeling.auto import bert_architectures, for_directory
from bertforge.modeling.checkpoint import check_model_directory, finetune_defaults
from bertforge.modeling.config import AnyConfig, load_config
from bertforge.modeling.model import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.modeling.pooling import declared_pooling
from bertforge.tokenizer.wordpiece import Tokenizer

TASK_ARCHITECTURES = {
    "BertForSequenceClassification": "sequence",
    "BertForTokenClassification": "token_classification",
    "BertForQuestionAnswering": "question_answering",
}
"""A fine-tuned model's ``architectures`` entry -> its kind of task."""
PRETRAINING_ARCHITECTURES = (
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForReplacedTokenDetection",
    "BertModel",
)
"""Architectures of a model that is not fine-tuned for a task (an embedding model is a
``BertModel`` with a pooling declaration)."""
CACHE_CHUNK = 4096
"""Texts the teacher encodes and runs per chunk when it fills its cache."""
DEFAULT_MAX_LENGTH = 128


@dataclass
class Teacher:
    """A fine-tuned teacher, loaded, and its task settings."""

    directory: Path
    task: str
    """classification, regression, token_classification, question_answering or embedding."""
    model: nn.Module
    tokenizer: Tokenizer
    text_column: str
    text_pair_column: str | None
    label_column: str | None
    max_length: int
    truncation: str
    pooling: str | None = None
    """embedding: how token states become the vector (the teacher's declaration)."""
    normalize: bool = False
    """embedding: whether the vectors are scaled to unit length."""

    @property
    def config(self) -> AnyConfig:
        return self.model.config

    @property
    def width(self) -> int:
        """Outputs a text: classes, 1 (regression) or the vector's width."""
        if self.task == "embedding":
            return self.config.hidden_size
        return self.config.num_labels


def teacher_task(directory: Path) -> str:
    """The task a teacher directory was fine-tuned for, from its config.json (and a
    sentence-transformers declaration for an embedding model); a model that is not fine-tuned
    is an error saying how to make it one."""
    config = load_config(directory / "config.json")
    arch = (config.architectures or ["BertModel"])[0]
    kind = TASK_ARCHITECTURES.get((bert_architectures(config) or [arch])[0])  # ModernBERT's too
    if kind == "sequence":
        return "regression" if config.is_regression else "classification"
    if kind in ("token_classification", "question_answering"):
        return kind
    if kind is not None:
        raise BertforgeError(
            f"{directory}: a {arch} teacher ({kind}) is not supported by distill yet; "
            "classification, regression, token classification and embedding teachers are"
        )
    pooling, _, _ = declared_pooling(directory)
    if arch in ("BertModel", "ModernBertModel") and (
        pooling is not None or (directory / "modules.json").is_file()
    ):
        return "embedding"
    raise BertforgeError(
        f"{directory}: the teacher is not fine-tuned (a {arch}, no task head and no "
        "sentence-transformers pooling); fine-tune it first with bertforge finetune"
    )


def load_teacher(text: str, max_length: int | None = None) -> Teacher:
    """The teacher in ``text`` (a directory or a published model's name) with the settings it was
    fine-tuned with (``finetune_config.json``; defaults for a model trained elsewhere)."""
    directory = check_model_directory(text)
    task = teacher_task(directory)
    saved = finetune_defaults(directory)
    tokenizer = Tokenizer.from_file(directory)
    if task == "embedding":
        model: nn.Module = for_directory(BertModel, directory).from_pretrained(directory)
        pooling, _, normalize = declared_pooling(directory)
        pooling = pooling or saved.get("pooling") or "mean"
        length = max_length or _sentence_max_length(directory) or saved.get("max_length")
    else:
        classes = {
            "token_classification": BertForTokenClassification,
            "question_answering": BertForQuestionAnswering,
        }
        cls = for_directory(classes.get(task, BertForSequenceClassification), directory)
        model = cls.from_pretrained(directory)
        pooling, normalize = None, False
        length = max_length or saved.get("max_length")
    length = min(length or DEFAULT_MAX_LENGTH, model.config.max_position_embeddings)
    return Teacher(
        directory,
        task,
        model,
        tokenizer,
        text_column=saved.get("text_column") or "text",
        text_pair_column=saved.get("text_pair_column"),
        label_column=None if task == "embedding" else saved.get("label_column") or "label",
        max_length=length,
        truncation=saved.get("truncation") or "head",
        pooling=pooling,
        normalize=bool(normalize),
    )


def _sentence_max_length(directory: Path) -> int | None:
    """``max_seq_length`` of a sentence-transformers model (sentence_bert_config.json)."""
    path = directory / "sentence_bert_config.json"
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_key(
    teacher: Teacher, texts: Sequence[str], pairs: Sequence[str] | None, precision: str
) -> str:
    """What the cached outputs are a function of: the teacher's weights (file size and time),
    its settings, the precision and every text, hashed."""
    h = hashlib.sha256()
    weights = teacher.directory / "model.safetensors"
    stat = weights.stat() if weights.is_file() else None
    settings = [str(teacher.directory.resolve()), stat and (stat.st_size, stat.st_mtime_ns)]
    settings += [teacher.max_length, teacher.truncation, teacher.pooling, teacher.normalize]
    settings += [precision]
    h.update(json.dumps(settings).encode())
    for i, text in enumerate(texts):
        h.update(text.encode("utf-8", "surrogatepass") + b"\x00")
        if pairs is not None:
            h.update(pairs[i].encode("utf-8", "surrogatepass") + b"\x00")
    return h.hexdigest()


def _compute(
    teacher: Teacher, texts: Sequence[str], pairs: Sequence[str] | None, **options: Any
) -> np.ndarray:
    """(N, width) float32 outputs of ``texts`` (and ``pairs``), the teacher tokenising them."""
    if teacher.task == "embedding":
        embed = model_vectors(
            teacher.model,
            teacher.tokenizer,
            pooling=teacher.pooling,
            normalize=teacher.normalize,
            max_length=teacher.max_length,
            **options,
        )
        return embed(list(texts))
    encoded = encode_examples(
        teacher.tokenizer,
        list(texts),
        None if pairs is None else list(pairs),
        max_length=teacher.max_length,
        truncation=teacher.truncation,
    )
    return sequence_logits(teacher.model, encoded, teacher.tokenizer.pad_id, **options)


@torch.inference_mode()
def teacher_outputs(
    teacher: Teacher,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    cache: Path | None,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """The teacher's (N, width) outputs of every text: logits (classification), predictions in
    the labels' units (regression) or vectors (embedding). With ``cache`` (a ``.npy`` path) they
    are read from it when it holds these texts' outputs, else computed a chunk at a time into
    it (memory-mapped) and returned from it; ``progress(done, total)`` after each chunk."""
    options = dict(batch_size=batch_size, precision=precision)
    if cache is None:
        return _compute(teacher, texts, pairs, **options)
    key = _cache_key(teacher, texts, pairs, precision)
    stamp = cache.with_suffix(".json")
    if cache.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")).get("key") == key:
                return np.load(cache, mmap_mode="r")
        except ValueError:
            pass  # a damaged stamp: compute again
    tmp = cache.with_name(cache.name + ".tmp")
    out = np.lib.format.open_memmap(
        tmp, mode="w+", dtype=np.float32, shape=(len(texts), teacher.width)
    )
    for start in range(0, len(texts), CACHE_CHUNK):
        part = slice(start, start + CACHE_CHUNK)
        out[part] = _compute(
            teacher, texts[part], None if pairs is None else pairs[part], **options
        )
        if progress is not None:
            progress(min(start + CACHE_CHUNK, len(texts)), len(texts))
    out.flush()
    del out
    os.replace(tmp, cache)
    atomic_write_text(stamp, json.dumps({"key": key, "texts": len(texts)}) + "\n")
    return np.load(cache, mmap_mode="r")


def word_offsets(words: Sequence[Sequence[str]]) -> np.ndarray:
    """(N + 1,) int64: the first row of each sentence's words in the flat word-aligned outputs
    of :func:`token_teacher_outputs` (sentence ``s``, word ``w`` is row ``offsets[s] + w``)."""
    return np.concatenate([[0], np.cumsum([len(w) for w in words])]).astype(np.int64)


def _word_logits(
    teacher: Teacher, words: Sequence[Sequence[str]], out: np.ndarray, **options: Any
) -> None:
    """Fill ``out`` (rows of ``words``' words, C) with the teacher's logits at each word's first
    piece (its own tokenizer); a word without pieces keeps NaN (no target)."""
    windows = encode_tagged(teacher.tokenizer, words, None, max_length=teacher.max_length)
    logits = token_logits(teacher.model, windows.encoded, teacher.tokenizer.pad_id, **options)
    offsets = word_offsets(words)
    for w, values in enumerate(logits):
        at = windows.word[w]
        keep = at >= 0
        out[offsets[int(windows.sentence[w])] + at[keep]] = values[keep]


@torch.inference_mode()
def token_teacher_outputs(
    teacher: Teacher,
    words: Sequence[Sequence[str]],
    cache: Path | None,
    *,
    batch_size: int = 64,
    precision: str = "fp32",
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """A token-classification teacher's (words, C) logits, one row per word of every sentence
    (rows :func:`word_offsets`), taken at the word's first piece under the teacher's tokenizer;
    NaN for a word without pieces. With ``cache`` they are a float16 memory-mapped ``.npy``
    (C x 2 bytes a word, not T x C x 4 a window), computed a chunk of sentences at a time;
    ``progress(done, total)`` after each chunk."""
    options = dict(batch_size=batch_size, precision=precision)
    rows = int(sum(len(w) for w in words))
    if cache is None:
        out = np.full((rows, teacher.width), np.nan, dtype=np.float32)
        _word_logits(teacher, words, out, **options)
        return out
    key = _cache_key(teacher, ["\x1f".join(w) for w in words], None, precision)
    stamp = cache.with_suffix(".json")
    if cache.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")).get("key") == key:
                return np.load(cache, mmap_mode="r")
        except ValueError:
            pass  # a damaged stamp: compute again
    tmp = cache.with_name(cache.name + ".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(rows, teacher.width))
    offsets = word_offsets(words)
    for start in range(0, len(words), CACHE_CHUNK):
        end = min(start + CACHE_CHUNK, len(words))
        part = np.full((offsets[end] - offsets[start], teacher.width), np.nan, dtype=np.float32)
        _word_logits(teacher, words[start:end], part, **options)
        out[offsets[start] : offsets[end]] = part
        if progress is not None:
            progress(end, len(words))
    out.flush()
    del out
    os.replace(tmp, cache)
    atomic_write_text(stamp, json.dumps({"key": key, "texts": len(words)}) + "\n")
    return np.load(cache, mmap_mode="r")


__all__ = [
    "Teacher",
    "load_teacher",
    "teacher_outputs",
    "teacher_task",
    "token_teacher_outputs",
    "word_offsets",
]
