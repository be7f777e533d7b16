"""Turn tokenised documents into training instances: NSP pairs or packed sequences.

A document here is a list of sentences, each a 1-D numpy array of token ids without special
tokens. Two modes:

- ``nsp`` (:func:`create_nsp_instances`) follows Google's ``create_pretraining_data.py``: a target
  length per document (shorter with probability ``short_seq_prob``), segment A from contiguous
  sentences, B the real continuation 50% of the time and otherwise a span of another document
  (the sentences not used go back to be read again), longest-first pair truncation from a random
  end. The caller adds ``[CLS] A [SEP] B [SEP]``. One deliberate difference: when a chunk holds a
  single sentence, Google's code always makes it NotNext, which skews the labels at short lengths
  (about 70% NotNext at 64 tokens on WikiText); here such a chunk drawn as IsNext borrows the
  document's next sentence as B, so the labels stay balanced (only a document's last sentence
  alone is forced to NotNext).
- ``packed`` (:class:`Packer`) is RoBERTa's FULL-SENTENCES: contiguous sentences fill a sequence
  up to the maximum length and cross document boundaries with a ``[SEP]``.

Sentences longer than a sequence can hold are cut into pieces first (:func:`split_long`), so no
text is dropped silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.tokenizer.wordpiece import valid_unicode

TokenDoc = list[np.ndarray]


@dataclass
class Instance:
    """One training sequence before special tokens are added."""

    tokens_a: np.ndarray
    """Segment A (or the whole packed sequence, inner ``[SEP]`` included)."""
    tokens_b: np.ndarray | None
    """Segment B; None in packed mode."""
    is_random_next: bool = False
    """True when B comes from another document (NotNext, label 1)."""
    doc: int = -1
    """Index of A's document in the list given to :func:`create_nsp_instances`."""
    a_sentences: tuple[int, int] = (0, 0)
    """Sentence range [start, end) of A in its document (before truncation)."""
    b_doc: int = -1
    """Index of B's document (equals ``doc`` for IsNext)."""
    b_sentences: tuple[int, int] = (0, 0)
    """Sentence range [start, end) of B in ``b_doc`` (before truncation)."""


def split_long(sentences: Sequence[np.ndarray], limit: int) -> tuple[TokenDoc, int]:
    """Cut sentences longer than ``limit`` tokens into consecutive pieces; drop empty ones.

    Returns the new sentence list and how many sentences were cut.
    """
    out: TokenDoc = []
    n_cut = 0
    for sentence in sentences:
        if len(sentence) > limit:
            n_cut += 1
            out += [sentence[i : i + limit] for i in range(0, len(sentence), limit)]
        elif len(sentence):
            out.append(sentence)
    return out, n_cut


def truncate_pair(
    len_a: int, len_b: int, max_tokens: int, rng: np.random.Generator
) -> tuple[slice, slice]:
    """Longest-first truncation of a pair to ``max_tokens``; each removal from a random end.

    Equivalent to Google's loop (remove one token from the longer segment, B on ties, front or back
    with probability 1/2 each) in closed form. Returns the slices to keep of A and B.
    """
    excess = len_a + len_b - max_tokens
    cut_a = cut_b = 0
    if excess > 0:
        if len_a > len_b:
            cut_a = min(excess, len_a - len_b)
        else:
            cut_b = min(excess, len_b - len_a)
        rest = excess - cut_a - cut_b
        cut_b += (rest + 1) // 2
        cut_a += rest // 2
    front_a = int(rng.binomial(cut_a, 0.5)) if cut_a else 0
    front_b = int(rng.binomial(cut_b, 0.5)) if cut_b else 0
    return (
        slice(front_a, len_a - (cut_a - front_a)),
        slice(front_b, len_b - (cut_b - front_b)),
    )


