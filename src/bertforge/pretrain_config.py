"""``bertforge pretrain``'s typed configuration: the model to build, the masking, the optimisation
loop, and the run (data, output, resume). One YAML file or ``--section.field`` options fill a
``PretrainConfig``; the resolved one is written to OUTPUT/pretrain_config.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bertforge.config import BertConfig, LoopOptions, check_at_least, check_training_options
from bertforge.errors import BertforgeError


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


__all__ = ["MaskingConfig", "ModelSection", "PretrainConfig", "TrainConfig"]
