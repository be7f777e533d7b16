"""Labelled texts to model inputs: tokenize with head or head+tail truncation
(:func:`encode_examples`, ``[CLS] a [SEP] (b [SEP])``), the one ``--max_length`` rule, and the
batches: the order of an epoch (:func:`batch_order`, a pure function of seed and epoch) and
dynamically padded batches (:func:`collate`, :func:`iterate_batches`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch

from bertforge.errors import BertforgeError
from bertforge.tokenizer.wordpiece import valid_unicode

Truncation = Literal["head", "head_tail", "tail"]
"""How a text longer than ``max_length`` is cut: keep its head, its head and tail, or its tail
(the last tokens: TEI's ``truncation_direction: left``)."""
TRUNCATIONS: tuple[str, ...] = get_args(Truncation)


def _keep(ids: list[int], budget: int, truncation: str) -> list[int]:
    if len(ids) <= budget:
        return ids
    if truncation == "head":
        return ids[:budget]
    if truncation == "tail":
        return ids[len(ids) - budget :]
    head = budget // 4  # Sun et al. (2019): the first 128 and last 382 of 510 tokens work best
    return ids[:head] + ids[len(ids) - (budget - head) :]


def _piece_ids(backend: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text without special tokens (unpaired surrogates read as U+FFFD)."""
    try:
        encodings = backend.encode_batch(list(texts), add_special_tokens=False)
    except TypeError:
        encodings = backend.encode_batch(valid_unicode(texts), add_special_tokens=False)
    return [e.ids for e in encodings]


def check_max_length(max_length: int, minimum: int, why: str) -> None:
    """The one rule for ``--max_length`` in every command: an explicit value below ``minimum``
    (0 included) is an error; leaving the option out picks the model's or the run's own."""
    if max_length < minimum:
        raise BertforgeError(
            f"--max_length {max_length}: must be at least {minimum} ({why}); leave it out for "
            "the default"
        )


def encode_examples(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
    truncation: str = "head",
) -> list[tuple[np.ndarray, int]]:
    """Token ids ``[CLS] a [SEP] (b [SEP])`` per example, as ``(ids, length_of_segment_a)``.

    ``truncation="head"`` keeps the first tokens; ``"head_tail"`` keeps the first quarter and the
    last three quarters of the budget (endings of reviews carry their verdict); ``"tail"`` the
    last tokens. For pairs the longer text is shortened first, each side as ``truncation`` says.
    """
    if truncation not in TRUNCATIONS:
        raise BertforgeError(
            f"--truncation {truncation!r} is unknown; choose {' or '.join(TRUNCATIONS)}"
        )
    specials = 3 if pairs is not None else 2
    check_max_length(
        max_length,
        specials + 1,
        "[CLS], [SEP] and one token" if pairs is None else "[CLS], two [SEP] and one token",
    )
    budget = max_length - specials
    a_ids = _piece_ids(tokenizer.backend, texts)
    b_ids = None if pairs is None else _piece_ids(tokenizer.backend, pairs)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    out: list[tuple[np.ndarray, int]] = []
    for i, a in enumerate(a_ids):
        if b_ids is None:
            ids = [cls, *_keep(a, budget, truncation), sep]
            out.append((np.asarray(ids, dtype=np.int32), len(ids)))
            continue
        b = b_ids[i]
        la, lb = len(a), len(b)
        if la + lb > budget:  # longest first: trim the longer side until both fit
            half = budget // 2
            if la > half and lb > half:  # an odd budget's last token: the longer side's
                # (the second on a tie), as Hugging Face tokenizers' longest_first keeps it
                la, lb = (budget - half, half) if la > lb else (half, budget - half)
            elif la > lb:
                la = budget - lb
            else:
                lb = budget - la
        first = [cls, *_keep(a, la, truncation), sep]
        ids = first + _keep(b, lb, truncation) + [sep]
        out.append((np.asarray(ids, dtype=np.int32), len(first)))
    return out


GPU_PAD_MULTIPLE = 32
"""What a batch's padded length is rounded up to on a GPU (:func:`pad_multiple`)."""


def pad_multiple(device: torch.device) -> int:
    """The multiple a batch's padded length is rounded up to on ``device``: 1 on the CPU (its
    kernels take any length at no cost), :data:`GPU_PAD_MULTIPLE` elsewhere, where every new
    (B, T) shape costs the attention library a plan of its own (cuDNN's fused attention builds
    one per shape), a compiled model a recompile, and lengths of 4 to 128 tokens would bring a
    hundred of them; rounded, a handful repeat."""
    return 1 if device.type == "cpu" else GPU_PAD_MULTIPLE


def collate(
    examples: Sequence[tuple[np.ndarray, int]], pad_id: int, multiple: int = 1, limit: int = 0
) -> dict[str, torch.Tensor]:
    """Pad to the longest example of the batch, that length rounded up to ``multiple`` but not
    past ``limit`` (the longest an example may be; 0: no rounding past the longest):
    ``input_ids``, ``attention_mask``, ``token_type_ids``, each (B, T) int64."""
    longest = max(len(ids) for ids, _ in examples)
    T = max(longest, min(-(-longest // multiple) * multiple, limit))
    B = len(examples)
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    attention = np.zeros((B, T), dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    for row, (ids, len_a) in enumerate(examples):
        input_ids[row, : len(ids)] = ids
        attention[row, : len(ids)] = 1
        types[row, len_a : len(ids)] = 1
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention),
        "token_type_ids": torch.from_numpy(types),
    }


def batch_order(
    lengths: Sequence[int],
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    bucket: bool = True,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Example indices grouped into batches for one epoch, a pure function of (seed, epoch).

    With ``bucket`` the shuffled examples are sorted by length inside windows of 50 batches, so
    a batch pads little, and the batches are shuffled again (the order stays random). Without
    ``shuffle`` (evaluation) examples are taken in order, or sorted by length with ``bucket``.
    A resumed run recomputes the order and skips the batches already done.
    """
    n = len(lengths)
    lengths = np.asarray(lengths)
    if not shuffle:
        order = np.argsort(-lengths, kind="stable") if bucket else np.arange(n)
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    if bucket:
        window = batch_size * 50
        order = np.concatenate(
            [
                chunk[np.argsort(-lengths[chunk], kind="stable")]
                for chunk in np.array_split(order, max(1, -(-n // window)))
            ]
        )
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if bucket:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def iterate_batches(
    encoded: Sequence[tuple[np.ndarray, int]],
    order: Sequence[np.ndarray],
    pad_id: int,
    multiple: int = 1,
) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """``(indices, padded batch)`` for each batch of ``order``; lengths rounded up to
    ``multiple``, never past the longest example of ``encoded``."""
    limit = max((len(ids) for ids, _ in encoded), default=0) if multiple > 1 else 0
    for index in order:
        yield index, collate([encoded[int(i)] for i in index], pad_id, multiple, limit)


__all__ = [
    "Truncation",
    "TRUNCATIONS",
    "check_max_length",
    "encode_examples",
    "collate",
    "pad_multiple",
    "GPU_PAD_MULTIPLE",
    "batch_order",
    "iterate_batches",
]
