"""TinyBERT's data augmentation for ``bertforge distill --augment MODEL``: more training texts made
from the labelled ones by replacing words with what a masked-language model predicts in their
place; the teacher labels the new texts (they carry no gold labels), so the student sees the
teacher's decision surface around every training example (Jiao et al. 2020, "TinyBERT", sec.
3.2: without it, their 4-layer student lost about 20 points of CoLA).

The procedure, as theirs: for each word of a text that the augmenter's vocabulary holds as one
piece, mask it (in the text as written, one word at a time) and keep the model's top ``K``
whole-word predictions; then each of ``copies`` new texts replaces each such word, with
probability ``rate``, by one of its candidates drawn uniformly. TinyBERT took candidates for the
words BERT splits into several pieces from GloVe neighbours; no word vectors ship here, so those
words are kept. Only words of letters are replaced (punctuation, numbers and the parts of
contractions stay), and a replacement takes the case of the word it replaces. Pairs: each side is augmented on its own.

The math (:func:`augmented_copies`) is a pure function of the candidates and a seed; the
model's part (:func:`word_candidates`) runs once per replaceable word, not once per copy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import BertforgeError
from bertforge.inference.loading import LoadOptions, load_model, other_task
from bertforge.inference.predict import fill_mask
from bertforge.modeling.config import CONFIG_NAME, load_config
from bertforge.modeling.model import BertForMaskedLM

WORD = re.compile(r"[^\W\d_]+")
"""A word that may be replaced: a run of letters (any script)."""

Span = tuple[int, int]


@dataclass(frozen=True)
class Augmented:
    """The new training rows: texts (and second texts) and the labelled row each came from."""

    texts: list[str]
    pairs: list[str] | None
    source: list[int]

    def __len__(self) -> int:
        return len(self.texts)


def matching_case(word: str, original: str) -> str:
    """``word`` in the case of ``original``: all capitals, a capital first letter, or as is."""
    if len(original) > 1 and original.isupper():
        return word.upper()
    if original[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def augmented_copies(
    text: str,
    spans: Sequence[Span],
    candidates: Sequence[Sequence[str]],
    copies: int,
    rate: float,
    rng: np.random.Generator,
) -> list[str]:
    """Up to ``copies`` distinct variants of ``text``, none equal to it: each word ``spans[i]``
    (character offsets) replaced with probability ``rate`` by a uniform draw from
    ``candidates[i]`` (in the word's case); a word without candidates is kept. A variant drawn
    twice, or with nothing replaced, is dropped, so fewer come back for a text with few
    replaceable words. ``copies`` rounds of draws are made whatever the result, so the number of
    random draws (and the next text's) does not depend on what was dropped."""
    if len(spans) != len(candidates):
        raise ValueError("one candidate list per span")
    seen = {text}
    out: list[str] = []
    for _ in range(copies):
        draws = rng.random(len(spans))
        picks = rng.integers(0, 1 << 30, size=len(spans))
        variant = text
        for i in reversed(range(len(spans))):  # right to left: earlier offsets stay valid
            options = candidates[i]
            if not options or draws[i] >= rate:
                continue
            start, end = spans[i]
            word = matching_case(options[int(picks[i]) % len(options)], text[start:end])
            variant = variant[:start] + word + variant[end:]
        if variant not in seen:
            seen.add(variant)
            out.append(variant)
    return out


APOSTROPHES = "'\u2019"
"""A run of letters beside one of these is part of a contraction or possessive ("won't", "I'm",
"John's"): kept, since a word put in its place ("won'that") is no longer English."""


def replaceable_words(tokenizer: Any, text: str) -> list[Span]:
    """Character spans of the words of ``text`` (runs of letters, not touching an apostrophe)
    that ``tokenizer`` reads as one known piece (not [UNK]): the words an MLM can propose a
    whole replacement for."""
    spans = [
        (s, e)
        for s, e in (m.span() for m in WORD.finditer(text))
        if (s == 0 or text[s - 1] not in APOSTROPHES)
        and (e == len(text) or text[e] not in APOSTROPHES)
    ]
    if not spans:
        return []
    words = [text[s:e] for s, e in spans]
    encoded = tokenizer.backend.encode_batch(words, add_special_tokens=False)
    unk = tokenizer.token_to_id(tokenizer.backend.model.unk_token)
    return [
        span
        for span, enc in zip(spans, encoded, strict=True)
        if len(enc.ids) == 1 and enc.ids[0] != unk
    ]


def word_candidates(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    spans: Sequence[Sequence[Span]],
    k: int,
    *,
    batch_size: int,
    precision: str,
    progress: bool = False,
) -> list[list[list[str]]]:
    """For each text and each of its word ``spans``, the ``model``'s ``k`` likeliest whole words
    in that word's place (the word masked, the rest of the text as written), likeliest first;
    the word itself, special tokens, word pieces (``##``) and tokens without a letter are left
    out. One masked copy of a text per word runs through ``model`` (a masked-LM)."""
    mask = tokenizer.id_to_token(tokenizer.mask_id)
    masked: list[str] = []
    for text, text_spans in zip(texts, spans, strict=True):
        masked += [text[:s] + mask + text[e:] for s, e in text_spans]
    if not masked:
        return [[] for _ in texts]
    special = set(tokenizer.special_ids)
    # room for the tokens the filter drops (pieces, punctuation, the word itself)
    results = fill_mask(
        model,
        tokenizer,
        masked,
        top_k=k * 3 + 8,
        batch_size=batch_size,
        precision=precision,
        progress=progress,
    )
    out: list[list[list[str]]] = []
    at = 0
    for text, text_spans in zip(texts, spans, strict=True):
        per_word = []
        for s, e in text_spans:
            original = text[s:e].lower()
            kept: list[str] = []
            for guess in results[at]["masks"][0]:
                token = guess["token"]
                if (
                    guess["id"] in special
                    or token.startswith("##")
                    or not WORD.fullmatch(token)
                    or token.lower() == original
                ):
                    continue
                kept.append(token)
                if len(kept) == k:
                    break
            per_word.append(kept)
            at += 1
        out.append(per_word)
    return out


MLM_HEAD = "cls.predictions.transform"
"""The weights a masked-LM head has (transformers' BERT names; ModernBERT's are mapped)."""


def load_augmenter(directory: str, device: str, batch_size: int) -> tuple[Any, Any, dict[str, Any]]:
    """The ``--augment`` model on ``device``, its tokenizer and the options :func:`augment` takes;
    a model without a masked-LM head, or with a vocabulary that is not WordPiece, is refused."""
    why = (
        "--augment needs a model with a masked-LM head (a bertforge pretrain output, or any "
        "BERT/ModernBERT masked LM); this checkpoint has none"
    )
    if (Path(directory) / CONFIG_NAME).is_file() and other_task(
        load_config(directory), BertForMaskedLM
    ):  # a fine-tuned model: its MLM head was dropped (load_model would name its command)
        raise BertforgeError(f"--augment {directory}: {why}")
    options = LoadOptions(model=directory, device=device, batch_size=batch_size)
    model, tokenizer, settings = load_model(BertForMaskedLM, options, require=(MLM_HEAD, why))
    if not tokenizer.wordpiece:
        raise BertforgeError(
            f"--augment {directory}: its tokenizer is not WordPiece; augmentation needs a "
            "WordPiece vocabulary (whole words as single pieces) for now"
        )
    settings.pop("progress", None)
    return model.eval(), tokenizer, settings


def paired_rows(
    variants: Sequence[Sequence[str]], text: str, pair: str | None
) -> list[tuple[str, str | None]]:
    """One example's new rows from its sides' ``variants`` (one list for a single text, two for
    a pair): as many rows as the side with more variants, the other side keeping its own text
    (``text`` or ``pair``) in the rows past its variants."""
    if pair is None:
        return [(v, None) for v in variants[0]]
    first, second = variants
    return [
        (first[j] if j < len(first) else text, second[j] if j < len(second) else pair)
        for j in range(max(len(first), len(second)))
    ]


def augment(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    *,
    copies: int,
    rate: float,
    k: int,
    seed: int,
    batch_size: int,
    precision: str,
    progress: bool = False,
) -> Augmented:
    """``copies`` variants of each labelled example (each side of a pair on its own), in the
    examples' order; a variant equal to its example or to another of its variants is dropped.
    Row ``i``'s draws come from a generator seeded by ``(seed, i)``, so a run's texts do not
    depend on the batch size or on the other rows."""
    if model.config.vocab_size != tokenizer.vocab_size:
        raise BertforgeError("the augmenter's tokenizer does not match its model")
    sides = [list(texts)] + ([list(pairs)] if pairs is not None else [])
    tables = []
    for side in sides:
        spans = [replaceable_words(tokenizer, t) for t in side]
        cands = word_candidates(
            model, tokenizer, side, spans, k,
            batch_size=batch_size, precision=precision, progress=progress,
        )  # fmt: skip
        tables.append((spans, cands))
    new_texts: list[str] = []
    new_pairs: list[str] | None = [] if pairs is not None else None
    source: list[int] = []
    for i in range(len(texts)):
        rng = np.random.default_rng([seed, i])
        variants = [
            augmented_copies(side[i], spans[i], cands[i], copies, rate, rng)
            for side, (spans, cands) in zip(sides, tables, strict=True)
        ]
        rows = paired_rows(variants, texts[i], None if pairs is None else pairs[i])
        for a, b in rows:
            new_texts.append(a)
            if new_pairs is not None:
                new_pairs.append(b)  # type: ignore[arg-type]
            source.append(i)
    return Augmented(new_texts, new_pairs, source)


__all__ = [
    "Augmented",
    "augment",
    "augmented_copies",
    "load_augmenter",
    "matching_case",
    "paired_rows",
    "replaceable_words",
    "word_candidates",
]
