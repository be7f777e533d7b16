"""Statistical and exact properties of the vectorised 80/10/10 (and whole-word) masking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.data.masking import counter_uniforms, mask_tokens

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 1000
SPECIALS = torch.tensor([PAD, UNK, CLS, SEP, MASK])


def _batch(B: int = 1200, T: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] tokens [SEP] tokens [SEP] [PAD]...; lengths vary; >= 100k real tokens in total."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    pos = torch.arange(T).expand(B, T)
    ids[:, 0] = CLS
    ids[pos == (lengths[:, None] // 2)] = SEP
    ids[pos == lengths[:, None] - 1] = SEP
    ids[pos >= lengths[:, None]] = PAD
    return ids, torch.isin(ids, SPECIALS)


def _mask(ids, special, **kw):
    kw.setdefault("candidate_ids", torch.arange(5, VOCAB))
    return mask_tokens(ids, special, mask_token_id=MASK, vocab_size=VOCAB, **kw)


@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_rate_split_and_specials_over_100k_tokens(rate: float) -> None:
    ids, special = _batch()
    n_cand = int((~special).sum())
    assert n_cand >= 100_000
    masked, labels = _mask(ids, special, rate=rate, generator=torch.Generator().manual_seed(1))
    selected = labels != -100
    assert not selected[special].any()  # no special or pad token is ever a target
    assert (labels[selected] == ids[selected]).all()
    assert (masked[~selected] == ids[~selected]).all()  # only targets change
    assert abs(selected.sum().item() / n_cand - rate) < 0.002  # exact count per row, rounding only
    assert (selected.sum(1) >= 1).all()
    n = selected.sum().item()
    frac_mask = (masked[selected] == MASK).sum().item() / n
    frac_same = (masked[selected] == ids[selected]).sum().item() / n
    frac_random = 1 - frac_mask - frac_same
    # a random draw equals the original with probability ~1/995, counted as "same"
    assert (
        abs(frac_mask - 0.8) < 0.01
        and abs(frac_random - 0.1) < 0.01
        and abs(frac_same - 0.1) < 0.01
    )
    replaced = masked[selected & (masked != MASK) & (masked != ids)]
    assert not torch.isin(replaced, SPECIALS).any()  # never a special as random replacement
    # random replacements spread over the candidate ids (>= 1,600 draws over 995 ids: about
    # 800 distinct ids expected from a uniform draw)
    assert len(replaced.unique()) > 650


def test_configurable_replace_probs() -> None:
    ids, special = _batch(300)
    masked, labels = _mask(
        ids, special, replace_probs=(0.5, 0.0, 0.5), generator=torch.Generator().manual_seed(0)
    )
    sel = labels != -100
    assert abs((masked[sel] == MASK).float().mean().item() - 0.5) < 0.03
    assert ((masked[sel] == MASK) | (masked[sel] == ids[sel])).all()


def test_same_seed_same_mask_other_seed_other_mask() -> None:
    ids, special = _batch(64)
    a = _mask(ids, special, generator=torch.Generator().manual_seed(7))
    b = _mask(ids, special, generator=torch.Generator().manual_seed(7))
    c = _mask(ids, special, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_whole_word_masking_takes_complete_words() -> None:
    ids, special = _batch(800)
    g = torch.Generator().manual_seed(3)
    # about 40% of pieces continue the previous word ("##" pieces)
    continuation = (torch.rand(ids.shape, generator=g) < 0.4) & ~special
    masked, labels = _mask(ids, special, word_starts=~continuation, generator=g)
    selected = labels != -100
    assert not selected[special].any()
    # a word = a start piece and the continuation pieces after it; all or nothing
    word_id = (~continuation | special).long().cumsum(1)
    for b in range(0, 800, 7):
        for w in word_id[b][selected[b]].unique():
            in_word = (word_id[b] == w) & ~special[b]
            assert selected[b][in_word].all()
    rate = selected.sum().item() / (~special).sum().item()
    assert 0.12 < rate <= 0.16  # whole words fill the budget from below


def test_max_predictions_and_at_least_one_per_row() -> None:
    ids, special = _batch(200)
    _, labels = _mask(ids, special, max_predictions=5, generator=torch.Generator().manual_seed(0))
    per_row = (labels != -100).sum(1)
    assert per_row.max() == 5 and per_row.min() >= 1
    short = torch.tensor([[CLS, 17, SEP, PAD, PAD], [CLS, SEP, PAD, PAD, PAD]])
    _, labels = _mask(
        short, torch.isin(short, SPECIALS), generator=torch.Generator().manual_seed(0)
    )
    assert labels[0].tolist() == [-100, 17, -100, -100, -100]  # one token: always predicted
    assert (labels[1] == -100).all()  # nothing maskable: nothing predicted


def test_counter_uniforms_depend_only_on_seed_epoch_index_position() -> None:
    u = counter_uniforms(5, 2, [10, 11, 12], 16)
    assert u.shape == (3, 3, 16) and u.dtype == torch.float64
    assert float(u.min()) >= 0 and float(u.max()) < 1
    # the same example in another batch, another row, padded longer: same numbers
    v = counter_uniforms(5, 2, [99, 12], 40)
    assert torch.equal(v[:, 1, :16], u[:, 2])
    assert not torch.equal(counter_uniforms(5, 3, [12], 16)[:, 0], u[:, 2])  # next epoch
    assert not torch.equal(counter_uniforms(6, 2, [12], 16)[:, 0], u[:, 2])  # other seed
    big = counter_uniforms(0, 0, np.arange(2000), 64).flatten()
    assert abs(big.mean().item() - 0.5) < 0.005 and abs(big.var().item() - 1 / 12) < 0.002


def test_mask_of_an_example_is_independent_of_batch_and_padding() -> None:
    ids, special = _batch(8, 40)
    full = _mask(ids, special, uniforms=counter_uniforms(1, 0, range(8), 40))
    # example 3 alone, trimmed to its length
    length = int((ids[3] != PAD).sum())
    one = _mask(
        ids[3:4, :length], special[3:4, :length], uniforms=counter_uniforms(1, 0, [3], length)
    )
    assert torch.equal(one[0][0], full[0][3, :length]) and torch.equal(
        one[1][0], full[1][3, :length]
    )


def test_invalid_arguments_raise() -> None:
    ids, special = _batch(2, 8)
    with pytest.raises(ValueError, match="rate"):
        _mask(ids, special, rate=0.0)
    with pytest.raises(ValueError, match="replace_probs"):
        _mask(ids, special, replace_probs=(0.8, 0.1, 0.2))
