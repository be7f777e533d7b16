"""Training data of sentence embeddings (``finetune --task embedding``): text pairs (an anchor and
its positive, optionally a hard negative), scored pairs (STS style) or plain texts, read from
CSV/TSV/JSONL files (optionally compressed) through ``bertforge.data.tables``; and the batches of
in-batch-negative training, in which no text appears twice (:func:`unique_batches`: a duplicate
would be a false negative of its twin).

Which kind a data set is follows from the columns given: ``--text_pair_column`` makes pairs, a
``--label_column`` beside it makes scored pairs, neither makes plain texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bertforge.data.labels import to_floats
from bertforge.data.tables import clean_text, read_columns_lines
from bertforge.errors import BertforgeError

PairKind = Literal["pairs", "scored", "texts"]
"""pairs: anchor + positive (+ negative); scored: two texts and a similarity; texts: one text."""


@dataclass
class PairData:
    """The rows of an embedding data set, in file order."""

    kind: PairKind
    anchors: list[str]
    """The first text of every row (the only one of plain texts)."""
    positives: list[str] | None
    """The second text (a positive, or the other side of a scored pair); None for plain texts."""
    negatives: list[str] | None
    """A hard negative per row (``--negative_column``), or None."""
    scores: np.ndarray | None
    """float32 similarity of each scored pair, else None."""

    def __len__(self) -> int:
        return len(self.anchors)

    def columns(self) -> list[list[str]]:
        """The text columns a loss embeds: anchors, then positives and negatives where given."""
        return [c for c in (self.anchors, self.positives, self.negatives) if c is not None]

    def subset(self, index: np.ndarray) -> PairData:
        pick = [int(i) for i in index]

        def take(column: list[str] | None) -> list[str] | None:
            return None if column is None else [column[i] for i in pick]

        scores = None if self.scores is None else self.scores[index]
        return PairData(
            self.kind, take(self.anchors) or [], take(self.positives), take(self.negatives), scores
        )


def load_pairs(
    paths: str | Path | Sequence[str | Path],
    *,
    text_column: str,
    text_pair_column: str | None,
    negative_column: str | None = None,
    label_column: str | None = None,
    encoding_errors: str = "strict",
) -> PairData:
    """Read an embedding data set (see the module docstring for its kinds). An empty text, a
    score that is not a number, or a negative missing on a row is an error naming ``file:line``
    and the column."""
    if text_pair_column is None and (negative_column or label_column):
        given = "--negative_column" if negative_column else "--label_column"
        raise BertforgeError(
            f"{given} needs pairs: name the second text's column with --text_pair_column "
            "(plain texts alone train with --loss simcse)"
        )
    if negative_column and label_column:
        raise BertforgeError(
            "--negative_column and --label_column do not go together: hard negatives are for "
            "pairs without scores (in-batch negatives), scores for CoSENT; drop one"
        )
    source = ", ".join(map(str, [paths] if isinstance(paths, str | Path) else paths))
    names = [text_column, text_pair_column, negative_column]
    (anchors, positives, negatives, raw), where = read_columns_lines(
        paths, [*names, label_column], encoding_errors, text=names
    )
    texts = [anchors, positives, negatives]
    for column, cells in zip(names, texts, strict=True):
        empty = [i for i, v in enumerate(cells) if column and (v is None or str(v).strip() == "")]
        if empty:  # an empty side would be embedded as [CLS] [SEP] and trained as a text
            side = "negative" if column == negative_column else "text"
            raise BertforgeError(
                f"{where[empty[0]]}: empty {side} in column {column!r} ({len(empty)} such row"
                f"{'s' * (len(empty) > 1)} in {source}); fill in or drop those rows"
            )
    anchors, positives, negatives = (
        [clean_text(t) for t in cells] if column else None
        for column, cells in zip(names, texts, strict=True)
    )
    scores = None
    if label_column:
        need = "scored pairs need a number (a similarity such as STS-B's 0-5) in every row"
        scores = to_floats(raw, label_column, source, where, need=need)
    kind: PairKind = "texts" if positives is None else "scored" if scores is not None else "pairs"
    return PairData(kind, anchors or [], positives, negatives, scores)


def unique_batches(
    texts: Sequence[Sequence[str]], batch_size: int, *, seed: int, epoch: int
) -> list[np.ndarray]:
    """Row indices grouped into batches for one epoch, a pure function of (seed, epoch), such
    that no text (of any column in ``texts``) occurs twice in a batch: in-batch negatives would
    otherwise count a row's duplicate as a negative of it. The rows are shuffled; each batch takes
    the next rows whose texts it does not hold yet, and a row that clashes waits for a later
    batch (as sentence-transformers' NoDuplicatesBatchSampler). The last batch may be smaller."""
    n = len(texts[0])
    rng = np.random.default_rng([seed, epoch])
    waiting = [int(i) for i in rng.permutation(n)]
    batches: list[np.ndarray] = []
    while waiting:
        batch: list[int] = []
        seen: set[str] = set()
        left: list[int] = []
        for k, row in enumerate(waiting):
            own = {column[row] for column in texts}
            if own & seen:
                left.append(row)
                continue
            batch.append(row)
            seen |= own
            if len(batch) == batch_size:
                left += waiting[k + 1 :]
                break
        batches.append(np.asarray(batch, dtype=np.int64))
        waiting = left
    return batches


__all__ = ["PairData", "PairKind", "load_pairs", "unique_batches"]
