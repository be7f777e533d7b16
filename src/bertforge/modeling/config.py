"""Typed configuration. ``BertConfig`` and ``ModernBertConfig`` use Hugging Face's field names,
so the ``config.json`` we write loads in transformers and theirs loads here; :func:`load_config`
reads either, by its ``model_type``.

Training-side configs (data, pretraining, fine-tuning) live next to the code that uses them and
follow the same pattern: a dataclass, a docstring under each field, validation in
``__post_init__`` that says how to fix the value.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

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

    model_type = "bert"

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
        base: dict[str, Any] = dict(num_hidden_layers=layers, **google_width(hidden))
        base.update(overrides)
        return cls(**base)


def google_width(hidden_size: int) -> dict[str, int]:
    """The width fields of a BERT ``hidden_size`` wide, as Google sized its models:
    ``hidden_size // 64`` heads (at least 1) and a feed-forward of 4 x the width."""
    return dict(
        hidden_size=hidden_size,
        num_attention_heads=max(1, hidden_size // 64),
        intermediate_size=4 * hidden_size,
    )


def _physical_memory() -> int:
    """Bytes of RAM (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
_JSON_TYPES = dict(
    int=(int,), float=(int, float), str=(str,), dict=(dict,), list=(list,), Literal=(str,)
)


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


# ---- ModernBERT --------------------------------------------------------------------------------
LayerType = Literal["full_attention", "sliding_attention"]
ROPE_THETA: dict[str, float] = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
"""transformers' default rotary bases: global layers 160k, local (sliding-window) layers 10k."""


@dataclass
class ModernBertConfig:
    """Shape and behaviour of a ModernBERT encoder (Warner et al. 2024), with the field names of
    transformers' ``ModernBertConfig`` (5.x): pre-norm layers, LayerNorm without bias, no biases
    in the products, GeGLU feed-forward, rotary positions, global and sliding-window attention
    layers as ``layer_types`` says. Defaults are ModernBERT-base's (and transformers')."""

    vocab_size: int = 50368
    """Number of tokens; must be at least the tokenizer's."""
    hidden_size: int = 768
    """Width of every hidden state."""
    intermediate_size: int = 1152
    """Width of each half of the GeGLU feed-forward (``mlp.Wi`` is 2 x this wide)."""
    num_hidden_layers: int = 22
    """Number of transformer layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide ``hidden_size``."""
    hidden_activation: str = "gelu"
    """The GeGLU's activation: ``gelu`` (exact), ``gelu_new``/``gelu_pytorch_tanh`` or ``relu``."""
    max_position_embeddings: int = 8192
    """Longest sequence the model reads (rotary positions: no table, a limit only)."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated-normal initialisation of the input products."""
    initializer_cutoff_factor: float = 2.0
    """The initialisation is truncated at this many standard deviations."""
    norm_eps: float = 1e-5
    """Epsilon of every LayerNorm."""
    norm_bias: bool = False
    """Whether the LayerNorms have a bias (ModernBERT's have none)."""
    pad_token_id: int | None = 50283
    """Id of the padding token; its embedding row starts at zero."""
    eos_token_id: int | list[int] | None = 50282
    """End-of-sequence id (kept for transformers; the encoder does not read it)."""
    bos_token_id: int | None = 50281
    """Beginning-of-sequence id (kept for transformers)."""
    cls_token_id: int | None = 50281
    """Id of the classification token that starts every sequence."""
    sep_token_id: int | None = 50282
    """Id of the separator that ends each segment."""
    attention_bias: bool = False
    """Whether ``attn.Wqkv`` and ``attn.Wo`` have biases."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities and on the attention block's output."""
    layer_types: list[str] | None = None
    """Per layer ``full_attention`` (global) or ``sliding_attention`` (local); None: global every
    third layer from layer 0, as ModernBERT (older configs' ``global_attn_every_n_layers``)."""
    rope_parameters: dict[str, dict[str, Any]] | None = None
    """Per layer type ``{"rope_type": "default", "rope_theta": ...}``; None: 160k global, 10k
    local (older configs' ``global_rope_theta`` / ``local_rope_theta``)."""
    local_attention: int = 128
    """The whole window of a sliding-window layer: a token sees those within
    ``local_attention // 2`` positions either side."""
    embedding_dropout: float = 0.0
    """Dropout after the embedding LayerNorm."""
    mlp_bias: bool = False
    """Whether ``mlp.Wi`` and ``mlp.Wo`` have biases."""
    mlp_dropout: float = 0.0
    """Dropout inside the feed-forward, before ``mlp.Wo``."""
    decoder_bias: bool = True
    """Whether the MLM decoder has a bias."""
    classifier_pooling: Literal["cls", "mean"] = "cls"
    """What a sequence classifier reads: the first token, or the mean over the real tokens."""
    classifier_dropout: float = 0.0
    """Dropout before a task head's ``classifier``."""
    classifier_bias: bool = False
    """Whether ``head.dense`` has a bias."""
    classifier_activation: str = "gelu"
    """Activation of ``head`` (between ``head.dense`` and ``head.norm``)."""
    sparse_prediction: bool = False
    """transformers' flag for MLM logits at the labelled positions only (bertforge always
    predicts sparsely when labels are given; kept so the config round-trips)."""
    sparse_pred_ignore_index: int = -100
    """The label that marks a position without a target."""
    tie_word_embeddings: bool = True
    """The MLM decoder's weight is the token-embedding table (bertforge supports only tied)."""
    num_labels: int = 2
    """Outputs of the classification head; 1 means regression (MSE loss)."""
    id2label: dict[int, str] | None = None
    """Class names by id for classification models."""
    problem_type: str | None = None
    """``regression`` or ``single_label_classification``; derived from ``num_labels`` when unset."""
    architectures: list[str] | None = None
    """Class names the checkpoint was saved from (transformers picks its class from this)."""
    sentence_transformers: dict[str, str] | None = None
    """What sentence-transformers' ``CrossEncoder`` reads (its ``activation_fn``); written by
    ``finetune`` of a pair classifier or regressor, so that ``CrossEncoder(dir)`` scores as we do."""

    model_type = "modernbert"

    def __post_init__(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
        if self.layer_types is None:
            self.layer_types = global_every(3, self.num_hidden_layers)
        self.rope_parameters = {
            kind: {"rope_type": "default", "rope_theta": ROPE_THETA[kind]}
            | dict((self.rope_parameters or {}).get(kind) or {})
            for kind in ROPE_THETA
        }
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "local_attention",
            "num_labels",
        ):
            if int(getattr(self, name)) <= 0:
                raise BertforgeError(
                    f"ModernBertConfig.{name}={getattr(self, name)} must be positive"
                )
        if self.hidden_size % self.num_attention_heads:
            raise BertforgeError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; choose heads that divide the width (64 per head "
                "as ModernBERT)"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise BertforgeError(
                f"head dimension {self.hidden_size // self.num_attention_heads} is odd; rotary "
                "positions rotate pairs of dimensions: choose heads giving an even head size"
            )
        if self.local_attention > self.max_position_embeddings:
            raise BertforgeError(
                f"local_attention={self.local_attention} is larger than the context "
                f"(max_position_embeddings={self.max_position_embeddings}); a window past the "
                "longest sequence is global attention: lower local_attention or raise the context"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise BertforgeError(
                f"layer_types has {len(self.layer_types)} entries for num_hidden_layers="
                f"{self.num_hidden_layers}; give one per layer"
            )
        bad = sorted(set(self.layer_types) - set(ROPE_THETA))
        if bad:
            raise BertforgeError(
                f"layer_types holds {bad}; each must be full_attention or sliding_attention"
            )
        for kind, rope in self.rope_parameters.items():
            if rope.get("rope_type", "default") != "default":
                raise BertforgeError(
                    f"rope_parameters[{kind!r}].rope_type={rope['rope_type']!r} is not "
                    "supported; bertforge reads the default rotary embedding only"
                )
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                raise BertforgeError(
                    f"{name}={getattr(self, name)!r} is not supported; choose one of "
                    f"{sorted(ACTIVATIONS)}"
                )
        if not self.tie_word_embeddings:
            raise BertforgeError(
                "tie_word_embeddings=false is not supported; bertforge's ModernBERT decoder "
                "shares the token-embedding table"
            )
        if self.classifier_pooling not in ("cls", "mean"):
            raise BertforgeError(
                f"classifier_pooling={self.classifier_pooling!r}; choose 'cls' or 'mean'"
            )
        for name in ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise BertforgeError(f"ModernBertConfig.{name}={value} must lie in [0, 1)")
        if self.problem_type not in (None, "regression", "single_label_classification"):
            raise BertforgeError(
                f"problem_type={self.problem_type!r} is not supported; "
                "use 'regression' or 'single_label_classification'"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def window(self) -> int:
        """How far a sliding-window layer sees either side: ``local_attention // 2``
        (transformers' ``sliding_window``)."""
        return self.local_attention // 2

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}

    @property
    def is_regression(self) -> bool:
        return self.problem_type == "regression" or (
            self.problem_type is None and self.num_labels == 1
        )

    def num_parameters(self) -> int:
        """Parameters of ``ModernBertForMaskedLM`` with this config, from the sizes."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        nb = h if self.norm_bias else 0
        norm = h + nb
        layer = 4 * h * h + 3 * h * i + 2 * norm
        layer += (4 * h if self.attention_bias else 0) + (2 * i + h if self.mlp_bias else 0)
        first = layer - norm  # layer 0's attn_norm is an identity
        head = h * h + (h if self.classifier_bias else 0) + norm + (v if self.decoder_bias else 0)
        return v * h + norm + first + (self.num_hidden_layers - 1) * layer + norm + head

    # ---- config.json in transformers' format --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model_type"] = self.model_type
        if self.id2label is None:
            d.pop("id2label")
        else:
            d["id2label"] = {str(k): v for k, v in self.id2label.items()}
            d["label2id"] = self.label2id
        for key in ("problem_type", "architectures", "sentence_transformers"):
            if d[key] is None:
                d.pop(key)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> ModernBertConfig:
        if d.get("model_type") != cls.model_type:
            raise BertforgeError(
                f"{source}: model_type={d.get('model_type')!r} is not a ModernBERT model"
            )
        d = dict(d)
        # configs on the Hub before transformers 5 say the pattern and thetas as numbers
        if d.get("layer_types") is None and "global_attn_every_n_layers" in d:
            layers = int(d.get("num_hidden_layers", cls.num_hidden_layers))
            d["layer_types"] = global_every(int(d["global_attn_every_n_layers"]), layers)
        if d.get("rope_parameters") is None:
            rope = {}
            for kind, old in (
                ("full_attention", "global_rope_theta"),
                ("sliding_attention", "local_rope_theta"),
            ):
                if d.get(old) is not None:
                    rope[kind] = {"rope_type": "default", "rope_theta": float(d[old])}
            d["rope_parameters"] = rope or None
        return _from_dict(cls, d, source)  # type: ignore[return-value]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CONFIG_NAME
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ModernBertConfig:
        config = load_config(path)
        if not isinstance(config, cls):
            raise BertforgeError(f"{path}: a BERT config.json, not a ModernBERT one")
        return config

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModernBertConfig:
        """A named size: ``tiny`` and ``mini`` at BERT-Tiny's and BERT-Mini's depth, width and
        cost per token (heads H/64, each GeGLU half 8H/3 wide, rounded up to 16: the two
        feed-forward products then cost what BERT's 4H one does), ``ettin-17m`` at Ettin-17M's
        shape, ``base`` at ModernBERT-base's."""
        if name not in MODERN_PRESETS:
            raise BertforgeError(
                f"unknown ModernBERT preset {name!r}; choose one of {', '.join(MODERN_PRESETS)}"
            )
        base = dict(MODERN_PRESETS[name])
        base.update(overrides)
        return cls(**base)


def global_every(n: int, layers: int) -> list[str]:
    """ModernBERT's layer pattern: a global layer every ``n`` layers from layer 0, local between."""
    if n <= 0:
        raise BertforgeError(f"global_attn_every_n_layers={n} must be positive")
    return ["sliding_attention" if i % n else "full_attention" for i in range(layers)]


def _glu_width(hidden: int) -> int:
    """8H/3 rounded up to a multiple of 16: a GeGLU feed-forward of BERT's 4H cost."""
    return -(-8 * hidden // 3 // 16) * 16


MODERN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=_glu_width(128),
    ),
    "mini": dict(
        num_hidden_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=_glu_width(256),
    ),
    # Ettin-17M (Weller et al. 2025, jhu-clsp/ettin-encoder-17m): 7 layers of width 256 with 4
    # heads; the GeGLU width 384 is ModernBERT's 1.5 x H, which with the 50,368-token table
    # gives the model's 17M parameters
    "ettin-17m": dict(
        num_hidden_layers=7, hidden_size=256, num_attention_heads=4, intermediate_size=384
    ),
    "base": dict(
        num_hidden_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152
    ),
}


def _from_dict(cls: type, d: dict[str, Any], source: str) -> Any:
    """``cls(**d)`` over the fields ``cls`` knows, each value checked against its annotation,
    errors naming ``source``."""
    known = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in known and v is not None}
    if "id2label" not in d and "num_labels" not in d and "label2id" in d:
        labels = d["label2id"]
        if not isinstance(labels, dict) or not all(isinstance(v, int) for v in labels.values()):
            raise BertforgeError(f"{source}: label2id must map class names to ids; fix it")
        kwargs["id2label"] = {v: k for k, v in labels.items()}
    for f in fields(cls):
        if f.name in kwargs and not _json_value_fits(kwargs[f.name], str(f.type)):
            raise BertforgeError(
                f"{source}: {f.name}={kwargs[f.name]!r} is not of type {f.type}; fix config.json"
            )
    try:
        return cls(**kwargs)
    except BertforgeError as err:
        raise BertforgeError(f"{source}: {err}") from None
    except TypeError as err:
        raise BertforgeError(f"{source}: {err}") from err


AnyConfig = BertConfig | ModernBertConfig


def config_from_dict(d: dict[str, Any], source: str = "config") -> AnyConfig:
    """The config a ``config.json`` describes, by its ``model_type`` (none: BERT)."""
    if d.get("model_type") == ModernBertConfig.model_type:
        return ModernBertConfig.from_dict(d, source)
    return BertConfig.from_dict(d, source)


def load_config(path: str | Path) -> AnyConfig:
    """Read a ``config.json`` (or a directory holding one): a BERT or a ModernBERT config."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_NAME
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file; a model directory needs config.json")
    d = read_json_object(path, "restore or re-save the config")
    return config_from_dict(d, source=str(path))


__all__ = [
    "CONFIG_NAME",
    "PRESETS",
    "MODERN_PRESETS",
    "AnyConfig",
    "BertConfig",
    "ModernBertConfig",
    "config_from_dict",
    "load_config",
    "google_width",
]
