"""Typed configuration. ``BertConfig`` uses Hugging Face's field names, so the ``config.json`` we
write loads in transformers and theirs loads here.

Training-side configs (data, pretraining, fine-tuning) live next to the code that uses them and
follow the same pattern: a dataclass, a docstring under each field, validation in
``__post_init__`` that says how to fix the value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError

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
        for key in ("problem_type", "architectures", "classifier_dropout"):
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
        from bertforge.checkpoint import atomic_write_text

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
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BertforgeError(
                f"{path}: not valid JSON ({err}); restore or re-save the config"
            ) from err
        if not isinstance(d, dict):
            raise BertforgeError(f"{path}: expected a JSON object of BertConfig fields")
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


ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
_JSON_TYPES = dict(int=(int,), float=(int, float), str=(str,), dict=(dict,), list=(list,))


def _json_value_fits(value: Any, annotation: str) -> bool:
    """Whether a JSON ``value`` has the type a BertConfig field is annotated with (a string
    such as ``"float | None"`` or ``"dict[int, str] | None"``); JSON true/false is no number."""
    options = [part.strip().split("[")[0] for part in annotation.split("|")]
    if value is None:
        return "None" in options
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

__all__ = ["BertConfig", "CONFIG_NAME", "PRESETS"]


# ---- pretraining (``bertforge pretrain``; the loop lives in bertforge.pretrain) ---------------


def check_training_options(cfg: Any, option: Callable[[str], str]) -> None:
    """The checks ``TrainConfig`` and ``FinetuneConfig`` share, on ``cfg``'s ``lr``,
    ``warmup_ratio``, ``schedule``, ``precision``, ``dropout`` and counts; ``option(field)`` names
    the command-line option in the message (``--train.warmup_ratio``, ``--warmup-ratio``)."""
    if not cfg.lr > 0:
        raise BertforgeError(f"{option('lr')} {cfg.lr} must be positive, e.g. 1e-4")
    if not 0.0 <= cfg.warmup_ratio < 1.0:
        raise BertforgeError(f"{option('warmup_ratio')} {cfg.warmup_ratio} must lie in [0, 1)")
    if cfg.schedule not in ("linear", "cosine", "constant"):
        raise BertforgeError(
            f"{option('schedule')} {cfg.schedule!r}: choose linear, cosine or constant"
        )
    if cfg.precision not in ("auto", "bf16", "fp32"):
        raise BertforgeError(f"{option('precision')} {cfg.precision!r}: choose auto, bf16 or fp32")
    if cfg.dropout is not None and not 0.0 <= cfg.dropout < 1.0:
        raise BertforgeError(f"{option('dropout')} {cfg.dropout} must lie in [0, 1)")
    check_at_least(cfg, option, log_every=1, max_nonfinite=1, num_threads=1, max_grad_norm=0)


def check_at_least(cfg: Any, option: Callable[[str], str], **minimums: float) -> None:
    """Raise naming the option when a numeric field of ``cfg`` is below its minimum (None, an
    unset optional value, passes)."""
    for name, low in minimums.items():
        value = getattr(cfg, name)
        if value is not None and value < low:
            raise BertforgeError(f"{option(name)} {value} must be at least {low}")


@dataclass
class ModelSection:
    """The encoder to pretrain: a named size plus overrides. ``vocab_size`` comes from the data's
    tokenizer; the dropout values here are the ones written to ``config.json`` (what fine-tuning
    uses), see ``TrainConfig.dropout`` for the rate during pretraining."""

    preset: str = "mini"
    """Named size: tiny (2x128), mini (4x256), small (4x512), medium (8x512), base, large."""
    num_hidden_layers: int | None = None
    """Override the preset's number of layers."""
    hidden_size: int | None = None
    """Override the preset's width (heads default to hidden_size / 64, FFN to 4 x hidden)."""
    num_attention_heads: int | None = None
    """Override the number of attention heads."""
    intermediate_size: int | None = None
    """Override the feed-forward width."""
    max_position_embeddings: int = 512
    """Position table size; must be >= the data's max_seq_length."""
    hidden_act: str = "gelu"
    """Activation: gelu, gelu_new/gelu_pytorch_tanh or relu."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and residual branches, as saved for fine-tuning."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities, as saved for fine-tuning."""
    initializer_range: float = 0.02
    """Standard deviation of the initial weights."""

    def to_bert_config(self, vocab_size: int) -> BertConfig:
        overrides: dict[str, Any] = {
            "vocab_size": vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "initializer_range": self.initializer_range,
        }
        if self.hidden_size is not None:
            overrides["hidden_size"] = self.hidden_size
            overrides["num_attention_heads"] = max(1, self.hidden_size // 64)
            overrides["intermediate_size"] = 4 * self.hidden_size
        for name in ("num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if getattr(self, name) is not None:
                overrides[name] = getattr(self, name)
        return BertConfig.preset(self.preset, **overrides)


@dataclass
class MaskingConfig:
    """How masked-language-model targets are drawn from the prepared sequences."""

    mlm_probability: float = 0.15
    """Fraction of (non-special) tokens to predict; 0.25-0.30 as Cramming/ModernBERT also works."""
    replace_probs: tuple[float, float, float] = (0.8, 0.1, 0.1)
    """Of the predicted tokens: share replaced by [MASK], by a random token, left unchanged."""
    whole_word: bool = False
    """Mask all WordPieces of a chosen word together."""
    max_predictions: int | None = None
    """Cap on predicted tokens per sequence (Google's max_predictions_per_seq); None = no cap."""
    bucket_window: int = 0
    """Sort by length within windows of this many global batches to cut padding (0 = off)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.mlm_probability < 1.0:
            raise BertforgeError(
                f"masking.mlm_probability={self.mlm_probability} must lie in (0, 1); 0.15 is BERT's"
            )
        if len(self.replace_probs) != 3 or abs(sum(self.replace_probs) - 1.0) > 1e-6:
            raise BertforgeError(
                f"masking.replace_probs={self.replace_probs} must be three shares summing to 1, "
                "e.g. [0.8, 0.1, 0.1]"
            )
        check_at_least(self, lambda name: f"--masking.{name}", max_predictions=1, bucket_window=0)


@dataclass(kw_only=True)
class LoopOptions:
    """Options of a training loop with the same meaning and default everywhere: pretraining's
    ``train`` section (``TrainConfig``) and ``bertforge finetune`` (``FinetuneConfig``) add theirs
    to these."""

    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm)."""
    schedule: str = "linear"
    """Decay after warmup: linear, cosine or constant."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    precision: str = "auto"
    """auto (bf16 where the hardware is fast at it), bf16 or fp32."""
    device: str = "auto"
    """auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps."""
    log_every: int = 10
    """Write the mean training loss to metrics.jsonl every N steps."""
    max_nonfinite: int = 20
    """Stop after this many non-finite losses in a row (each such step is skipped)."""
    num_threads: int | None = None
    """torch CPU threads per process (None = torch's default)."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class TrainConfig(LoopOptions):
    """The optimisation: objective, batch, budget, schedule, evaluation and checkpoints."""

    objective: str = "mlm_nsp"
    """mlm_nsp (original BERT: masked LM + next-sentence prediction) or mlm (masked LM only)."""
    batch_size: int = 128
    """Sequences per optimizer step, summed over all processes and accumulation steps."""
    micro_batch_size: int | None = None
    """Sequences per forward pass on one process; the rest is gradient accumulation. None = all."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (set this or max_time; with both, the first reached
    ends training and the LR schedule follows the one further along)."""
    max_time: str | None = None
    """Wall-clock training budget such as 15m or 1h30m; the LR schedule follows elapsed time.
    Evaluation and checkpoint time is not counted."""
    lr: float = 1e-4
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-6
    """AdamW epsilon."""
    warmup_ratio: float = 0.06
    """Fraction of the budget (steps or time) spent warming the LR up linearly from 0."""
    min_lr_ratio: float = 0.0
    """The LR floor at the end, as a fraction of the peak."""
    dropout: float | None = None
    """Dropout rate used while pretraining (hidden and attention); None uses the model's. The
    saved config.json keeps the model's values for fine-tuning."""
    compile: bool = False
    """Run the model through torch.compile."""
    seed: int = 0
    """Seed for initialisation, data order, masks and dropout."""
    eval_every: int = 500
    """Evaluate on the validation split every N steps (0 = only before and after training)."""
    eval_examples: int | None = 2048
    """Validation sequences used per evaluation (None = all)."""
    eval_batch_size: int | None = None
    """Sequences per evaluation batch; None = the micro batch size."""
    save_every: int = 1000
    """Write a resumable checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Keep the newest K checkpoints (0 = keep all)."""

    def __post_init__(self) -> None:
        if self.objective not in ("mlm_nsp", "mlm"):
            raise BertforgeError(f"train.objective={self.objective!r}: choose mlm_nsp or mlm")
        if self.max_steps is not None and self.max_steps <= 0:
            raise BertforgeError(f"train.max_steps={self.max_steps} must be positive")
        if self.batch_size <= 0 or (
            self.micro_batch_size is not None and self.micro_batch_size <= 0
        ):
            raise BertforgeError("train.batch_size and train.micro_batch_size must be positive")
        option = lambda name: f"--train.{name}"  # noqa: E731
        check_training_options(self, option)
        check_at_least(self, option, eval_every=0, save_every=0, keep_checkpoints=0, eps=0)
        check_at_least(self, option, eval_examples=1, eval_batch_size=1)
        if not all(0.0 <= b < 1.0 for b in self.betas) or len(self.betas) != 2:
            raise BertforgeError(
                f"--train.betas {list(self.betas)}: two values in [0, 1), e.g. [0.9, 0.999]"
            )


@dataclass
class PretrainConfig:
    """Everything ``bertforge pretrain`` needs; written resolved to OUTPUT/pretrain_config.yaml."""

    data: str
    """Prepared data directory (from bertforge prepare); its tokenizer/ is the model's."""
    output: str
    """Run directory: checkpoints, metrics.jsonl, curves.png and the final model/."""
    resume: str | None = None
    """Checkpoint (or run directory) to continue from. A run directory that already holds
    checkpoints continues from its newest one without this option."""
    extra_eval: list[str] | None = None
    """More prepared data directories to evaluate (e.g. out-of-domain text), before and after."""
    model: ModelSection = field(default_factory=ModelSection)
    """The encoder's size and saved dropout."""
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    """Masked-LM target selection."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation, budget, evaluation and checkpoints."""


__all__ += [
    "LoopOptions",
    "MaskingConfig",
    "ModelSection",
    "PretrainConfig",
    "TrainConfig",
    "check_at_least",
    "check_training_options",
]