def create_nsp_instances(
    documents: Sequence[TokenDoc],
    rng: np.random.Generator,
    *,
    max_seq_length: int,
    short_seq_prob: float = 0.1,
    negatives: Sequence[TokenDoc] = (),
) -> tuple[list[Instance], int]:
    """Build NSP instances from every document (Google's semantics, see the module docstring).

    ``negatives`` are extra documents that may provide random B segments (e.g. the previous
    chunk), beyond the other ``documents``. Documents must hold at least one non-empty sentence;
    the caller skips those with fewer than two. Returns the instances and the number of chunks
    dropped because no other document existed to draw a NotNext segment from.
    """
    max_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    pool: list[TokenDoc] = list(documents) + list(negatives)
    instances: list[Instance] = []
    dropped = 0
    for doc_index, document in enumerate(documents):
        target = max_tokens
        if rng.random() < short_seq_prob:
            target = int(rng.integers(2, max_tokens + 1))
        chunk_start, chunk_len, i = 0, 0, 0
        while i < len(document):
            chunk_len += len(document[i])
            if i == len(document) - 1 or chunk_len >= target:
                n_chunk = i + 1 - chunk_start
                random_next = rng.random() < 0.5
                if not random_next and n_chunk == 1:
                    if i + 1 < len(document):
                        i, n_chunk = i + 1, 2  # borrow the next sentence as B (see docstring)
                    else:
                        random_next = True
                a_end = int(rng.integers(1, n_chunk)) if n_chunk >= 2 else 1
                tokens_a = np.concatenate(document[chunk_start : chunk_start + a_end])
                if random_next and len(pool) < 2:
                    if n_chunk == 1:
                        dropped += 1
                        chunk_start, chunk_len, i = i + 1, 0, i + 1
                        continue
                    random_next = False  # nothing else to draw from: keep the true continuation
                if random_next:
                    other = int(rng.integers(0, len(pool) - 1))
                    other += other >= doc_index  # any document but this one
                    random_doc = pool[other]
                    b_start = int(rng.integers(0, len(random_doc)))
                    b_end, b_len, target_b = b_start, 0, target - len(tokens_a)
                    while b_end < len(random_doc):
                        b_len += len(random_doc[b_end])
                        b_end += 1
                        if b_len >= target_b:
                            break
                    tokens_b = np.concatenate(random_doc[b_start:b_end])
                    b_doc, b_range = other, (b_start, b_end)
                    # the sentences of this chunk not used as A are read again
                    i = chunk_start + a_end - 1
                else:
                    tokens_b = np.concatenate(document[chunk_start + a_end : i + 1])
                    b_doc, b_range = doc_index, (chunk_start + a_end, i + 1)
                keep_a, keep_b = truncate_pair(len(tokens_a), len(tokens_b), max_tokens, rng)
                instances.append(
                    Instance(
                        tokens_a[keep_a],
                        tokens_b[keep_b],
                        random_next,
                        doc_index,
                        (chunk_start, chunk_start + a_end),
                        b_doc,
                        b_range,
                    )
                )
                chunk_start, chunk_len = i + 1, 0
            i += 1
    return instances, dropped


@dataclass
class TokenizedChunk:
    """A chunk's documents as token ids, in one flat array (cheap to send between processes)."""

    ids: np.ndarray
    """(n_tokens,) int64: every piece of every document, concatenated."""
    piece_lengths: np.ndarray
    """(n_pieces,) int64 tokens per piece (a sentence, or a part of a cut long one)."""
    doc_pieces: np.ndarray
    """(n_documents,) int64 pieces per document; 0 for a document with no tokens."""
    n_cut: int
    """Sentences cut because they were longer than a sequence holds."""
    seconds: float = 0.0
    """Wall time :func:`tokenize_chunk` took (in a worker: one core's time)."""

    def documents(self) -> list[list[np.ndarray]]:
        """Per document its pieces, each a 1-D int64 array (views into ``ids``)."""
        pieces = np.split(self.ids, np.cumsum(self.piece_lengths)[:-1]) if len(self.ids) else []
        out, start = [], 0
        for n in self.doc_pieces.tolist():
            out.append(pieces[start : start + n])
            start += n
        return out


def tokenize_chunk(backend: Any, documents: list[list[str]], limit: int) -> TokenizedChunk:
    """Encode every sentence of ``documents`` (no special tokens) with the ``tokenizers``
    ``backend`` and cut sentences longer than ``limit`` tokens; empty sentences are dropped."""
    start = time.perf_counter()
    sentences = [s for doc in documents for s in doc]
    try:
        encodings = backend.encode_batch_fast(sentences, add_special_tokens=False)
    except TypeError:  # an unpaired surrogate (e.g. a JSON "\ud800" escape): U+FFFD instead
        encodings = backend.encode_batch_fast(valid_unicode(sentences), add_special_tokens=False)
    ids = iter([np.array(e.ids, dtype=np.int64) for e in encodings])
    flat: list[np.ndarray] = []
    doc_pieces = np.zeros(len(documents), dtype=np.int64)
    n_cut = 0
    for d, doc in enumerate(documents):
        pieces, cut = split_long([next(ids) for _ in doc], limit)
        n_cut += cut
        doc_pieces[d] = len(pieces)
        flat += pieces
    lengths = np.array([len(p) for p in flat], dtype=np.int64)
    joined = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    return TokenizedChunk(joined, lengths, doc_pieces, n_cut, time.perf_counter() - start)


