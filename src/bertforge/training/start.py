"""How a pretraining run's weights start, one function per variant: the initialisations of the
pretraining study (``docs/pretraining-study.md``) that replace part of BERT's random start of a
fresh model, the warm start of a fresh MLM head, and freezing.

:data:`FRESH_STARTS` lists the variants of a fresh model in the order they are applied (the
order is part of the result: some draw from the global RNG); each row says which option asks
for it. ``training/setup.py`` walks the list; a new variant is a function here, its row and its
test in ``tests/test_start.py`` (plus its option in ``TrainConfig``).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from bertforge.data.dataset import META_FILE, PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.io import atomic_file
from bertforge.modeling.auto import word_table
from bertforge.modeling.config import ModernBertConfig
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining, cooccurrence_vectors
from bertforge.progress import format_duration, parse_duration
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
    bert_only: str = ""
    """Why a ModernBERT cannot start this way (it has no such table or head); empty: it can."""


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
        bert_only="ModernBERT has rotary positions, no position table to start",
    ),
    Variant(
        "--train.segment_init_std",
        lambda t: t.segment_init_std is not None,
        segment_table,
        bert_only="ModernBERT has no token types, so no segment table",
    ),
    Variant(
        "--train.special_init_std",
        lambda t: t.special_init_std is not None,
        special_tokens,
        bert_only="the special tokens' redraw is built for BERT's embeddings only",
    ),
    Variant(
        "--train.attention_init identity",
        lambda t: t.attention_init == "identity",
        identity_attention,
        bert_only="the identity start is built for BERT's separate value and output weights",
    ),
    Variant(
        "--train.fresh_head warm",
        lambda t: t.fresh_head == "warm",
        warm_head,
        bert_only="the warm head is built for BERT's MLM head (cls.predictions)",
    ),
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
    order; returns each with what it did and its seconds. A start a ModernBERT has no table
    for is a one-line error before any is applied."""
    if isinstance(model.config, ModernBertConfig):
        for variant in FRESH_STARTS:
            if variant.bert_only and variant.asked(cfg.train):
                raise BertforgeError(
                    f"{variant.option}: {variant.bert_only}; drop it for --model.architecture "
                    "modernbert"
                )
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


COOCCURRENCE_CACHE = "cooccurrence-window{window}.safetensors"
"""Where ``--train.word_init cooccurrence`` keeps its counts, in the prepared data folder (not
the run's: a rerun in a new or emptied output folder reads them instead of counting again)."""
COUNT_PROBE_TOKENS = 1_000_000
"""Tokens counted first, timed, to foresee the whole count's time before spending it."""
COUNT_SECONDS_PER_TOKEN = 0.5e-6
"""Seconds to count one token at one distance of the window (5 s for 1M tokens at window 10,
on one AMD EPYC core, 2026-12; two threads are no faster: the counting is a scatter-add)."""
FACTORISE_SECONDS = 5.0
"""The PPMI and truncated SVD of an 8,192 x 8,192 count matrix (one AMD EPYC core)."""


def count_seconds(tokens: int, window: int) -> float:
    """The foreseen seconds of ``--train.word_init cooccurrence`` on ``tokens`` tokens: counting
    at every distance of ``window`` (:data:`COUNT_SECONDS_PER_TOKEN`), then factorising."""
    return tokens * window * COUNT_SECONDS_PER_TOKEN + FACTORISE_SECONDS


def cooccurrence_cache(data_dir: str | Path, window: int) -> Path:
    """The file :func:`init_word_vectors` keeps its counts in for a data folder and window."""
    return Path(data_dir) / COOCCURRENCE_CACHE.format(window=window)


def _cache_key(train: PretrainingDataset, window: int) -> dict[str, str]:
    """What the cached counts depend on besides the contexts: the data (its meta.json, which
    names every shard's size and the tokenizer), the window and the tokens counted."""
    meta = hashlib.sha256((train.data_dir / META_FILE).read_bytes()).hexdigest()
    return {"meta_sha256": meta, "window": str(window), "max_tokens": str(WORD_INIT_TOKENS)}


