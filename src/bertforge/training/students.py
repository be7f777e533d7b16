"""The student of ``bertforge distill``, made in one of three ways: from any BERT or ModernBERT
directory (its own tokenizer; a pretraining head dropped, another task's head refused), as a
subset of the teacher's layers (:func:`layer_subset`: DistilBERT's initialisation,
sentence-transformers' layer reduction), or fresh in one of Google's BERT sizes or ModernBERT's
with the teacher's tokenizer."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.modeling.auto import BERT, MODERNBERT, bert_architectures, for_directory, is_modern
from bertforge.modeling.checkpoint import check_model_directory, check_tokenizer_fits
from bertforge.modeling.config import (
    AnyConfig,
    BertConfig,
    ModernBertConfig,
    google_width,
    load_config,
)
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.teacher import TASK_ARCHITECTURES, Teacher

_LAYER_KEY = re.compile(r"(^|\.)(encoder\.layer|layers)\.(\d+)\.")
"""A layer's weights: BERT's ``bert.encoder.layer.N.``, ModernBERT's ``model.layers.N.``."""


def layer_subset(model: nn.Module, layers: list[int]) -> nn.Module:
    """A new model of ``model``'s class with only its encoder ``layers`` (0-based), renumbered
    0, 1, ...; every other weight (embeddings, pooler, head) copied as it is. A ModernBERT
    keeps each copied layer's attention type (global or sliding-window)."""
    total = model.config.num_hidden_layers
    bad = [i for i in layers if not 0 <= i < total]
    if bad:
        raise BertforgeError(
            f"--student_layers {' '.join(map(str, layers))}: the teacher has layers 0 to "
            f"{total - 1}; {', '.join(map(str, bad))} is out of range"
        )
    fields: dict = dict(num_hidden_layers=len(layers))
    if isinstance(model.config, ModernBertConfig):
        if layers[0] != 0:
            raise BertforgeError(
                f"--student_layers {' '.join(map(str, layers))}: a ModernBERT's first layer has "
                "no attention norm (its embeddings' norm feeds it), so a student of a ModernBERT "
                "teacher starts with the teacher's layer 0, e.g. --student_layers 0 "
                f"{total - 1}"
            )
        assert model.config.layer_types is not None
        fields["layer_types"] = [model.config.layer_types[i] for i in layers]
    config = dataclasses.replace(model.config, **fields)
    position = {old: new for new, old in enumerate(layers)}
    state = {}
    for key, value in model.state_dict().items():
        found = _LAYER_KEY.search(key)
        if found is None:
            state[key] = value.clone()
        elif int(found.group(3)) in position:
            new = f"{found.group(1)}{found.group(2)}.{position[int(found.group(3))]}."
            state[key[: found.start()] + new + key[found.end() :]] = value.clone()
    student = type(model)(config)
    student.load_state_dict(state, strict=True)
    return student


TASK_KINDS = {
    "embedding": "encoder",
    "token_classification": "token",
    "question_answering": "question_answering",
    "classification": "sequence",
    "regression": "sequence",
}


def student_class(task: str, modern: bool = False) -> type[nn.Module]:
    """The model class of a student of a ``task`` teacher (a BERT's, or ``modern``: a
    ModernBERT's)."""
    return (MODERNBERT if modern else BERT)[TASK_KINDS[task]]


def load_student(task: str, directory: str | Path) -> nn.Module:
    """A saved student (or checkpoint) of a ``task`` teacher, of the architecture its
    config.json names."""
    return for_directory(student_class(task), directory).from_pretrained(directory)


def _task_model(teacher: Teacher, directory: Path | None, config: AnyConfig | None) -> nn.Module:
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
    if directory is not None:
        return for_directory(student_class(teacher.task), directory).from_pretrained(
            directory, **labels
        )
    assert config is not None
    cls = student_class(teacher.task, isinstance(config, ModernBertConfig))
    return cls(dataclasses.replace(config, **labels))


def _check_student_head(directory: Path, teacher: Teacher) -> None:
    """A student directory fine-tuned for another task (or other labels) is refused: its head
    would be thrown away or trained against the teacher's classes."""
    config = load_config(directory / "config.json")
    arch = (config.architectures or ["BertModel"])[0]
    kind = TASK_ARCHITECTURES.get(bert_architectures(config)[0] if config.architectures else arch)
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
    architecture: str | None = None,
    seed: int = 0,
) -> tuple[nn.Module, Tokenizer, str]:
    """``(model, tokenizer, description)`` of the student, fresh from its start: a preset of
    ``architecture`` (default: the teacher's) may be resized to ``num_layers`` x
    ``hidden_size`` (:func:`resized_preset`)."""
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
    modern = is_modern(teacher.model) if architecture is None else architecture == "modernbert"
    config = fresh_config(teacher, preset, modern, num_layers, hidden_size)
    model = _task_model(teacher, None, config)
    shape = f"{config.num_hidden_layers} x {config.hidden_size}"
    named = preset if num_layers is None and hidden_size is None else f"{preset} resized to"
    return model, teacher.tokenizer, f"a fresh {named} {shape} {'ModernBERT' if modern else 'BERT'}"


def fresh_config(
    teacher: Teacher, preset: str, modern: bool, num_layers: int | None, hidden_size: int | None
) -> AnyConfig:
    """A fresh student's config: the ``preset`` of BERT or (``modern``) ModernBERT, resized,
    with the teacher's vocabulary and special tokens and as many positions as it has."""
    source, tokenizer = teacher.config, teacher.tokenizer
    overrides = resized_preset(num_layers, hidden_size)
    if not modern:
        return BertConfig.preset(
            preset,
            vocab_size=source.vocab_size,
            max_position_embeddings=source.max_position_embeddings,
            type_vocab_size=getattr(source, "type_vocab_size", 2),
            pad_token_id=source.pad_token_id
            if isinstance(source, BertConfig)
            else tokenizer.pad_id,
            **overrides,
        )
    base = ModernBertConfig.preset(preset)
    if hidden_size is not None:  # ModernBERT's GeGLU at the preset's ratio, not BERT's 4 x
        overrides["intermediate_size"] = round(
            base.intermediate_size / base.hidden_size * hidden_size
        )
    # the teacher's window where it has one, else the preset's, within the positions
    window = getattr(source, "local_attention", base.local_attention)
    overrides["local_attention"] = min(window, source.max_position_embeddings)
    return ModernBertConfig.preset(
        preset,
        vocab_size=source.vocab_size,
        max_position_embeddings=source.max_position_embeddings,
        pad_token_id=tokenizer.pad_id,
        cls_token_id=tokenizer.cls_id,
        bos_token_id=tokenizer.cls_id,
        sep_token_id=tokenizer.sep_id,
        eos_token_id=tokenizer.sep_id,
        **overrides,
    )


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


__all__ = [
    "build_student",
    "fresh_config",
    "layer_subset",
    "load_student",
    "resized_preset",
    "student_class",
]
