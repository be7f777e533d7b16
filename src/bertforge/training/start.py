"""How a pretraining run's weights start, one function per variant: the initialisations of the
pretraining study (``docs/pretraining-study.md``) that replace part of BERT's random start of a
fresh model, the warm start of a fresh MLM head, and freezing.

:data:`FRESH_STARTS` lists the variants of a fresh model in the order they are applied (the
order is part of the result: some draw from the global RNG); each row says which option asks
for it. ``training/setup.py`` walks the list; a new variant is a function here, its row and its
test in ``tests/test_start.py`` (plus its option in ``TrainConfig``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from bertforge.data.dataset import PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining, cooccurrence_vectors
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import ALL_LAYERS, PretrainConfig, TrainConfig, parse_freeze


class StartData(Protocol):
    """What a start reads of the run's data (``setup.PretrainingData`` has it)."""

    tokenizer: Tokenizer
    train: PretrainingDataset


StartFunction = Callable[[Any, PretrainConfig, StartData], str]
"""``(model, cfg, data) -> what it did`` (a line for the log)."""


@dataclass(frozen=True)
class Variant:
    """One way a fresh model starts other than BERT's random initialisation."""

    option: str
    """The option (and value) that asks for it, e.g. ``--train.position_init sinusoidal``."""
    asked: Callable[[TrainConfig], bool]
    """Whether the run's ``--train.*`` options ask for it."""
    start: StartFunction
    """Applies it to a fresh model."""
    instead: str = ""
    """With ``charged``: the option that avoids the cost (said when it eats the budget)."""
    charged: bool = False
    """Start-up work that grows with the corpus: its seconds count against the time budget, and
    it runs after the model is built (its line is printed with its time)."""


# ---- the variants of a fresh model --------------------------------------------------------------


