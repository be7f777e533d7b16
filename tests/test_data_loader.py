"""Sampler, collator and loader: DDP equals single process, exact resume, fixed validation masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.data.loader import (
    PretrainingCollator,
    PretrainingLoader,
    PretrainingSampler,
    pinned,
    prefetch,
    steps,
    validation_batches,
)
from bertforge.data.shards import PrepareConfig, PretrainingDataset, prepare
from bertforge.errors import BertforgeError
from bertforge.tokenizer.wordpiece import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(shakespeare_file: Path) -> Tokenizer:
    return Tokenizer.train([shakespeare_file], vocab_size=800)


@pytest.fixture(scope="module")
def data_dir(tokenizer: Tokenizer, shared_data: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "wt"
    prepare(
        PrepareConfig(
            [str(shared_data / "wikitext2" / "wiki.valid.tokens")],
            "",
            str(out),
            max_seq_length=64,
            validation_fraction=0.05,
            progress=False,
        ),
        tokenizer,
    )
    return out


def test_ranks_split_each_global_batch_and_cover_the_epoch() -> None:
    single = PretrainingSampler(103, 8, seed=3)
    ranks = [PretrainingSampler(103, 8, seed=3, rank=r, world_size=2) for r in range(2)]
    it1, its = iter(single), [iter(s) for s in ranks]
    seen = []
    for _ in range(single.steps_per_epoch):
        global_batch = next(it1)
        parts = [next(it) for it in its]
        assert parts[0] == global_batch[0::2] and parts[1] == global_batch[1::2]
        seen += global_batch
    assert len(set(seen)) == 96 == len(seen)  # 12 steps x 8, no repeats; the rest is dropped
    assert single.epoch == 0
    next_epoch = next(it1)
    assert single.epoch == 1 and next_epoch != seen[:8]  # reshuffled each epoch


def test_sampler_resumes_at_its_position_across_epochs() -> None:
    a = PretrainingSampler(50, 10, seed=1)
    it = iter(a)
    for _ in range(7):  # into the second epoch
        next(it)
    state = a.state_dict()
    assert state == {"epoch": 1, "step_in_epoch": 2}
    expected = [next(it) for _ in range(6)]
    b = PretrainingSampler(50, 10, seed=1)
    b.load_state_dict(state)
    assert [batch for batch, _ in zip(b, range(6), strict=False)] == expected


def test_length_bucketing_is_deterministic_and_rank_independent() -> None:
    lengths = np.random.default_rng(0).integers(5, 128, size=400)
    kw = {"seed": 2, "lengths": lengths, "bucket_window": 10}
    full = PretrainingSampler(400, 16, **kw)
    r1 = PretrainingSampler(400, 16, rank=1, world_size=4, **kw)
    batches = [b for b, _ in zip(full, range(25), strict=False)]
    assert sorted(i for b in batches for i in b) == list(range(400))
    assert [b for b, _ in zip(r1, range(25), strict=False)] == [b[1::4] for b in batches]
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    plain = PretrainingSampler(400, 16, seed=2)
    plain_spread = np.mean([np.ptp(lengths[b]) for b, _ in zip(plain, range(25), strict=False)])
    assert spread < 0.3 * plain_spread


def test_sampler_rejects_bad_sizes() -> None:
    with pytest.raises(BertforgeError, match="not divisible by world size 3"):
        PretrainingSampler(100, 8, world_size=3)
    with pytest.raises(BertforgeError, match="fewer than one global batch"):
        PretrainingSampler(5, 8)


def test_collator_pads_to_longest_and_masks(data_dir: Path, tokenizer: Tokenizer) -> None:
    ds = PretrainingDataset(data_dir, "train", tokenizer)
    collator = PretrainingCollator(tokenizer, seed=0)
    indices = [3, 17, 40, 41]
    examples = [ds[i] for i in indices]
    batch = collator(examples, indices, epoch=0)
    longest = max(len(e["input_ids"]) for e in examples)
    assert batch["input_ids"].shape == (4, longest) and batch["labels"].shape == (4, longest)
    for b, e in enumerate(examples):
        n = len(e["input_ids"])
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (longest - n)
        assert torch.equal(batch["token_type_ids"][b, :n], torch.from_numpy(e["token_type_ids"]))
        assert (batch["input_ids"][b, n:] == tokenizer.pad_id).all()
        labels = batch["labels"][b]
        assert (labels[n:] == -100).all() and (labels != -100).sum() >= 1
        target = labels != -100
        assert torch.equal(labels[target], torch.from_numpy(e["input_ids"])[target[:n]])
    assert batch["next_sentence_label"].tolist() == [e["next_sentence_label"] for e in examples]
    assert all(v.dtype == torch.int64 for v in batch.values())


def test_two_ranks_see_the_masks_of_one_process(data_dir: Path, tokenizer: Tokenizer) -> None:
    ds = PretrainingDataset(data_dir, "train", tokenizer)
    collator = PretrainingCollator(tokenizer, seed=5, mlm_probability=0.3)
    single = PretrainingLoader(ds, PretrainingSampler(len(ds), 8, seed=9), collator)
    ranks = [
        PretrainingLoader(
            ds, PretrainingSampler(len(ds), 8, seed=9, rank=r, world_size=2), collator
        )
        for r in range(2)
    ]
    s_batch = next(iter(single))
    r_batches = [next(iter(loader)) for loader in ranks]
    for r, batch in enumerate(r_batches):
        for row in range(4):
            n = int(batch["attention_mask"][row].sum())
            for key in ("input_ids", "labels", "token_type_ids"):
                assert torch.equal(batch[key][row, :n], s_batch[key][2 * row + r, :n])


def test_loader_resume_is_exact(data_dir: Path, tokenizer: Tokenizer) -> None:
    ds = PretrainingDataset(data_dir, "train", tokenizer)

    def make() -> PretrainingLoader:
        sampler = PretrainingSampler(len(ds), 32, seed=4, lengths=ds.lengths, bucket_window=4)
        return PretrainingLoader(
            ds, sampler, PretrainingCollator(tokenizer, seed=4, whole_word=True)
        )

    loader = make()
    steps = loader.sampler.steps_per_epoch
    it = iter(loader)
    for _ in range(steps - 1):
        next(it)
    state = loader.state_dict()
    expected = [next(it) for _ in range(3)]  # crosses into epoch 1: fresh masks
    resumed = make()
    resumed.load_state_dict(state)
    it2 = iter(resumed)
    got = [next(it2) for _ in range(3)]
    for a, b in zip(expected, got, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.epoch == 1


def test_whole_word_collation_masks_complete_words(data_dir: Path, tokenizer: Tokenizer) -> None:
    ds = PretrainingDataset(data_dir, "train", tokenizer)
    collator = PretrainingCollator(tokenizer, whole_word=True, seed=1)
    indices = list(range(64))
    batch = collator([ds[i] for i in indices], indices, epoch=0)
    selected = batch["labels"] != -100
    cont = torch.from_numpy(tokenizer.is_continuation)
    original = torch.where(selected, batch["labels"], batch["input_ids"])
    special = torch.isin(original, torch.tensor(tokenizer.special_ids))
    # a continuation piece after a word piece is selected exactly when that piece is (after
    # [SEP], where truncation may have cut a word, it starts a word of its own)
    follows = cont[original][:, 1:] & ~special[:, :-1] & ~special[:, 1:]
    assert follows.sum() > 50
    assert torch.equal(selected[:, 1:][follows], selected[:, :-1][follows])
    assert (selected[:, 1:][follows]).any()


def test_validation_masks_are_fixed(data_dir: Path, tokenizer: Tokenizer) -> None:
    val = PretrainingDataset(data_dir, "validation", tokenizer)
    collator = PretrainingCollator(tokenizer, seed=0)
    first = list(validation_batches(val, collator, 8))
    second = list(validation_batches(val, collator, 5))  # other batching, same masks
    labels1 = torch.cat([b["labels"][b["attention_mask"].bool()] for b in first])
    labels2 = torch.cat([b["labels"][b["attention_mask"].bool()] for b in second])
    assert torch.equal(labels1, labels2) and sum(len(b["labels"]) for b in first) == len(val)


def test_a_prefetched_step_carries_the_position_to_resume_from(
    data_dir: Path, tokenizer: Tokenizer
) -> None:
    """The GPU loop draws steps through a thread working ahead (``prefetch``) into pinned
    memory: the batches equal the inline ones, and each step's ``position`` resumes at the step
    after it although the sampler itself has moved on; an error in the thread reaches the loop."""
    ds = PretrainingDataset(data_dir, "train", tokenizer)

    def make() -> PretrainingLoader:
        sampler = PretrainingSampler(len(ds), 16, seed=2)
        return PretrainingLoader(ds, sampler, PretrainingCollator(tokenizer, seed=2))

    inline = [next(s) for s in [steps(make(), 8)] for _ in range(4)]
    loader = make()
    ahead = prefetch(steps(loader, 8), depth=2)
    drawn = [next(ahead) for _ in range(2)]

    def same(a: list[dict], b: list[dict]) -> bool:
        return all(torch.equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)

    for a, b in zip(inline, drawn, strict=False):
        assert a.position == b.position and a.epoch == b.epoch
        assert same(a.batches, b.batches)
    resumed = make()
    resumed.load_state_dict(drawn[0].position)
    again = next(steps(resumed, 8))
    assert same(again.batches, inline[1].batches)
    assert same(pinned(inline[0]).batches, inline[0].batches)

    def broken():
        yield 1
        raise ValueError("shard 3 is damaged")

    items = prefetch(broken())
    assert next(items) == 1
    with pytest.raises(ValueError, match="shard 3"):
        next(items)