def read_cached_counts(
    path: Path, train: PretrainingDataset, contexts: np.ndarray, window: int
) -> torch.Tensor | None:
    """The counts cached at ``path`` when they were counted from this data with these contexts
    and window, else None (a missing, stale or unreadable file is counted again)."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            if f.metadata() != _cache_key(train, window):
                return None
            if not torch.equal(f.get_tensor("contexts"), torch.from_numpy(contexts)):
                return None
            return f.get_tensor("counts")
    except (OSError, SafetensorError, KeyError):
        return None


def write_cached_counts(
    path: Path, train: PretrainingDataset, contexts: np.ndarray, window: int, counts: torch.Tensor
) -> str:
    """Keep ``counts`` at ``path`` (atomic); what happened, for the log (a read-only data folder
    is said, not an error)."""
    tensors = {"counts": counts.contiguous(), "contexts": torch.from_numpy(contexts)}
    try:
        with atomic_file(path) as tmp:
            save_file(tensors, str(tmp), metadata=_cache_key(train, window))
    except (BertforgeError, OSError) as err:
        return f"not kept ({err})"
    return f"kept in {path}"


def counted_cooccurrences(
    cfg: PretrainConfig, data: StartData, vocab: int, contexts: np.ndarray, tokens: int
) -> tuple[torch.Tensor, str]:
    """The co-occurrence counts of ``init_word_vectors``: read from the data folder's cache, or
    counted (after a timed sample that refuses a count the time budget cannot hold) and kept
    there. Returns them and where they came from, for the log."""
    train, window = data.train, cfg.train.word_init_window
    special = data.tokenizer.special_ids
    cache = cooccurrence_cache(train.data_dir, window)
    counts = read_cached_counts(cache, train, contexts, window)
    if counts is not None:
        return counts, f"read from {cache}"
    budget = parse_duration(cfg.train.max_time)
    if budget is not None and tokens > 2 * COUNT_PROBE_TOKENS:
        started = time.perf_counter()
        train.cooccurrence_counts(vocab, contexts, window, special, COUNT_PROBE_TOKENS)
        foreseen = (time.perf_counter() - started) * tokens / COUNT_PROBE_TOKENS
        if foreseen >= budget:
            raise BertforgeError(
                f"--train.word_init cooccurrence would take about {format_duration(foreseen)} "
                f"to count {tokens:,} tokens, more than the whole --train.max_time "
                f"{cfg.train.max_time}; give a larger budget or use --train.word_init normal"
            )
        print(
            f"counting co-occurrences of {tokens:,} tokens: about {format_duration(foreseen)}",
            file=sys.stderr,
            flush=True,
        )
    counts = train.cooccurrence_counts(vocab, contexts, window, special, WORD_INIT_TOKENS)
    return counts, write_cached_counts(cache, train, contexts, window, counts)


def init_word_vectors(model: torch.nn.Module, cfg: PretrainConfig, data: StartData) -> str:
    """``--train.word_init cooccurrence``: count the training split's co-occurrences (or read
    them from the data folder's cache, :func:`counted_cooccurrences`), factorise them
    (:func:`~bertforge.modeling.model.cooccurrence_vectors`) and start the rows of the model's
    word table (its ``word_table``, BERT's or ModernBERT's) there; returns what it did, for
    the log."""
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
    counts, source = counted_cooccurrences(cfg, data, vocab, contexts, int(frequency.sum()))
    vectors, rows = cooccurrence_vectors(
        counts, model.config.hidden_size, tc.word_init_std, seed=tc.seed
    )
    table = word_table(model)  # either kind
    with torch.no_grad():  # other rows and columns keep their start; everything still trains
        table[rows, : vectors.shape[1]] = vectors[rows].to(table.dtype)
    return (
        f"word embeddings start from co-occurrence vectors: {int(rows.sum()):,} of {vocab:,} "
        f"words, {vectors.shape[1]} dimensions, window {tc.word_init_window}, "
        f"{int(frequency.sum()):,} tokens counted"  # token_counts stops at WORD_INIT_TOKENS
        f"; the counts {source}"
    )


__all__ = [
    "COOCCURRENCE_CACHE",
    "FRESH_STARTS",
    "WARM_HEAD_PARAMETERS",
    "Variant",
    "cooccurrence_cache",
    "cooccurrence_words",
    "count_seconds",
    "counted_cooccurrences",
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