def sine_positions(model: Any, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.position_init sinusoidal``: the position table starts as the Transformer's sines
    and cosines (:func:`~bertforge.modeling.model.sinusoidal_positions`) at
    ``--train.position_init_std`` (default ``initializer_range``)."""
    model.init_sinusoidal_positions(cfg.train.position_init_std)
    return "position table: sines and cosines"


def segment_table(model: Any, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.segment_init_std``: the segment table redrawn at that standard deviation."""
    model.init_segment_embeddings(cfg.train.segment_init_std)
    return f"segment table: normal(0, {cfg.train.segment_init_std})"


def special_tokens(model: Any, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.special_init_std``: the special tokens' word vectors ([PAD] stays zero)
    redrawn at that standard deviation."""
    special = sorted(data.tokenizer.special_ids)
    model.init_special_embeddings(special, cfg.train.special_init_std)
    return f"special tokens: normal(0, {cfg.train.special_init_std})"


def identity_attention(model: Any, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.attention_init identity``: the identity added to every layer's value and
    attention-output weights."""
    model.init_identity_attention()
    return "attention value and output weights: + identity"


def warm_head(model: Any, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.fresh_head warm`` on a fresh model: :func:`warm_fresh_head` of the whole head
    (a model without an MLM head, rtd's, keeps its start)."""
    if not hasattr(model, "cls"):
        return "no MLM head to warm"
    counts = head_warm_counts(data.train, data.tokenizer, model.config.vocab_size)
    return "; ".join(warm_fresh_head(model, WARM_HEAD_PARAMETERS, counts))


def cooccurrence_words(model: Any, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.word_init cooccurrence``: :func:`init_word_vectors`."""
    return init_word_vectors(model, cfg, data)


FRESH_STARTS: tuple[Variant, ...] = (
    Variant(
        "--train.position_init sinusoidal",
        lambda t: t.position_init == "sinusoidal",
        sine_positions,
    ),
    Variant("--train.segment_init_std", lambda t: t.segment_init_std is not None, segment_table),
    Variant("--train.special_init_std", lambda t: t.special_init_std is not None, special_tokens),
    Variant(
        "--train.attention_init identity",
        lambda t: t.attention_init == "identity",
        identity_attention,
    ),
    Variant("--train.fresh_head warm", lambda t: t.fresh_head == "warm", warm_head),
    Variant(
        "--train.word_init cooccurrence",
        lambda t: t.word_init == "cooccurrence",
        cooccurrence_words,
        instead="--train.word_init normal",
        charged=True,
    ),
)
"""The variants of a fresh model, in the order they are applied."""


def own_start(train: TrainConfig) -> list[str]:
    """The options of :data:`FRESH_STARTS` that ``train`` asks for ([] = BERT's start)."""
    return [v.option for v in FRESH_STARTS if v.asked(train)]


def start_fresh(
    model: Any, cfg: PretrainConfig, data: StartData, *, charged: bool
) -> list[tuple[Variant, str, float]]:
    """Apply the asked variants of :data:`FRESH_STARTS` whose ``charged`` is ``charged``, in
    order; returns each with what it did and its seconds."""
    done = []
    for variant in FRESH_STARTS:
        if variant.charged == charged and variant.asked(cfg.train):
            started = time.perf_counter()
            note = variant.start(model, cfg, data)
            done.append((variant, note, time.perf_counter() - started))
    return done


# ---- freezing (any start: fresh, --init_from or resumed) ---------------------------------------


def freeze_parameters(model: torch.nn.Module, freeze: str | None) -> list[str]:
    """Stop gradients into the embeddings and/or the lowest N encoder layers (``--train.freeze``);
    returns the frozen modules' names. Frozen word embeddings also freeze the tied output
    decoder (the head's transform and bias still train)."""
    embeddings, layers = parse_freeze(freeze)
    if not freeze:
        return []
    base = getattr(model, "bert", None) or getattr(model, "model", model)
    where = "encoder.layer" if hasattr(base, "encoder") else "layers"  # BERT's, ModernBERT's
    total = len(base.get_submodule(where))
    if layers == ALL_LAYERS:
        layers = total
    if layers > total:
        raise BertforgeError(
            f"--train.freeze {freeze}: the model has {total} layers; freeze at most {total}"
        )
    frozen = (["embeddings"] if embeddings else []) + [f"{where}.{i}" for i in range(layers)]
    for name in frozen:
        base.get_submodule(name).requires_grad_(False)
    return frozen


# ---- a warm MLM head (fresh model, or a head the --init_from checkpoint lacks) -------------------


def warm_fresh_head(
    model: BertForPreTraining | BertForMaskedLM, missing: list[str], counts: torch.Tensor
) -> list[str]:
    """Start a freshly initialised MLM head where a context-free guesser stands instead of at
    noise (a random head's first predictions are uniform over the vocabulary and its first
    gradients into the encoder are noise): the output bias becomes the log frequency of each
    token in ``counts`` (add-0.5 smoothed, mean 0; special tokens, which are never masked, get
    the floor), the transform's dense layer the identity, so the encoder's last hidden states
    meet the tied word embeddings as they are. Only parameters in ``missing`` change; returns
    what was set. On all-MiniLM-L6-v2 and IMDB text the start moves from 0.02% to 8.7%
    held-out masked-token accuracy (docs/results.md)."""
    head = model.cls.predictions
    done: list[str] = []
    with torch.no_grad():
        if "cls.predictions.bias" in missing:
            log_p = torch.log((counts.double() + 0.5) / (counts.double() + 0.5).sum())
            head.bias.copy_((log_p - log_p.mean()).to(head.bias.dtype))
            done.append("cls.predictions.bias = log token frequencies of the training text")
        dense = head.transform.dense
        if "cls.predictions.transform.dense.weight" in missing:
            dense.weight.copy_(torch.eye(dense.weight.shape[0], dtype=dense.weight.dtype))
            if "cls.predictions.transform.dense.bias" in missing:
                dense.bias.zero_()
            done.append("cls.predictions.transform.dense = identity")
    return done


WARM_HEAD_PARAMETERS = [
    "cls.predictions.bias",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
]
"""What ``warm_fresh_head`` sets in a fresh model (``--train.fresh_head warm`` without
``--init_from``)."""

WARM_HEAD_TOKENS = 50_000_000
"""Tokens of the training text counted for a warm head's bias: plenty for a unigram estimate,
and start-up stays seconds on a corpus of billions."""


def head_warm_counts(
    train: PretrainingDataset, tokenizer: Tokenizer, vocab_size: int
) -> torch.Tensor:
    """Token counts of the training split for ``warm_fresh_head`` (one per id of a model with
    ``vocab_size`` words), special tokens zeroed."""
    counts = train.token_counts(vocab_size, tokenizer.special_ids, WARM_HEAD_TOKENS)
    return torch.from_numpy(counts)


# ---- co-occurrence word vectors ----------------------------------------------------------------

WORD_INIT_TOKENS = 50_000_000
"""Tokens of the training text counted for ``--train.word_init cooccurrence``: 31M took ~10 s
on two cores (AMD EPYC Zen 4), and more text hardly changes the vectors of a small model."""
WORD_INIT_CONTEXTS = 8192
"""Context words of the co-occurrence matrix: the most frequent ones (all of a vocabulary this
small), which keeps the matrix at vocabulary x 8,192 for a vocabulary of any size."""


def init_word_vectors(model: torch.nn.Module, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.word_init cooccurrence``: count the training split's co-occurrences, factorise
    them (:func:`~bertforge.modeling.model.cooccurrence_vectors`) and start the model's word
    embeddings there; returns what it did, for the log."""
    tc, vocab = cfg.train, model.config.vocab_size
    special = data.tokenizer.special_ids
    frequency = data.train.token_counts(vocab, special, WORD_INIT_TOKENS)
    contexts = np.sort(np.argsort(-frequency, kind="stable")[:WORD_INIT_CONTEXTS])
    contexts = contexts[frequency[contexts] > 0]
    if len(contexts) < 2:
        raise BertforgeError(
            f"{cfg.data}: too few distinct tokens for --train.word_init cooccurrence; "
            "use --train.word_init normal"
        )
    counts = data.train.cooccurrence_counts(
        vocab, contexts, tc.word_init_window, special, WORD_INIT_TOKENS
    )
    vectors, rows = cooccurrence_vectors(
        counts, model.config.hidden_size, tc.word_init_std, seed=tc.seed
    )
    model.init_word_vectors(vectors, rows)
    return (
        f"word embeddings start from co-occurrence vectors: {int(rows.sum()):,} of {vocab:,} "
        f"words, {vectors.shape[1]} dimensions, window {tc.word_init_window}, "
        f"{int(frequency.sum()):,} tokens counted"  # token_counts stops at WORD_INIT_TOKENS
    )


__all__ = [
    "FRESH_STARTS",
    "WARM_HEAD_PARAMETERS",
    "Variant",
    "cooccurrence_words",
    "freeze_parameters",
    "head_warm_counts",
    "identity_attention",
    "init_word_vectors",
    "own_start",
    "segment_table",
    "sine_positions",
    "special_tokens",
    "start_fresh",
    "warm_fresh_head",
    "warm_head",
]