class Packer:
    """Packs sentences into sequences of at most ``max_seq_length - 2`` tokens (FULL-SENTENCES).

    Call :meth:`add_document` for each document in order, collecting the finished sequences it
    returns, and :meth:`finish` at the end. A ``sep_id`` separates documents inside a sequence;
    it is never the first token of a sequence.
    """

    def __init__(self, max_seq_length: int, sep_id: int) -> None:
        self.capacity = max_seq_length - 2  # [CLS] ... [SEP]
        self.sep = np.array([sep_id], dtype=np.int64)
        self._parts: list[np.ndarray] = []
        self._length = 0

    def _emit(self, out: list[Instance]) -> None:
        if self._parts:
            out.append(Instance(np.concatenate(self._parts), None))
        self._parts, self._length = [], 0

    def add_document(self, sentences: Sequence[np.ndarray]) -> list[Instance]:
        """Add one document's sentences (each at most ``capacity`` long); return full sequences."""
        out: list[Instance] = []
        first = True
        for sentence in sentences:
            if not len(sentence):
                continue
            extra = 1 if first and self._parts else 0  # document separator
            if self._length + extra + len(sentence) > self.capacity:
                self._emit(out)
                extra = 0
            if extra:
                self._parts.append(self.sep)
            self._parts.append(sentence)
            self._length += extra + len(sentence)
            first = False
        return out

    def finish(self) -> list[Instance]:
        """Return the last, partly filled sequence (if any)."""
        out: list[Instance] = []
        self._emit(out)
        return out


class InstanceBuilder:
    """Buffers documents of sentences (strings), tokenises them in chunks, emits instances.

    Each chunk of about ``chunk_chars`` characters is encoded in one batch call of the
    ``tokenizers`` library (:func:`tokenize_chunk`: in this process with the library's own
    threads, or in a worker process of ``pool``, a :class:`~bertforge.data.workers.ChunkPool`);
    sentences too long for a sequence are cut (:func:`split_long`); documents left empty, or with
    fewer than two sentences in ``nsp`` mode, are skipped and counted in ``stats["skipped"]``.
    Finished instances go to ``emit``; in ``nsp`` mode the previous chunk's documents also
    provide NotNext segments, so memory holds two chunks at most (plus those a pool has in
    flight). With a pool, :meth:`build` runs for the chunks in the order they were buffered, so
    the instances are the same as without one.
    """

    def __init__(
        self,
        tokenizer: Any,
        emit: Callable[[list[Instance]], None],
        mode: str,
        max_seq_length: int,
        short_seq_prob: float,
        rng: np.random.Generator,
        stats: dict[str, Any],
        chunk_chars: int = 1_000_000,
        pool: Any = None,
    ) -> None:
        self.tokenizer, self.emit, self.mode = tokenizer, emit, mode
        self.chunk_chars, self.pool = chunk_chars, pool
        self.max_seq_length, self.short_seq_prob, self.rng = max_seq_length, short_seq_prob, rng
        self.stats = stats
        for key in ("long_sentences_split", "text_tokens", "nsp_chunks_without_negative"):
            stats.setdefault(key, 0)
        stats.setdefault("tokenize_seconds", 0.0)
        stats.setdefault("skipped", {})
        self.buffer: list[list[str]] = []
        self.chars = 0
        self.negatives: list[list[np.ndarray]] = []  # previous chunk: NotNext segments for the next
        self.packer = Packer(max_seq_length, tokenizer.sep_id) if mode == "packed" else None
        self.documents = 0

    def add(self, doc: list[str]) -> None:
        """Add one document (a list of sentences)."""
        self.buffer.append(doc)
        self.chars += sum(len(s) for s in doc)
        if self.chars >= self.chunk_chars:
            self.flush()

    def flush(self) -> None:
        """Tokenise the buffered documents (here, or queued to the pool) and build instances."""
        if not self.buffer:
            return
        documents, self.buffer, self.chars = self.buffer, [], 0
        limit = self.max_seq_length - (3 if self.mode == "nsp" else 2)
        if self.pool is None:
            self.build(tokenize_chunk(self.tokenizer.backend, documents, limit))
        else:
            self.pool.submit(documents, limit, self.build)

    def build(self, chunk: TokenizedChunk) -> None:
        """Turn one tokenised chunk into instances and emit them."""
        self.stats["long_sentences_split"] += chunk.n_cut
        self.stats["tokenize_seconds"] += chunk.seconds
        self.stats["text_tokens"] += len(chunk.ids)
        docs, skipped = [], self.stats["skipped"]
        for pieces in chunk.documents():
            if not pieces:
                skipped["empty document"] = skipped.get("empty document", 0) + 1
            elif self.mode == "nsp" and len(pieces) < 2:
                key = "fewer than 2 sentences (NSP)"
                skipped[key] = skipped.get(key, 0) + 1
            else:
                docs.append(pieces)
        self.documents += len(docs)
        if self.packer is not None:
            for doc in docs:
                self.emit(self.packer.add_document(doc))
            return
        instances, dropped = create_nsp_instances(
            docs,
            self.rng,
            max_seq_length=self.max_seq_length,
            short_seq_prob=self.short_seq_prob,
            negatives=self.negatives,
        )
        self.stats["nsp_chunks_without_negative"] += dropped
        self.emit(instances)
        self.negatives = docs or self.negatives

    def finish(self) -> None:
        """Process what is buffered (and what the pool has in flight); emit the last packed
        sequence."""
        self.flush()
        if self.pool is not None:
            self.pool.drain()
        if self.packer is not None:
            self.emit(self.packer.finish())
