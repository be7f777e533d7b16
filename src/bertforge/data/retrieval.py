"""Retrieval test sets: queries searching a corpus, and the documents judged relevant to each
(:class:`RetrievalData`), read from files in the BEIR layout (:func:`load_beir`) that retrieval
benchmarks (BEIR, MTEB) ship:

- ``corpus.jsonl``: one ``{"_id": ..., "title": ..., "text": ...}`` per line (``title`` optional);
  a document is embedded as ``title + " " + text`` (stripped), as BEIR's dense models do;
- ``queries.jsonl``: one ``{"_id": ..., "text": ...}`` per line;
- qrels, a TSV file: the header ``query-id<TAB>corpus-id<TAB>score``, then one judgment per line,
  the score an integer grade (0 or below: not relevant; 1, 2, ...: relevant, higher is better).

Every file may be ``.gz``/``.bz2``/``.xz``. Queries with no relevant document in the qrels are
not scored and are counted (:attr:`RetrievalData.skipped`), as BEIR leaves them out. A document
whose ``_id`` is the query's own and that is not judged relevant to it is left out of its ranking
(BEIR's ``ignore_identical_ids``: ArguAna and Quora hold each query in the corpus too); one judged
relevant is ranked as any other (queries and documents numbered alike, query 7 answered by
document 7).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertforge.data.tables import jsonl_rows
from bertforge.errors import BertforgeError
from bertforge.io import text_lines

QRELS_HEADER = ("query-id", "corpus-id", "score")
"""The first line of a BEIR qrels file."""


@dataclass
class RetrievalData:
    """A retrieval task: each query searches every document of the corpus."""

    queries: list[str]
    """The text of each query scored (those with at least one relevant document)."""
    documents: list[str]
    """The text of each corpus document, as embedded."""
    judgments: list[dict[int, int]]
    """Per query: document index -> its grade (> 0; 1 for plain pairs)."""
    own_documents: list[int | None] | None = None
    """Per query: the index of the document with the query's own id that is not judged relevant
    to it, left out of its ranking (None: no such document); None: none for any query."""
    skipped: int = 0
    """Queries read but not scored: no document is judged relevant to them."""

    def __len__(self) -> int:
        return len(self.queries)

    def relevance(self, start: int, stop: int) -> np.ndarray:
        """The (stop - start, N) grades of queries ``start:stop`` for every document (0: not
        relevant), the ``relevance`` of :func:`~bertforge.evaluation.metrics.retrieval_metrics`."""
        gains = np.zeros((stop - start, len(self.documents)))
        for row, judged in enumerate(self.judgments[start:stop]):
            gains[row, list(judged)] = list(judged.values())
        return gains


def read_beir_texts(
    path: str | Path, *, titled: bool, encoding_errors: str = "strict"
) -> tuple[list[str], dict[str, int]]:
    """The texts of a BEIR ``queries.jsonl`` or (``titled``) ``corpus.jsonl`` file, in file
    order, and each ``_id``'s index. A line that is not an object, lacks ``_id`` or ``text``, or
    repeats an ``_id`` is an error naming ``file:line``."""
    what = "document" if titled else "query"
    texts: list[str] = []
    index: dict[str, int] = {}
    lines: list[int] = []
    with contextlib.closing(text_lines(path, encoding_errors)) as f:
        for number, row in jsonl_rows(f, path):
            where = f"{path}:{number}"
            if not isinstance(row, dict):
                raise BertforgeError(
                    f'{where}: not a JSON object; write one {{"_id": ..., "text": ...}} per line'
                )
            for key in ("_id", "text"):
                if key not in row:
                    raise BertforgeError(
                        f'{where}: no "{key}" in this line; give every line "_id" and "text" '
                        "(the BEIR layout)"
                    )
            ident, text, title = row["_id"], row["text"], row.get("title") if titled else None
            if isinstance(ident, bool) or not isinstance(ident, str | int):
                raise BertforgeError(f'{where}: "_id" is {ident!r}; write the id as a string')
            for key, value in (("text", text), ("title", title)):
                if value is not None and not isinstance(value, str):
                    raise BertforgeError(f'{where}: "{key}" is not a string; write it as one')
            ident = str(ident)
            if ident in index:
                first = lines[index[ident]]
                raise BertforgeError(
                    f"{where}: duplicate _id {ident!r} (first on line {first}); give each "
                    f"{what} its own id, or drop the repeated line"
                )
            index[ident] = len(texts)
            lines.append(number)
            texts.append(f"{title} {text}".strip() if title else text)
    if not texts:
        raise BertforgeError(
            f'{path}: the file is empty; give one {{"_id": ..., "text": ...}} per {what}'
        )
    return texts, index


def read_qrels(
    path: str | Path, encoding_errors: str = "strict"
) -> list[tuple[int, str, str, int]]:
    """``(line, query id, corpus id, score)`` of each judgment of a BEIR qrels TSV file (the
    header line, :data:`QRELS_HEADER`, skipped). A line without three tab-separated fields or
    with a score that is not an integer is an error naming ``file:line``."""
    judgments = []
    with contextlib.closing(text_lines(path, encoding_errors)) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = [field.strip() for field in line.rstrip("\r\n").split("\t")]
            if number == 1 and tuple(field.lower() for field in fields) == QRELS_HEADER:
                continue
            if len(fields) != 3:
                raise BertforgeError(
                    f"{path}:{number}: {len(fields)} field{'s' * (len(fields) != 1)} where qrels "
                    "have 3 (query-id, corpus-id, score, separated by tabs); fix the line"
                )
            try:
                score = int(fields[2])
            except ValueError:
                raise BertforgeError(
                    f"{path}:{number}: score {fields[2]!r} is not an integer; write 0 (not "
                    "relevant) or a grade 1, 2, ... (the header line reads "
                    "query-id<TAB>corpus-id<TAB>score)"
                ) from None
            judgments.append((number, fields[0], fields[1], score))
    return judgments


def load_beir(
    queries: str | Path, corpus: str | Path, qrels: str | Path, encoding_errors: str = "strict"
) -> RetrievalData:
    """A retrieval test set from BEIR files (see the module docstring). A qrels line naming a
    query or document that is not in ``queries`` or ``corpus`` is an error naming the line."""
    query_texts, query_index = read_beir_texts(
        queries, titled=False, encoding_errors=encoding_errors
    )
    documents, document_index = read_beir_texts(
        corpus, titled=True, encoding_errors=encoding_errors
    )
    graded: dict[int, dict[int, int]] = {}
    seen: dict[tuple[str, str], tuple[int, int]] = {}
    for number, query_id, corpus_id, score in read_qrels(qrels, encoding_errors):
        for ident, index, option, path in (
            (query_id, query_index, "query-id", queries),
            (corpus_id, document_index, "corpus-id", corpus),
        ):
            if ident not in index:
                raise BertforgeError(
                    f'{qrels}:{number}: {option} {ident!r} is not an "_id" of {path}; give the '
                    "matching queries and corpus, or delete the line"
                )
        earlier = seen.setdefault((query_id, corpus_id), (number, score))
        if earlier[1] != score:
            raise BertforgeError(
                f"{qrels}:{number}: query {query_id!r} and document {corpus_id!r} were judged "
                f"{earlier[1]} on line {earlier[0]}, here {score}; keep one of the lines"
            )
        if score > 0:
            graded.setdefault(query_index[query_id], {})[document_index[corpus_id]] = score
    kept = sorted(graded)  # the queries' file order
    ids = list(query_index)
    own = [document_index.get(ids[q]) for q in kept]
    return RetrievalData(
        queries=[query_texts[q] for q in kept],
        documents=documents,
        judgments=[graded[q] for q in kept],
        # a document judged relevant is ranked even with the query's id (ids numbered alike)
        own_documents=[d if d not in graded[q] else None for d, q in zip(own, kept, strict=True)],
        skipped=len(query_texts) - len(kept),
    )


__all__ = ["QRELS_HEADER", "RetrievalData", "load_beir", "read_beir_texts", "read_qrels"]
