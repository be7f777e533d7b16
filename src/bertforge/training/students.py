"""The student of ``bertforge distill``, made in one of three ways: from any BERT directory (its
own tokenizer; a pretraining head dropped, another task's head refused), as a subset of the
teacher's layers (:func:`layer_subset`: DistilBERT's initialisation, sentence-transformers' layer
reduction), or fresh in one of Google's sizes with the teacher's tokenizer."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import check_model_directory, check_tokenizer_fits
from bertforge.modeling.config import BertConfig, google_width
from bertforge.modeling.model import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.teacher import TASK_ARCHITECTURES, Teacher

_LAYER_KEY = re.compile(r"(^|\.)encoder\.layer\.(\d+)\.")


def layer_subset(model: nn.Module, layers: list[int]) -> nn.Module:
    """A new model of ``model``'s class with only its encoder ``layers`` (0-based), renumbered
    0, 1, ...; every other weight (embeddings, pooler, head) copied as it is."""
    total = model.config.num_hidden_layers
    bad = [i for i in layers if not 0 <= i < total]
    if bad:
        raise BertforgeError(
            f"--student_layers {' '.join(map(str, layers))}: the teacher has layers 0 to "
            f"{total - 1}; {', '.join(map(str, bad))} is out of range"
        )
    position = {old: new for new, old in enumerate(layers)}
    state = {}
    for key, value in model.state_dict().items():
        found = _LAYER_KEY.search(key)
        if found is None:
            state[key] = value.clone()
        elif int(found.group(2)) in position:
            new = f"{found.group(1)}encoder.layer.{position[int(found.group(2))]}."
            state[key[: found.start()] + new + key[found.end() :]] = value.clone()
    config = dataclasses.replace(model.config, num_hidden_layers=len(layers))
    student = type(model)(config)
    student.load_state_dict(state, strict=True)
    return student


def student_class(task: str) -> type[nn.Module]:
    """The model class of a student of a ``task`` teacher."""
    if task == "embedding":
        return BertModel
    if task == "token_classification":
        return BertForTokenClassification
    if task == "question_answering":
        return BertForQuestionAnswering
    return BertForSequenceClassification


def _task_model(teacher: Teacher, directory: Path | None, config: BertConfig | None) -> nn.Module:
    """The teacher's model class with its labels: loaded from ``directory`` or fresh of
    ``config``."""
    labels = {}
    if teacher.task == "token_classification":
        labels = dict(num_labels=teacher.config.num_labels, id2label=teacher.config.id2label)
    elif teacher.task == "question_answering":
        labels = dict(num_labels=2, id2label=None, problem_type=None)
    elif teacher.task == "classification":
        labels = dict(
            num_labels=teacher.config.num_labels,
            id2label=teacher.config.id2label,
            problem_type="single_label_classification",
        )
    elif teacher.task == "regression":
        labels = dict(num_labels=1, id2label=None, problem_type="regression")
    cls = student_class(teacher.task)
    if directory is not None:
        return cls.from_pretrained(directory, **labels)
    assert config is not None
    return cls(dataclasses.replace(config, **labels))


def _check_student_head(directory: Path, teacher: Teacher) -> None:
    """A student directory fine-tuned for another task (or other labels) is refused: its head
    would be thrown away or trained against the teacher's classes."""
    config = BertConfig.load(directory / "config.json")
    arch = (config.architectures or ["BertModel"])[0]
    kind = TASK_ARCHITECTURES.get(arch)
    if kind is None:
        return  # a pretrained encoder (MLM/NSP heads or none): its heads are left out
    task = (
        kind if kind != "sequence" else "regression" if config.is_regression else "classification"
    )
    same = task == teacher.task and (
        task not in ("classification", "token_classification")
        or config.id2label == teacher.config.id2label
    )
    if not same:
        what = (
            f"{task} with labels {sorted((config.id2label or {}).values())}"
            if task in ("classification", "token_classification")
            else task
        )
        raise BertforgeError(
            f"{directory}: the student has a {arch} head for {what}, the teacher is for "
            f"{teacher.task}; start from a pretrained (not fine-tuned) model or "
            "--student_layers / --student_preset"
        )


def build_student(
    teacher: Teacher,
    *,
    directory: str | None = None,
    layers: list[int] | None = None,
    preset: str | None = None,
    num_layers: int | None = None,
    hidden_size: int | None = None,
    seed: int = 0,
) -> tuple[nn.Module, Tokenizer, str]:
    """``(model, tokenizer, description)`` of the student, fresh from its start: a preset may be
    resized to ``num_layers`` x ``hidden_size`` (:func:`resized_preset`)."""
    if directory is not None:
        path = check_model_directory(directory)
        _check_student_head(path, teacher)
        tokenizer = Tokenizer.from_file(path)
        model = _task_model(teacher, path, None)
        check_tokenizer_fits(tokenizer, model.config, path)
        return model, tokenizer, str(path)
    if layers is not None:
        model = layer_subset(teacher.model, layers)
        described = f"layers {' '.join(map(str, layers))} of the teacher"
        return model, teacher.tokenizer, described
    assert preset is not None
    torch.manual_seed(seed)
    source = teacher.config
    config = BertConfig.preset(
        preset,
        vocab_size=source.vocab_size,
        max_position_embeddings=source.max_position_embeddings,
        type_vocab_size=source.type_vocab_size,
        pad_token_id=source.pad_token_id,
        **resized_preset(num_layers, hidden_size),
    )
    model = _task_model(teacher, None, config)
    shape = f"{config.num_hidden_layers} x {config.hidden_size}"
    named = preset if num_layers is None and hidden_size is None else f"{preset} resized to"
    return model, teacher.tokenizer, f"a fresh {named} {shape} BERT"


def resized_preset(num_layers: int | None, hidden_size: int | None) -> dict[str, int]:
    """The overrides of a preset's :class:`BertConfig` for a student of another depth and/or
    width, sized as Google's models are: ``hidden_size // 64`` heads (at least 1) of 64
    dimensions where it divides, and a feed-forward of 4 x the width."""
    overrides: dict[str, int] = {}
    if num_layers is not None:
        overrides["num_hidden_layers"] = num_layers
    if hidden_size is not None:
        width = google_width(hidden_size)
        if hidden_size % (heads := width["num_attention_heads"]):
            raise BertforgeError(
                f"--student_hidden_size {hidden_size}: the width is split into "
                f"{hidden_size} // 64 = {heads} attention heads, which do not divide it; "
                "use a multiple of 64 (or a width under 128)"
            )
        overrides.update(width)
    return overrides


__all__ = ["build_student", "layer_subset", "resized_preset", "student_class"]
