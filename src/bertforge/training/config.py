"""Typed configuration of the training commands: ``LoopOptions`` (what every training loop
shares), ``PretrainConfig`` (``bertforge pretrain``: the model to build, the masking, the
optimisation loop, the run) and ``FinetuneConfig`` (``bertforge finetune``). A dataclass with a
docstring under each field, validated once in ``__post_init__`` with a message that says how to
fix the value; the resolved config is written next to the run's checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from bertforge.data.corpus import EncodingErrors
from bertforge.data.encoding import Truncation, check_max_length
from bertforge.errors import BertforgeError
from bertforge.evaluation.metrics import RETRIEVAL_METRICS
from bertforge.modeling.checkpoint import FINETUNE_CONFIG, resolve_model
from bertforge.modeling.config import (
    MODERN_PRESETS,
    PRESETS,
    AnyConfig,
    BertConfig,
    ModernBertConfig,
)
from bertforge.modeling.pooling import PoolingMode
from bertforge.progress import parse_budget, parse_duration
from bertforge.runtime import Precision, parse_bytes
from bertforge.training.optim import Schedule

Objective = Literal["mlm_nsp", "mlm", "rtd", "mlm_contrastive"]
FreshHead = Literal["warm", "random"]
PositionInit = Literal["normal", "sinusoidal"]
WordInit = Literal["normal", "cooccurrence"]
AttentionInit = Literal["normal", "identity"]
BowTarget = Literal["pair", "shared"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Preset = Literal["tiny", "mini", "small", "medium", "base", "large", "ettin-17m"]
Architecture = Literal["bert", "modernbert"]
ClassifierPooling = Literal["cls", "mean"]
"""How a ModernBERT classifier or regressor pools its last hidden states: [CLS] or the mean of
the real tokens' (transformers' ``ModernBertConfig.classifier_pooling``)."""
Task = Literal[
    "classification", "regression", "token_classification", "question_answering", "embedding"
]
EmbeddingLoss = Literal["auto", "in_batch_negatives", "in_batch_symmetric", "cosent", "simcse"]
Metric = Literal[
    "accuracy",
    "macro_f1",
    "mcc",
    "spearman",
    "pearson",
    "mse",
    "mae",
    "entity_f1",
    "token_accuracy",
    "f1",
    "exact_match",
    "mrr@10",
    "ndcg@10",
    "recall@1",
    "recall@10",
    "recall@100",
    "loss",
]
CLASSIFICATION_METRICS: tuple[str, ...] = ("accuracy", "macro_f1", "mcc")
REGRESSION_METRICS: tuple[str, ...] = ("spearman", "pearson", "mse", "mae")
TAGGING_METRICS: tuple[str, ...] = ("entity_f1", "token_accuracy")
QA_METRICS: tuple[str, ...] = ("f1", "exact_match")
STS_METRICS: tuple[str, ...] = ("spearman", "pearson")


def check_choice(value: Any, choices: Any, option: str) -> None:
    """Raise naming ``option`` unless ``value`` is one of the ``Literal`` type ``choices`` (the
    command line checks this already; a config built in Python is checked here)."""
    allowed = get_args(choices)
    if value not in allowed:
        raise BertforgeError(f"{option} {value!r}: choose one of {', '.join(allowed)}")


# ---- what the training loops share (TrainConfig, FinetuneConfig) ----


def check_training_options(cfg: Any, option: Callable[[str], str]) -> None:
    """The checks ``TrainConfig`` and ``FinetuneConfig`` share, on ``cfg``'s ``lr``,
    ``warmup_ratio``, ``schedule``, ``precision``, ``dropout`` and counts; ``option(field)`` names
    the command-line option in the message (``--train.warmup_ratio``, ``--warmup_ratio``)."""
    if not cfg.lr > 0:
        raise BertforgeError(f"{option('lr')} {cfg.lr} must be positive, e.g. 1e-4")
    if not 0.0 <= cfg.warmup_ratio < 1.0:
        raise BertforgeError(f"{option('warmup_ratio')} {cfg.warmup_ratio} must lie in [0, 1)")
    check_choice(cfg.schedule, Schedule, option("schedule"))
    if not 0.0 < cfg.decay_ratio <= 1.0:
        raise BertforgeError(f"{option('decay_ratio')} {cfg.decay_ratio} must lie in (0, 1]")
    if cfg.schedule == "trapezoid" and cfg.warmup_ratio + cfg.decay_ratio > 1.0 + 1e-9:
        raise BertforgeError(
            f"{option('warmup_ratio')} {cfg.warmup_ratio} + {option('decay_ratio')} "
            f"{cfg.decay_ratio} exceed 1: a trapezoid's warmup and decay would overlap; lower one"
        )
    check_choice(cfg.precision, Precision, option("precision"))
    if cfg.dropout is not None and not 0.0 <= cfg.dropout < 1.0:
        raise BertforgeError(f"{option('dropout')} {cfg.dropout} must lie in [0, 1)")
    check_at_least(cfg, option, log_every=1, max_nonfinite=1, num_threads=1, max_grad_norm=0)
    if parse_bytes(cfg.max_memory, option("max_memory")) is None:  # 0, none, off: no budget
        cfg.max_memory = None
    # 0, none, off or null: no time budget (unsets one a --config file gave); 3: refused
    budget = parse_budget(cfg.max_time, option("max_time"))
    if budget is None:
        cfg.max_time = None


def check_at_least(cfg: Any, option: Callable[[str], str], **minimums: float) -> None:
    """Raise naming the option when a numeric field of ``cfg`` is below its minimum (None, an
    unset optional value, passes)."""
    for name, low in minimums.items():
        value = getattr(cfg, name)
        if value is not None and value < low:
            raise BertforgeError(f"{option(name)} {value} must be at least {low}")


def check_positive(cfg: Any, option: Callable[[str], str], *names: str) -> None:
    """Raise naming the option when a numeric field of ``cfg`` is not above 0 (NaN included;
    None, an unset optional value, passes)."""
    for name in names:
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise BertforgeError(f"{option(name)} {value} must be positive")


@dataclass(kw_only=True)
class LoopOptions:
    """Options of a training loop with the same meaning and default everywhere: pretraining's
    ``train`` section (``TrainConfig``) and ``bertforge finetune`` (``FinetuneConfig``) add theirs
    to these."""

    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm)."""
    schedule: Schedule = "linear"
    """Decay after warmup: linear, cosine, constant, or trapezoid (the peak held, then 1 - sqrt
    over the last decay_ratio of training: ModernBERT's)."""
    decay_ratio: float = 0.2
    """trapezoid: the fraction of training spent decaying (warmup_ratio + decay_ratio <= 1)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    precision: Precision = "auto"
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
    max_memory: str | None = None
    """A resident-memory budget such as 1.5GB or 800MB: the micro-batch (gradient accumulation
    keeps the batch) and the evaluation batch are the largest whose estimated peak, measured on
    this model at start, stays under it; a run that would not fit even one sequence at a time
    refuses to start and says what would (docs/memory.md). 0 or none: no limit."""


# ---- bertforge pretrain ----------------------------------------------------------------


@dataclass
class ModelSection:
    """The encoder to pretrain: a named size plus overrides. ``vocab_size`` comes from the data's
    tokenizer; the dropout values here are the ones written to ``config.json`` (what fine-tuning
    uses), see ``TrainConfig.dropout`` for the rate during pretraining."""

    architecture: Architecture = "bert"
    """bert (2018: post-LN, position table, segments) or modernbert (pre-norm, rotary
    positions, GeGLU, global and sliding-window layers, no segments: docs/modernbert.md)."""
    preset: Preset = "mini"
    """Named size: tiny (2x128), mini (4x256), small (4x512), medium (8x512), base, large;
    modernbert: tiny, mini (BERT's cost per token), ettin-17m (7x256) and base."""
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
    local_attention: int = 128
    """modernbert: the whole window of its sliding-window layers (a token sees half of it
    either side; every third layer is global)."""

    def __post_init__(self) -> None:
        if self.architecture == "bert" and self.preset not in PRESETS:
            raise BertforgeError(
                f"--model.preset {self.preset} is a ModernBERT size; add --model.architecture "
                f"modernbert or choose one of {', '.join(PRESETS)}"
            )
        if self.architecture == "modernbert" and self.preset not in MODERN_PRESETS:
            raise BertforgeError(
                f"--model.preset {self.preset} has no ModernBERT size; with --model.architecture "
                f"modernbert choose one of {', '.join(MODERN_PRESETS)}"
            )

    def to_model_config(self, vocab_size: int, special: dict[str, int]) -> AnyConfig:
        """The encoder this section describes, sized to a vocabulary; ``special``: the
        tokenizer's ``pad``, ``cls`` and ``sep`` ids (a ModernBERT config names them)."""
        if self.architecture == "bert":
            return self.to_bert_config(vocab_size)
        overrides: dict[str, Any] = {
            "vocab_size": vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_activation": self.hidden_act,
            # BERT's dropout places, as modernbert has them (ModernBERT's own default is 0)
            "embedding_dropout": self.hidden_dropout_prob,
            "mlp_dropout": self.hidden_dropout_prob,
            "attention_dropout": self.attention_probs_dropout_prob,
            "initializer_range": self.initializer_range,
            "local_attention": self.local_attention,
            "pad_token_id": special["pad"],
            "cls_token_id": special["cls"],
            "bos_token_id": special["cls"],
            "sep_token_id": special["sep"],
            "eos_token_id": special["sep"],
        }
        if self.hidden_size is not None:
            base = ModernBertConfig.preset(self.preset)
            overrides["hidden_size"] = self.hidden_size
            overrides["num_attention_heads"] = max(1, self.hidden_size // 64)
            ratio = base.intermediate_size / base.hidden_size
            overrides["intermediate_size"] = round(ratio * self.hidden_size)
        for name in ("num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if getattr(self, name) is not None:
                overrides[name] = getattr(self, name)
        return ModernBertConfig.preset(self.preset, **overrides)

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


ALL_LAYERS = -1
"""``parse_freeze``'s layer count for ``layers:all``."""


def parse_freeze(text: str | None) -> tuple[bool, int]:
    """``--train.freeze``: ``embeddings``, ``layers:N`` (``layers:all``: every encoder layer) or
    both, comma-separated -> (freeze the embeddings, number of lowest encoder layers to freeze,
    ``ALL_LAYERS`` for all). ``embeddings,layers:all`` trains the heads alone."""
    embeddings, layers = False, 0
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if part == "embeddings":
            embeddings = True
            continue
        name, _, count = part.partition(":")
        if name == "layers" and (count.isdigit() or count == "all"):
            layers = ALL_LAYERS if count == "all" else int(count)
            continue
        raise BertforgeError(
            f"--train.freeze {text!r}: write embeddings, layers:N (or layers:all) or both "
            "(embeddings,layers:2)"
        )
    return embeddings, layers


def snapshot_times(tc: TrainConfig) -> list[float]:
    """``--train.snapshots`` in seconds of the budget clock, earliest first; raise, naming the
    fix, for a duration not understood, one given twice, one at or past the end of
    ``--train.max_time`` (the final model is that one) or snapshots without a time budget."""
    if not tc.snapshots:
        return []
    budget = parse_duration(tc.max_time)
    if budget is None:
        raise BertforgeError(
            f"--train.snapshots {' '.join(tc.snapshots)}: snapshots follow the budget clock of "
            "--train.max_time; set one (e.g. --train.max_time 2h), a step budget has no clock"
        )
    seen: dict[float, str] = {}
    for text in tc.snapshots:
        try:
            seconds = parse_duration(text)
        except BertforgeError as err:
            raise BertforgeError(f"--train.snapshots: {err}") from None
        if seconds is None:
            raise BertforgeError(
                f"--train.snapshots {text!r}: a snapshot is a time into the run, e.g. 15m"
            )
        if seconds >= budget:
            raise BertforgeError(
                f"--train.snapshots {text} is not before the end of --train.max_time "
                f"{tc.max_time} (the final model/ is the model at the end); drop it or raise "
                "--train.max_time"
            )
        if seconds in seen:
            raise BertforgeError(
                f"--train.snapshots {seen[seconds]} and {text} are the same time; give it once"
            )
        seen[seconds] = text
    return sorted(seen)


@dataclass
class TrainConfig(LoopOptions):
    """The optimisation: objective, batch, budget, schedule, evaluation and checkpoints."""

    objective: Objective = "mlm_nsp"
    """mlm_nsp (original BERT: masked LM + next-sentence prediction), mlm (masked LM only) or
    rtd (ELECTRA's replaced-token detection: a generator half the encoder's depth fills the
    masked positions, the encoder learns to spot its replacements at every token; the saved
    ``model/`` is the encoder, ``generator/`` the generator's fill-mask model) or
    mlm_contrastive (masked LM + a document-level contrastive loss on the pooler's output: each
    sentence pair of ``--mode nsp`` data is split into its two segments, trained as single
    sequences; the two chunks of an IsNext pair come from one document and must pick each other
    out among the batch, InfoNCE at ``contrastive_temperature``; random-next halves are negatives
    only)."""
    nsp_weight: float = 1.0
    """``--train.objective mlm_nsp``: the weight of the NSP loss next to the MLM loss's 1 (BERT
    adds them unweighted). On the 20-minute IMDB recipe a weight of 3 trained NSP no faster and
    MLM less (docs/pretraining-study.md)."""
    bow_weight: float = 0.0
    """``--train.objective mlm_nsp``: the weight of a bag-of-words loss on the pooler's output
    (0 = off). The pooled [CLS] vector, read through the word embeddings as a softmax over the
    vocabulary, must predict the words of its own sentence pair, frequent words weighed down as
    word2vec subsamples them (a paragraph vector, Le & Mikolov 2014's PV-DBOW, inside BERT): the
    pooler the classifier reads gets a document-level task from step 0, where NSP's signal
    starts at chance."""
    bow_target: BowTarget = "pair"
    """What the bag-of-words loss (``--train.bow_weight``) predicts from a pair's pooled [CLS]:
    ``pair`` the words of both segments; ``shared`` the words the two segments have in common
    (each word's weight in the smaller of its two counts; pairs with none are left out), a
    lexical-overlap target that makes the [CLS] compare the segments as the sentence-pair tasks
    (STS-B, MRPC, RTE) ask it to."""
    similarity_weight: float = 0.0
    """``--train.objective mlm_nsp`` (or ``mlm`` on a ModernBERT, below): the weight of a
    pair-similarity loss on the pooler's output (0 = off). Each pair's target is the cosine between its two segments' bags of word vectors
    (the current word embeddings, frequent words weighed down as word2vec subsamples them; no
    gradient flows into the target); the mean of the pooled [CLS] units must rank the batch's
    pairs as the targets do (one minus their Pearson correlation). The cross-encoder's [CLS]
    learns to compare its two segments, as STS-B, MRPC and RTE ask it to, from a signal that
    by itself ranks STS-B dev at 70-72 Spearman (benchmarks/similarity_target.py;
    docs/pretraining-study.md). A ModernBERT (no pooler, no NSP) trains it with
    ``--train.objective mlm`` on ``--mode nsp`` data: the prediction is its head at the [CLS]
    (what its classifier inherits), the mean of the first half of the units minus that of the
    second (docs/modernbert.md)."""
    contrastive_temperature: float = 0.05
    """``--train.objective mlm_contrastive``: the softmax temperature over cosine similarities
    (SimCSE's 0.05)."""
    batch_size: int = 128
    """Sequences per optimizer step, summed over all processes and accumulation steps."""
    micro_batch_size: int | None = None
    """Sequences per forward pass on one process; the rest is gradient accumulation. None = all."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (set this or max_time; with both, the first reached
    ends training and the LR schedule follows the one further along)."""
    max_time: str | None = None
    """Wall-clock training budget such as 15m or 1h30m; the LR schedule follows elapsed time.
    Evaluation and checkpoint time is not counted. 0 or none: no limit."""
    snapshots: list[str] = field(default_factory=list)
    """Save the model, as the final ``model/`` is saved, to ``snapshots/model-15m/`` (etc.) when
    the budget clock of ``--train.max_time`` passes each of these durations (e.g. 15m 30m 1h),
    each before the end of the budget. The LR schedule follows the whole budget: a 15-minute
    snapshot of a 2-hour run is not a 15-minute run (docs/pretraining.md)."""
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
    compile: bool | None = None
    """Run the model through torch.compile. Unset: on when the device is CUDA (the seconds spent
    compiling are kept out of ``--train.max_time`` and said in the log), off elsewhere;
    ``false`` opts out on a GPU (docs/gpu.md)."""
    compile_mode: CompileMode = "default"
    """torch.compile's mode for a compiled run: ``reduce-overhead`` replays each step as CUDA
    graphs (fewer launches: for small models whose steps wait on the host),
    ``max-autotune-no-cudagraphs`` times Triton matrix-product kernels against cuBLAS and can
    fuse the bias and GELU into the product (compiling takes minutes), ``max-autotune`` both.
    Only ``default`` has been measured here (docs/gpu.md)."""
    profile: int = 0
    """Trace this many steps, after the first 5 (compiling, warm-up), with torch.profiler and
    write ``profile.txt`` (the host's milliseconds per step in each part of the loop, the
    device's busy share, the top operators) and ``profile-trace.json`` (for
    https://ui.perfetto.dev) to the output folder; 0 = off. The traced steps run slower, the
    profiler's cost charged to the budget like any step's (docs/gpu.md)."""
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
    freeze: str | None = None
    """Parameters that do not train: ``embeddings``, ``layers:N`` (the lowest N encoder layers;
    ``layers:all`` every one) or both (``embeddings,layers:2``); cheaper adaptation of a
    published model, and ``embeddings,layers:all`` fits a fresh head alone before adapting the
    rest. Frozen word embeddings also freeze the tied output decoder."""
    fresh_head: FreshHead | None = None
    """How a freshly initialised MLM head starts: ``warm`` (output bias = the training text's log
    token frequencies, transform = identity: the start predicts like a context-free guesser, and
    the first gradients into the encoder are about context, not about frequencies) or ``random``
    (BERT's initialisation). By default ``warm`` for a head the ``--init_from`` checkpoint lacks,
    ``random`` for a fresh model. An initialisation only: the model stays a standard BERT."""

    position_init: PositionInit = "normal"
    """How a fresh model's position table starts: ``normal`` (BERT's initialisation) or
    ``sinusoidal`` (the Transformer's sines and cosines at the same scale: nearby positions start
    alike). An initialisation only: the table trains, the model stays a standard BERT. Not used
    with ``--init_from`` or when resuming."""
    position_init_std: float | None = None
    """``--train.position_init sinusoidal``: the table's standard deviation; by default the
    model's ``initializer_range`` (BERT's 0.02), the scale of its random start. Next to word
    vectors of ``--train.word_init_std`` 0.2, a position table at 0.02 has a tenth of their
    scale (1% of the variance) in the sum the embedding LayerNorm normalises; 0.2 is the IMDB
    recipes'."""
    segment_init_std: float | None = None
    """How a fresh model's segment (token type) table starts: None draws it as BERT does,
    normal(0, ``initializer_range``); a number draws it at that standard deviation, e.g. 0.2 to
    match word and position vectors of 0.2 (docs/pretraining-study.md). An initialisation only.
    Not used with ``--init_from`` or when resuming."""
    special_init_std: float | None = None
    """How a fresh model's special tokens ([CLS], [SEP], [MASK], [UNK]; [PAD] stays zero) start:
    None draws them as BERT does, normal(0, ``initializer_range``); a number draws them at that
    standard deviation, e.g. 0.2 to match co-occurrence word vectors of 0.2. An initialisation
    only. Not used with ``--init_from`` or when resuming."""
    attention_init: AttentionInit = "normal"
    """How a fresh model's attention value and output weights start: ``normal`` (BERT's
    initialisation) or ``identity`` (the identity added to BERT's random draw: with the nearly
    uniform attention of a fresh model, each token's attention output starts as the mean of its
    sequence's embeddings, so [CLS] sees the bag of words from step 0). An initialisation only.
    Not used with ``--init_from`` or when resuming."""
    word_init: WordInit = "normal"
    """How a fresh model's word embeddings start: ``normal`` (BERT's initialisation) or
    ``cooccurrence`` (word vectors factorised from the training split's co-occurrence counts:
    positive PMI and a truncated SVD, Levy et al. 2015; seconds at start-up, charged to the
    time budget). Words that share contexts start alike, which a short run cannot learn for its
    rarer words. An initialisation only: the table trains, the model stays a standard BERT.
    Not used with ``--init_from`` or when resuming."""
    word_init_window: int = 10
    """``--train.word_init cooccurrence``: count context words up to this many tokens away
    (weighted 1/distance)."""
    word_init_std: float = 0.2
    """``--train.word_init cooccurrence``: the vectors' standard deviation. BERT's random start
    has 0.02; the embedding LayerNorm normalises word + position + segment vectors, so a larger
    scale lets the word's meaning dominate the sum (0.1-0.4 measured in
    docs/pretraining-study.md)."""

    def __post_init__(self) -> None:
        parse_freeze(self.freeze)
        check_choice(self.objective, Objective, "--train.objective")
        check_choice(self.compile_mode, CompileMode, "--train.compile_mode")
        if self.fresh_head is not None:
            check_choice(self.fresh_head, FreshHead, "--train.fresh_head")
        check_choice(self.position_init, PositionInit, "--train.position_init")
        check_choice(self.word_init, WordInit, "--train.word_init")
        check_choice(self.attention_init, AttentionInit, "--train.attention_init")
        if self.max_steps is not None and self.max_steps <= 0:
            raise BertforgeError(f"train.max_steps={self.max_steps} must be positive")
        option = lambda name: f"--train.{name}"  # noqa: E731
        check_positive(self, option, "batch_size", "micro_batch_size")
        check_training_options(self, option)
        check_at_least(self, option, eval_every=0, save_every=0, keep_checkpoints=0, eps=0)
        check_at_least(self, option, profile=0)
        check_at_least(self, option, eval_examples=1, eval_batch_size=1)
        check_at_least(self, option, word_init_window=1)
        positive = ("word_init_std", "contrastive_temperature", "segment_init_std")
        check_positive(self, option, *positive, "position_init_std", "special_init_std")
        if not self.nsp_weight >= 0 or not math.isfinite(self.nsp_weight):
            raise BertforgeError(f"--train.nsp_weight {self.nsp_weight} must be 0 or more")
        if self.nsp_weight != 1.0 and self.objective != "mlm_nsp":
            raise BertforgeError(
                f"--train.nsp_weight {self.nsp_weight} weighs the NSP loss of --train.objective "
                f"mlm_nsp; this run's objective is {self.objective}: drop --train.nsp_weight"
            )
        for name in ("bow_weight", "similarity_weight"):  # the pooler's extra losses
            weight = getattr(self, name)
            if not weight >= 0 or not math.isfinite(weight):
                raise BertforgeError(f"--train.{name} {weight} must be 0 or more")
            # mlm: a ModernBERT's similarity loss (check_similarity knows the architecture)
            allowed = ("mlm_nsp", "mlm") if name == "similarity_weight" else ("mlm_nsp",)
            if weight and self.objective not in allowed:
                raise BertforgeError(
                    f"--train.{name} {weight} trains the pooler of --train.objective mlm_nsp"
                    + (" (a ModernBERT's [CLS] head with mlm)" if len(allowed) > 1 else "")
                    + f"; this run's objective is {self.objective}: drop --train.{name}"
                )
        check_choice(self.bow_target, BowTarget, "--train.bow_target")
        if self.bow_target != "pair" and not self.bow_weight:
            raise BertforgeError(
                f"--train.bow_target {self.bow_target} chooses the target of the bag-of-words "
                "loss, which is off: add --train.bow_weight 1 or drop --train.bow_target"
            )
        snapshot_times(self)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise BertforgeError(f"--train.min_lr_ratio {self.min_lr_ratio} must lie in [0, 1]")
        if not all(0.0 <= b < 1.0 for b in self.betas) or len(self.betas) != 2:
            raise BertforgeError(
                f"--train.betas {list(self.betas)}: two values in [0, 1), e.g. [0.9, 0.999]"
            )


@dataclass
class ProbeConfig:
    """An optional downstream check during pretraining: a logistic-regression probe on frozen
    mean-pooled features of a labelled train/test pair, run at step 0, at every evaluation and at
    the end, logged as split ``probe`` in metrics.jsonl and drawn in curves.png."""

    train: str | None = None
    """Labelled file (.csv/.tsv/.jsonl, optionally .gz) the probe is fitted on; None = off."""
    test: str | None = None
    """Labelled file the probe is scored on (keep it out of any model selection)."""
    text_column: str = "text"
    """Column holding the text."""
    label_column: str = "label"
    """Column holding the class label."""
    max_examples: int | None = 1000
    """Rows drawn (fixed seed) from each of train and test; None = all. The probe's cost is two
    forward passes over these rows per evaluation."""
    max_length: int = 128
    """Tokens per text (longer texts keep their beginning)."""
    l2: float = 1e-3
    """L2 penalty on the probe's weights (features are standardised first)."""

    def __post_init__(self) -> None:
        if (self.train is None) != (self.test is None):
            raise BertforgeError(
                "probe.train and probe.test go together: pass both (e.g. --probe.train "
                "train.csv --probe.test test.csv) or neither"
            )
        check_at_least(self, lambda name: f"--probe.{name}", max_examples=2, max_length=8, l2=0)


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
    init_from: str | None = None
    """Start from this model directory instead of a random network: ours or any Hugging Face BERT
    (any task layout, e.g. all-MiniLM-L6-v2, which has no MLM head). Its own config.json and
    tokenizer are used (prepare the data with --tokenizer DIR); heads it lacks start fresh."""
    extra_eval: list[str] | None = None
    """More prepared data directories to evaluate (e.g. out-of-domain text), before and after."""
    model: ModelSection = field(default_factory=ModelSection)
    """The encoder's size and saved dropout."""
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    """Masked-LM target selection."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation, budget, evaluation and checkpoints."""
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """Downstream probe at evaluation points (off unless probe.train and probe.test are set)."""

    def __post_init__(self) -> None:
        if self.init_from is not None:
            self.init_from = resolve_model(self.init_from)
        else:  # with --init_from the checkpoint's architecture counts (setup checks it)
            check_similarity(self.train, self.model.architecture == "modernbert")


def check_similarity(train: TrainConfig, modern: bool) -> None:
    """``--train.similarity_weight`` with ``--train.objective mlm`` trains a ModernBERT's [CLS]
    head; a BERT has its pooler, trained with mlm_nsp: a one-line error saying so."""
    if train.similarity_weight and train.objective == "mlm" and not modern:
        raise BertforgeError(
            f"--train.similarity_weight {train.similarity_weight} trains the pooler of "
            "--train.objective mlm_nsp on a BERT (with mlm, only a ModernBERT's [CLS] head): "
            "use --train.objective mlm_nsp, --model.architecture modernbert or drop "
            "--train.similarity_weight"
        )


# ---- bertforge finetune ----------------------------------------------------------------


def option(name: str) -> str:
    """How ``bertforge finetune`` spells a ``FinetuneConfig`` field on the command line."""
    return "--" + name


TASK_OPTIONS: dict[str, tuple[str, ...]] = {
    "negative_column": ("embedding",),
    "loss": ("embedding",),
    "scale": ("embedding",),
    "pooling": ("embedding",),
    "normalize": ("embedding",),
    "matryoshka_dims": ("embedding",),
    "label_all_tokens": ("token_classification",),
    "normalize_targets": ("regression",),
    "doc_stride": ("question_answering",),
    "max_answer_length": ("question_answering",),
    "truncation": ("classification", "regression", "embedding"),
    "classifier_pooling": ("classification", "regression"),
}
"""The ``bertforge finetune`` options that only some tasks read: given with another task (set
away from its default), the run is refused naming the task, instead of ignoring it."""


def check_task_options(cfg: Any) -> None:
    """Raise when an option of :data:`TASK_OPTIONS` is set for a task that does not read it."""
    defaults = {f.name: f.default for f in fields(cfg)}
    for name, tasks in TASK_OPTIONS.items():
        value = getattr(cfg, name)
        if cfg.task in tasks or value == defaults[name]:
            continue
        shown = " ".join(map(str, value)) if isinstance(value, list) else str(value)
        shown = shown.lower() if isinstance(value, bool) else shown
        which = " or ".join(f"--task {t}" for t in tasks)
        raise BertforgeError(
            f"--{name} {shown} is an option of {which}, not of --task {cfg.task}; drop it"
            + (f" (or use {which})" if len(tasks) == 1 else "")
        )


@dataclass
class FinetuneConfig(LoopOptions):
    """Everything ``bertforge finetune`` needs; written resolved to OUTPUT/finetune_config.json."""

    model: str
    """Starting model directory: our pretrained model or any BERT checkpoint (config.json,
    model.safetensors, vocab.txt or tokenizer.json); all-MiniLM-L6-v2 names the installed copy
    of that published model."""
    train: list[str]
    """Training file(s), each optionally .gz, .bz2, .xz or .zst; several files are concatenated.
    classification, regression, embedding pairs: .csv, .tsv or .jsonl tables, Parquet files
    (or a folder of them) or a datasets save_to_disk folder; token_classification: CoNLL-style
    files (a token and its tag per line) or JSONL with ``tokens``/``tags`` lists;
    question_answering: SQuAD .json or .jsonl rows (docs/tasks.md); embedding: pairs, scored
    pairs or plain texts (docs/embeddings.md)."""
    output: str
    """Output directory for the fine-tuned model, metrics, plots and checkpoints."""
    text_column: str = "text"
    """Column holding the text (the first text for pair tasks; embedding: the anchor)."""
    label_column: str | None = None
    """Column holding the label: class names or integers, or numbers for regression (default
    ``label``); embedding: a similarity score per pair (STS style, trained with CoSENT), none by
    default."""
    text_pair_column: str | None = None
    """Column holding the second text of a pair task (e.g. a title and its description);
    embedding: the positive paired with each anchor (none: plain texts, trained with SimCSE)."""
    negative_column: str | None = None
    """embedding: a column holding a hard negative for each pair (a text close to the anchor but
    not its match), added to the in-batch negatives."""
    task: Task = "classification"
    """classification, regression, token_classification (a tag per word: named entities) or
    question_answering (extractive, SQuAD v1.1 style: --train and --validation are SQuAD .json or
    .jsonl files; see docs/tasks.md) or embedding (sentence vectors saved in the
    sentence-transformers layout; docs/embeddings.md)."""
    allow_rare_labels: bool = False
    """Train labels that look like typos (a class of one row beside classes of five or more, or
    under 20 rows and 1 % of the data, or a word among integer labels) as classes of their own
    instead of stopping."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes that are not UTF-8 (naming file and line); replace: read them as
    U+FFFD."""
    validation: list[str] | None = None
    """Validation file(s); without them a stratified --validation_fraction of train is held out."""
    validation_fraction: float = 0.1
    """Share of the training file held out for validation when no --validation file is given."""
    label_all_tokens: bool = False
    """token_classification: train every piece of a word on its tag (a ``B-X`` as ``I-X`` after
    the first piece), not the first piece alone (transformers' run_ner --label_all_tokens);
    predictions still read the first piece."""
    normalize_targets: bool = True
    """Regression: train on z-scored targets (the saved head is rescaled back to the original units)."""
    max_length: int = 256
    """Tokens per example including [CLS]/[SEP]. classification, regression: longer texts are
    truncated (--truncation); token_classification: longer sentences are split into windows at
    word boundaries, never cut; question_answering: tokens per window of question + context, a
    longer context read in windows overlapping by --doc_stride (384 in BERT's SQuAD runs)."""
    doc_stride: int = 128
    """Question answering: a context longer than one window is read in windows overlapping by
    this many tokens."""
    max_answer_length: int = 30
    """Question answering: the longest answer (in tokens) the decoder may pick."""
    truncation: Truncation = "head"
    """head (keep the beginning), head_tail (first quarter + last three quarters, Sun et al.
    2019) or tail (keep the end)."""
    batch_size: int = 32
    """Examples per optimizer step."""
    micro_batch_size: int | None = None
    """Examples per forward pass, a divisor of --batch_size; the rest is gradient accumulation
    (each micro-batch's loss weighted by its share of the batch's rows). None = the whole batch.
    embedding: the mini-batch of GradCache (sentence-transformers' ``mini_batch_size``): the
    whole batch's embeddings are cached and the backward replayed a mini-batch at a time, the
    gradient that of the whole batch's loss (in-batch negatives stay the whole batch)."""
    eval_batch_size: int = 64
    """Examples per evaluation batch."""
    lr: float = 5e-5
    """Peak learning rate (AdamW)."""
    warmup_ratio: float = 0.1
    """Fraction of training (steps or time) spent warming the LR up linearly from 0."""
    epochs: float = 3.0
    """Passes over the training data (fractions allowed); --max_steps overrides it."""
    max_steps: int | None = None
    """Train for this many optimizer steps, however many epochs that takes (overrides --epochs,
    as transformers' max_steps; the LR schedule ends there)."""
    max_time: str | None = None
    """Wall-clock training budget such as 40m (evaluation time not counted); the LR schedule
    follows whichever of time and steps is further along. 0 or none: no limit."""
    compile: bool | None = None
    """Run the model through torch.compile (the seconds spent compiling are kept out of
    --max_time). Unset: on for a run of at least 5,000 steps on CUDA, off otherwise (compiling
    takes about half a minute and saves a few milliseconds a step: shorter runs lose;
    docs/gpu.md); embedding runs are never compiled."""
    dropout: float | None = None
    """Dropout rate while fine-tuning (hidden, attention, classifier); None keeps the model's.
    On CPU 0 is several times faster: dropout masks cost more than the matrix products there."""
    eval_every: int = 0
    """Evaluate on validation every N steps (0 = once per epoch), and always at the end."""
    patience: int = 0
    """Stop after this many evaluations without improvement of --metric (0 = never stop early)."""
    metric: Metric | None = None
    """Validation metric that picks the best model: accuracy, macro_f1, mcc (default accuracy),
    for regression spearman, pearson, mse, mae (default spearman), for token_classification
    entity_f1 (the default) or token_accuracy, for question_answering f1, exact_match (SQuAD
    v1.1's, default f1), for embedding: spearman or pearson of scored pairs (default spearman),
    mrr@10, ndcg@10, recall@1, recall@10, recall@100 of pairs (retrieval of each anchor's
    positive among all validation positives, default mrr@10), loss of plain texts."""
    bucket: bool | None = None
    """Group examples of similar length into batches (less padding); batches stay shuffled.
    Default: on, except for token_classification, where batches of alike sentences cost entity
    F1 (WNUT-17: 2.2 points, ten seeds; docs/results.md)."""
    loss: EmbeddingLoss = "auto"
    """embedding: in_batch_negatives (MultipleNegativesRankingLoss: each anchor against every
    positive and hard negative of the batch), in_batch_symmetric (and each positive against the
    anchors), cosent (scored pairs), simcse (plain texts, dropout noise as the positive); auto
    picks cosent for scored pairs, in_batch_negatives for pairs, simcse for plain texts."""
    scale: float = 20.0
    """embedding: the factor on cosine similarities in the loss (20 = temperature 0.05)."""
    classifier_pooling: ClassifierPooling | None = None
    """classification, regression from a ModernBERT: what its head reads, ``cls`` (the [CLS]
    state) or ``mean`` (the mean of the real tokens' states, as the published ModernBERT
    checkpoints are configured); default the model's config.json (transformers' default cls).
    A BERT classifies from its pooler over [CLS] and refuses it."""
    pooling: PoolingMode | None = None
    """embedding: how token states become one vector (cls, mean, max, mean_sqrt_len); default the
    start model's declaration (1_Pooling/config.json), else mean."""
    normalize: bool | None = None
    """embedding: save the model with a Normalize module (unit-length vectors); default as the
    start model declares (all-MiniLM-L6-v2: yes), else no. The losses use cosines either way."""
    matryoshka_dims: list[int] | None = None
    """embedding: also train the vector's first k dimensions for each k given (Matryoshka, e.g.
    384 256 128 64: the loss summed over the cuts), so a shorter prefix is a usable embedding."""
    seed: int = 0
    """Seed for the head's initialisation, validation split, data order and dropout."""
    keep_checkpoints: int = 1
    """Resumable checkpoints (written at each evaluation and on SIGINT/SIGTERM) to keep."""
    keep_final_checkpoint: bool = False
    """Keep the resumable checkpoint (weights + optimizer state, about 3x the model) after a
    finished run; by default it is deleted and only the fine-tuned model stays."""

    def __post_init__(self) -> None:
        self.model = resolve_model(self.model)
        check_choice(self.task, Task, "--task")
        check_choice(self.truncation, Truncation, "--truncation")
        if self.classifier_pooling is not None:
            check_choice(self.classifier_pooling, ClassifierPooling, "--classifier_pooling")
        if self.task == "embedding":
            self._check_embedding()
        elif self.label_column is None:
            self.label_column = "label"
        check_choice(self.encoding_errors, EncodingErrors, "--encoding_errors")
        check_max_length(
            self.max_length, 4 if self.text_pair_column else 3, "[CLS], [SEP] and one token"
        )
        check_positive(self, option, "batch_size", "eval_batch_size", "epochs")
        check_training_options(self, option)
        check_at_least(self, option, max_steps=1, eval_every=0, patience=0, keep_checkpoints=0)
        check_at_least(self, option, micro_batch_size=1, doc_stride=0, max_answer_length=1)
        if self.task == "question_answering" and self.doc_stride >= self.max_length - 4:
            raise BertforgeError(
                f"--doc_stride {self.doc_stride} must be below --max_length {self.max_length} "
                "minus the question and 3 special tokens; lower it (128 with --max_length 384)"
            )
        if self.batch_size % self.micro_batch:
            raise BertforgeError(
                f"--micro_batch_size {self.micro_batch_size} does not divide --batch_size "
                f"{self.batch_size}; choose a divisor"
            )
        default = {
            "regression": "spearman",
            "token_classification": "entity_f1",
            "question_answering": "f1",
            "embedding": self.embedding_kind_metrics[0],
        }
        self.metric = self.metric or default.get(self.task, "accuracy")
        if self.bucket is None:  # embedding: ranking against unbucketed in-batch negatives
            self.bucket = self.task not in ("token_classification", "embedding")
        allowed = {
            "regression": REGRESSION_METRICS,
            "token_classification": TAGGING_METRICS,
            "question_answering": QA_METRICS,
            "embedding": self.embedding_kind_metrics,
        }.get(self.task, CLASSIFICATION_METRICS)
        if self.metric not in allowed:
            raise BertforgeError(
                f"--metric {self.metric!r} does not fit --task {self.task}; "
                f"choose one of {', '.join(allowed)}"
            )
        check_task_options(self)  # after the values' own checks: a bad value is said first

    @property
    def micro_batch(self) -> int:
        """Examples per forward pass: --micro_batch_size, at most the batch (as in pretraining)."""
        return min(self.micro_batch_size or self.batch_size, self.batch_size)

    @property
    def embedding_kind_metrics(self) -> tuple[str, ...]:
        """The validation metrics of an embedding run's data: STS of scored pairs, retrieval of
        pairs, the loss of plain texts (the first is the default)."""
        if self.label_column:
            return STS_METRICS
        return RETRIEVAL_METRICS if self.text_pair_column else ("loss",)

    @property
    def embedding_loss(self) -> str:
        """The loss of an embedding run: --loss, or the one its data asks for."""
        if self.loss != "auto":
            return self.loss
        if self.label_column:
            return "cosent"
        return "in_batch_negatives" if self.text_pair_column else "simcse"

    def _check_embedding(self) -> None:
        """``--task embedding``'s options: a loss that fits the data's columns, a positive
        scale, Matryoshka cuts in decreasing order."""
        check_choice(self.loss, EmbeddingLoss, "--loss")
        if self.pooling is not None:
            check_choice(self.pooling, PoolingMode, "--pooling")
        needs = {
            "cosent": (self.label_column, "scored pairs: --text_pair_column and --label_column"),
            "simcse": (not self.text_pair_column, "plain texts: drop --text_pair_column"),
            "in_batch_negatives": (
                self.text_pair_column and not self.label_column,
                "pairs: --text_pair_column without --label_column",
            ),
        }
        needs["in_batch_symmetric"] = needs["in_batch_negatives"]
        loss = self.embedding_loss
        if not needs[loss][0]:
            raise BertforgeError(f"--loss {loss} trains on {needs[loss][1]}")
        if self.negative_column and loss == "in_batch_symmetric":
            raise BertforgeError(
                "--loss in_batch_symmetric takes no --negative_column (the positives' view has "
                "no negatives); use --loss in_batch_negatives or drop the column"
            )
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise BertforgeError(f"--scale {self.scale} must be a positive number (20 is usual)")
        dims = self.matryoshka_dims
        if dims is not None and (
            not dims or min(dims) < 1 or sorted(set(dims), reverse=True) != list(dims)
        ):
            raise BertforgeError(
                f"--matryoshka_dims {dims}: distinct positive sizes, largest first "
                "(e.g. 384 256 128 64)"
            )


__all__ = [
    "FINETUNE_CONFIG",
    "FinetuneConfig",
    "LoopOptions",
    "MaskingConfig",
    "ModelSection",
    "PretrainConfig",
    "ProbeConfig",
    "TrainConfig",
    "check_at_least",
    "check_positive",
    "check_training_options",
    "ALL_LAYERS",
    "parse_freeze",
    "snapshot_times",
]
