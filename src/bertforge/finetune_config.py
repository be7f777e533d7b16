"""``FinetuneConfig``: every option of ``bertforge finetune`` (one ``--option-name`` per field,
its help the field's docstring), checked when it is built. The resolved config is written to
OUTPUT/finetune_config.json; the loop that uses it is ``bertforge.finetune``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.config import LoopOptions, check_at_least, check_training_options
from bertforge.data.tasks import TRUNCATIONS
from bertforge.errors import BertforgeError


def option(name: str) -> str:
    """How ``bertforge finetune`` spells a ``FinetuneConfig`` field on the command line."""
    return "--" + name.replace("_", "-")


FINETUNE_CONFIG = "finetune_config.json"
"""The resolved config, written next to the fine-tuned model; the commands that use the model
read its data columns, length and truncation from there."""


@dataclass
class FinetuneConfig(LoopOptions):
    """Everything ``bertforge finetune`` needs; written resolved to OUTPUT/finetune_config.json."""

    model: str
    """Starting model directory: our pretrained model or any BERT checkpoint (config.json,
    model.safetensors, vocab.txt or tokenizer.json), e.g. all-MiniLM-L6-v2."""
    train: list[str]
    """Training file(s): .csv, .tsv or .jsonl, optionally .gz; several files are concatenated."""
    output: str
    """Output directory for the fine-tuned model, metrics, plots and checkpoints."""
    text_column: str = "text"
    """Column holding the text (the first text for pair tasks)."""
    label_column: str = "label"
    """Column holding the label: class names or integers, or numbers for regression."""
    text_pair_column: str | None = None
    """Column holding the second text of a pair task (e.g. a title and its description)."""
    task: str = "classification"
    """classification or regression."""
    validation: list[str] | None = None
    """Validation file(s); without them a stratified --validation-fraction of train is held out."""
    validation_fraction: float = 0.1
    """Share of the training file held out for validation when no --validation file is given."""
    normalize_targets: bool = True
    """Regression: train on z-scored targets (the saved head is rescaled back to the original units)."""
    max_length: int = 256
    """Tokens per example including [CLS]/[SEP]; longer texts are truncated."""
    truncation: str = "head"
    """head (keep the beginning) or head_tail (first quarter + last three quarters, Sun et al. 2019)."""
    batch_size: int = 32
    """Examples per optimizer step."""
    micro_batch_size: int | None = None
    """Examples per forward pass, a divisor of --batch-size; the rest is gradient accumulation
    (each micro-batch's loss weighted by its share of the batch's rows). None = the whole batch."""
    eval_batch_size: int = 64
    """Examples per evaluation batch."""
    lr: float = 5e-5
    """Peak learning rate (AdamW)."""
    warmup_ratio: float = 0.1
    """Fraction of training (steps or time) spent warming the LR up linearly from 0."""
    epochs: float = 3.0
    """Passes over the training data (fractions allowed)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (the LR schedule ends there)."""
    max_time: str | None = None
    """Wall-clock training budget such as 40m (evaluation time not counted); the LR schedule
    follows whichever of time and steps is further along."""
    dropout: float | None = None
    """Dropout rate while fine-tuning (hidden, attention, classifier); None keeps the model's.
    On CPU 0 is several times faster: dropout masks cost more than the matrix products there."""
    eval_every: int = 0
    """Evaluate on validation every N steps (0 = once per epoch), and always at the end."""
    patience: int = 0
    """Stop after this many evaluations without improvement of --metric (0 = never stop early)."""
    metric: str | None = None
    """Validation metric that picks the best model: accuracy, macro_f1, mcc (default accuracy),
    or for regression spearman, pearson, mse, mae (default spearman)."""
    bucket: bool = True
    """Group examples of similar length into batches (less padding); batches stay shuffled."""
    seed: int = 0
    """Seed for the head's initialisation, validation split, data order and dropout."""
    keep_checkpoints: int = 1
    """Resumable checkpoints (written at each evaluation and on SIGINT/SIGTERM) to keep."""

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise BertforgeError(f"--task {self.task!r}: choose classification or regression")
        if self.truncation not in TRUNCATIONS:
            raise BertforgeError(f"--truncation {self.truncation!r}: choose head or head_tail")
        if self.batch_size <= 0 or self.eval_batch_size <= 0 or self.epochs <= 0:
            raise BertforgeError("--batch-size, --eval-batch-size and --epochs must be positive")
        check_training_options(self, option)
        check_at_least(self, option, max_steps=1, eval_every=0, patience=0, keep_checkpoints=0)
        check_at_least(self, option, micro_batch_size=1)
        if self.batch_size % self.micro_batch:
            raise BertforgeError(
                f"--micro-batch-size {self.micro_batch_size} does not divide --batch-size "
                f"{self.batch_size}; choose a divisor"
            )
        default = "spearman" if self.task == "regression" else "accuracy"
        self.metric = self.metric or default
        allowed = (
            ("spearman", "pearson", "mse", "mae")
            if self.task == "regression"
            else ("accuracy", "macro_f1", "mcc")
        )
        if self.metric not in allowed:
            raise BertforgeError(
                f"--metric {self.metric!r} does not fit --task {self.task}; "
                f"choose one of {', '.join(allowed)}"
            )

    @property
    def micro_batch(self) -> int:
        """Examples per forward pass: --micro-batch-size, at most the batch (as in pretraining)."""
        return min(self.micro_batch_size or self.batch_size, self.batch_size)


__all__ = ["FINETUNE_CONFIG", "FinetuneConfig"]
