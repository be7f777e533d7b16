"""NSP pairs and packed sequences built from token documents."""

from __future__ import annotations

import numpy as np

from bertforge.data.instances import Packer, create_nsp_instances, split_long, truncate_pair


def _synthetic_documents(rng: np.random.Generator, n_docs: int) -> list[list[np.ndarray]]:
    """Token id = doc * 100_000 + sentence * 100 + k: every token says where it came from."""
    docs = []
    for d in range(n_docs):
        n_sent = int(rng.integers(2, 30))
        docs.append(
            [d * 100_000 + s * 100 + np.arange(int(rng.integers(1, 40))) for s in range(n_sent)]
        )
    return docs


def _where(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return tokens // 100_000, (tokens % 100_000) // 100


def test_nsp_pairs_have_google_semantics() -> None:
    rng = np.random.default_rng(0)
    docs = _synthetic_documents(rng, 300)
    max_len = 64
    instances, dropped = create_nsp_instances(
        docs, np.random.default_rng(1), max_seq_length=max_len
    )
    assert dropped == 0 and len(instances) > 1000
    labels = np.array([inst.is_random_next for inst in instances])
    assert 0.46 < labels.mean() < 0.55  # balanced (a document's last lone sentence is NotNext)
    for inst in instances:
        assert len(inst.tokens_a) >= 1 and len(inst.tokens_b) >= 1
        assert len(inst.tokens_a) + len(inst.tokens_b) + 3 <= max_len
        a_doc, a_sent = _where(inst.tokens_a)
        b_doc, b_sent = _where(inst.tokens_b)
        assert (a_doc == inst.doc).all() and (b_doc == inst.b_doc).all()
        # A is contiguous sentences of its range; so is B
        assert inst.a_sentences[0] <= a_sent.min() and a_sent.max() < inst.a_sentences[1]
        assert inst.b_sentences[0] <= b_sent.min() and b_sent.max() < inst.b_sentences[1]
        assert (np.diff(inst.tokens_a) > 0).all() and (np.diff(inst.tokens_b) > 0).all()
        if inst.is_random_next:
            assert inst.b_doc != inst.doc
        else:
            assert inst.b_doc == inst.doc
            assert inst.b_sentences[0] == inst.a_sentences[1]  # B really continues A
    # every sentence lands in an A or a true-continuation B (the unused ones go back)
    used = {(inst.doc, s) for inst in instances for s in range(*inst.a_sentences)}
    used |= {
        (inst.doc, s)
        for inst in instances
        if not inst.is_random_next
        for s in range(*inst.b_sentences)
    }
    assert len(used) == sum(len(d) for d in docs)


def test_short_seq_prob_makes_short_targets() -> None:
    docs = _synthetic_documents(np.random.default_rng(2), 200)
    kwargs = {"max_seq_length": 128}
    long_ = create_nsp_instances(docs, np.random.default_rng(3), short_seq_prob=0.0, **kwargs)[0]
    short = create_nsp_instances(docs, np.random.default_rng(3), short_seq_prob=1.0, **kwargs)[0]
    mean = lambda xs: np.mean([len(i.tokens_a) + len(i.tokens_b) for i in xs])  # noqa: E731
    assert mean(short) < 0.8 * mean(long_)


def test_single_document_has_no_negative_and_keeps_true_continuations() -> None:
    doc = [np.arange(s * 10, s * 10 + 8) for s in range(20)]
    instances, dropped = create_nsp_instances([doc], np.random.default_rng(0), max_seq_length=32)
    assert instances and not any(inst.is_random_next for inst in instances)
    negatives = [[np.arange(1000, 1010)]]
    instances, _ = create_nsp_instances(
        [doc], np.random.default_rng(0), max_seq_length=32, negatives=negatives
    )
    assert any(inst.is_random_next and inst.b_doc == 1 for inst in instances)


def _google_truncate(la: int, lb: int, max_tokens: int) -> tuple[int, int]:
    while la + lb > max_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncate_pair_matches_longest_first_loop() -> None:
    rng = np.random.default_rng(0)
    for la in range(1, 40, 3):
        for lb in range(1, 40, 4):
            keep_a, keep_b = truncate_pair(la, lb, 30, rng)
            got = (len(range(la)[keep_a]), len(range(lb)[keep_b]))
            assert got == _google_truncate(la, lb, 30)


def test_split_long_cuts_and_counts() -> None:
    pieces, n_cut = split_long([np.arange(10), np.arange(3), np.array([], dtype=np.int64)], 4)
    assert n_cut == 1
    assert [p.tolist() for p in pieces] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2]]


def test_packer_fills_sequences_and_separates_documents() -> None:
    sep = 999
    packer = Packer(max_seq_length=12, sep_id=sep)  # capacity 10
    out = packer.add_document([np.array([1, 2, 3]), np.array([4, 5, 6])])
    out += packer.add_document([np.array([7, 8]), np.array([9, 10, 11, 12, 13])])
    out += packer.add_document([np.array([20, 21, 22, 23, 24, 25, 26, 27, 28, 29])])
    out += packer.finish()
    seqs = [inst.tokens_a.tolist() for inst in out]
    assert seqs == [
        [1, 2, 3, 4, 5, 6, sep, 7, 8],
        [9, 10, 11, 12, 13],
        [20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
    ]
    assert all(inst.tokens_b is None for inst in out)
