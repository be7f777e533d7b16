"""Typed configuration. ``BertConfig`` uses Hugging Face's field names, so the ``config.json`` we
write loads in transformers and theirs loads here.

Training-side configs (data, pretraining, fine-tuning) live next to the code that uses them and
follow the same pattern: a dataclass, a docstring under each field, validation in
``__post_init__`` that says how to fix the value.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text, read_json_object

CONFIG_NAME = "config.json"


@dataclass
class BertConfig:
    """Shape and behaviour of a BERT encoder; defaults are BERT-base's (and HF's)."""

    vocab_size: int = 30522
    """Number of WordPiece tokens; must equal the tokenizer's."""
    hidden_size: int = 768
    """Width of every hidden state."""
    num_hidden_layers: int = 12
    """Number of transformer layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide ``hidden_size``."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer inside each transformer layer (4 x hidden by convention)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: ``gelu`` (exact, erf-based), ``gelu_new``/``gelu_pytorch_tanh`` (tanh approximation) or ``relu``."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on every residual branch."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the model can read (size of the position-embedding table)."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids: 2 for sentence pairs."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weights."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    pad_token_id: int = 0
    """Id of ``[PAD]``; its embedding row starts at zero as in HF."""
    classifier_dropout: float | None = None
    """Dropout before the classification head; ``None`` uses ``hidden_dropout_prob``."""
    num_labels: int = 2
    """Outputs of the sequence-classification head; 1 means regression (MSE loss)."""
    id2label: dict[int, str] | None = None
    """Class names by id for classification models (saved in ``config.json`` as HF does)."""
    problem_type: str | None = None
    """``regression`` or ``single_label_classification``; derived from ``num_labels`` when unset."""
    architectures: list[str] | None = None
    """Class names the checkpoint was saved from (informational, written for HF)."""
    sentence_transformers: dict[str, str] | None = None
    """What sentence-transformers' ``CrossEncoder`` reads from config.json: ``activation_fn``,
    the function its ``predict`` applies to the logits (fine-tuning writes the identity, so that
    its scores are this model's logits, a regressor's values)."""

    def __post_init__(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
            "num_labels",
        ):
            if int(getattr(self, name)) <= 0:
                raise BertforgeError(f"BertConfig.{name}={getattr(self, name)} must be positive")
        if self.hidden_size % self.num_attention_heads:
            raise BertforgeError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; choose heads = hidden_size / 64 as BERT does"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise BertforgeError(
                f"hidden_act={self.hidden_act!r} is not supported; choose one of {sorted(ACTIVATIONS)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise BertforgeError(f"BertConfig.{name}={value} must lie in [0, 1]; BERT uses 0.1")
        if self.problem_type not in (None, "regression", "single_label_classification"):
            raise BertforgeError(
                f"problem_type={self.problem_type!r} is not supported; "
                "use 'regression' or 'single_label_classification'"
            )
        # before anything is allocated: a config asking for more than the machine holds gets a
        # message, not an out-of-memory kill half-way through building the model
        n, memory = self.num_parameters(), _physical_memory()
        if memory and 4 * n > memory:
            raise BertforgeError(
                f"BertConfig describes {n:,} parameters ({4 * n / 2**30:,.1f} GiB of fp32 weights), "
                f"more than this machine's {memory / 2**30:,.1f} GiB of memory; check vocab_size, "
                "hidden_size, num_hidden_layers, intermediate_size and max_position_embeddings"
            )

    def num_parameters(self) -> int:
        """Parameters of ``BertForPreTraining`` with this config (the largest of our models),
        counted from the sizes without building it."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        embeddings = (v + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
        heads = (h * h + h) + (h * h + h + 2 * h + v) + (2 * h + 2)  # pooler, MLM, NSP
        return embeddings + self.num_hidden_layers * layer + heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}

    @property
    def is_regression(self) -> bool:
        return self.problem_type == "regression" or (
            self.problem_type is None and self.num_labels == 1
        )

    # ---- config.json in HF's format -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model_type"] = "bert"
        d["position_embedding_type"] = "absolute"
        if self.id2label is None:
            d.pop("id2label")
        else:
            d["id2label"] = {str(k): v for k, v in self.id2label.items()}
            d["label2id"] = self.label2id
        for key in ("problem_type", "architectures", "classifier_dropout", "sentence_transformers"):
            if d[key] is None:
                d.pop(key)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> BertConfig:
        if d.get("model_type", "bert") != "bert":
            raise BertforgeError(
                f"{source}: model_type={d['model_type']!r} is not a BERT model; bertforge reads BERT encoders only"
            )
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise BertforgeError(
                f"{source}: position_embedding_type={d['position_embedding_type']!r} is not supported; "
                "only 'absolute' positions (as in BERT) are"
            )
        known = {f.name for f in fields(cls)}
        # null is "unset" in HF configs: the field keeps its default
        kwargs = {k: v for k, v in d.items() if k in known and v is not None}
        if "id2label" not in d and "num_labels" not in d and "label2id" in d:
            labels = d["label2id"]
            if not isinstance(labels, dict) or not all(isinstance(v, int) for v in labels.values()):
                raise BertforgeError(f"{source}: label2id must map class names to ids; fix it")
            kwargs["id2label"] = {v: k for k, v in labels.items()}
        # HF writes id2label {0: LABEL_0, 1: LABEL_1} even for models without a head; keep it.
        for f in fields(cls):  # a hand-edited config.json: name the field, not a deep TypeError
            if f.name in kwargs and not _json_value_fits(kwargs[f.name], str(f.type)):
                raise BertforgeError(
                    f"{source}: {f.name}={kwargs[f.name]!r} is not of type {f.type}; fix config.json"
                )
        labels = kwargs.get("id2label")
        if labels is not None and not all(str(k).lstrip("-").isdigit() for k in labels):
            raise BertforgeError(
                f"{source}: id2label keys must be class ids (0, 1, ...), got {sorted(labels)}; "
                "fix config.json"
            )
        try:
            return cls(**kwargs)
        except BertforgeError as err:  # name the file
            raise BertforgeError(f"{source}: {err}") from None
        except TypeError as err:  # wrong value types in a hand-written config
            raise BertforgeError(f"{source}: {err}") from err

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CONFIG_NAME
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> BertConfig:
        """Read a ``config.json`` (or a directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / CONFIG_NAME
        if not path.is_file():
            raise BertforgeError(f"{path}: no such file; a model directory needs config.json")
        d = read_json_object(path, "restore or re-save the config")
        return cls.from_dict(d, source=str(path))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """One of Google's released BERT sizes (``tiny`` ... ``large``), heads = H/64, FFN = 4H."""
        if name not in PRESETS:
            raise BertforgeError(
                f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}"
            )
        layers, hidden = PRESETS[name]
        base = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=max(1, hidden // 64),
            intermediate_size=4 * hidden,
        )
        base.update(overrides)
        return cls(**base)


def _physical_memory() -> int:
    """Bytes of RAM (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
_JSON_TYPES = dict(int=(int,), float=(int, float), str=(str,), dict=(dict,), list=(list,))


def _json_value_fits(value: Any, annotation: str) -> bool:
    """Whether a JSON ``value`` has the type a BertConfig field is annotated with (a string
    such as ``"float | None"`` or ``"dict[int, str] | None"``; ``from_dict`` drops nulls before
    asking); JSON true/false is no number."""
    options = [part.strip().split("[")[0] for part in annotation.split("|")]
    if isinstance(value, bool):
        return "bool" in options
    return any(isinstance(value, _JSON_TYPES.get(option, ())) for option in options)


# name -> (layers, hidden): the 24 compact models of Turc et al. (2019) at their named points,
# plus BERT-base and BERT-large.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


__all__ = [
    "CONFIG_NAME",
    "PRESETS",
    "BertConfig",
]
