"""The document-level contrastive objective (``--train.objective mlm_contrastive``): sentence pairs
become single segments with their masks kept, the loss is InfoNCE as written by hand, and a real
run learns to pair the chunks of one document and leaves a model transformers loads."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_pretrain import tiny_cfg
from test_rtd import small_config

from bertforge.data.dataset import PretrainingDataset
from bertforge.data.loader import PretrainingCollator, split_pairs
from bertforge.data.masking import IGNORE_LABEL
from bertforge.errors import BertforgeError
from bertforge.modeling.model import BertForPreTraining, contrastive_loss
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.pretrain import pretrain


def test_split_pairs_makes_two_rows_per_pair_and_pairs_only_isnext():
    # [CLS]=2 [SEP]=3 [PAD]=0; row 0 IsNext, row 1 random next, row 2 one packed segment
    ids = torch.tensor(
        [[2, 10, 11, 3, 20, 21, 3], [2, 12, 3, 22, 23, 24, 3], [2, 30, 31, 32, 3, 0, 0]]
    )
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    labels = torch.full_like(ids, -100)
    labels[0, 1], labels[0, 5], labels[1, 4], labels[2, 2] = 10, 21, 23, 31
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1, -1]),
    }
    out = split_pairs(batch, pad_id=0)
    rows = [
        r[m.bool()].tolist() for r, m in zip(out["input_ids"], out["attention_mask"], strict=True)
    ]
    assert rows == [
        [2, 10, 11, 3],  # [CLS] A [SEP]
        [2, 20, 21, 3],  # [CLS] B [SEP]
        [2, 12, 3],
        [2, 22, 23, 24, 3],
        [2, 30, 31, 32, 3],  # no second segment: kept whole
    ]
    assert out["partner"].tolist() == [1, 0, -1, -1, -1]
    assert out["token_type_ids"].eq(0).all()
    assert "next_sentence_label" not in out
    flat_ids, flat_labels = out["input_ids"].flatten().tolist(), out["labels"].flatten().tolist()
    kept = [(r, lab) for r, lab in zip(flat_ids, flat_labels, strict=True) if lab != IGNORE_LABEL]
    assert kept == [(10, 10), (21, 21), (23, 23), (31, 31)]  # every label, at its own token
    assert out["labels"][out["attention_mask"] == 0].eq(IGNORE_LABEL).all()


def test_the_collator_splits_real_pairs_after_masking_them(pretraining_corpus):
    tokenizer = Tokenizer.from_file(pretraining_corpus["nsp"] / "tokenizer")
    ds = PretrainingDataset(pretraining_corpus["nsp"], "train", tokenizer)
    indices = list(range(24))
    examples = [ds[i] for i in indices]
    plain = PretrainingCollator(tokenizer, mlm_probability=0.3, seed=5)(examples, indices, 0)
    split = PretrainingCollator(tokenizer, mlm_probability=0.3, seed=5, split_pairs=True)(
        examples, indices, 0
    )
    # the same masks: the same labels in the same order, one more [CLS] per split pair
    assert split["labels"][split["labels"] != -100].tolist() == (
        plain["labels"][plain["labels"] != -100].tolist()
    )
    pairs = int((plain["token_type_ids"] == 1).any(1).sum())
    assert split["input_ids"].shape[0] == len(indices) + pairs
    assert int(split["attention_mask"].sum()) == int(plain["attention_mask"].sum()) + pairs
    is_next = int((plain["next_sentence_label"] == 0).sum())
    assert int((split["partner"] >= 0).sum()) == 2 * is_next > 0
    partner = split["partner"]
    linked = partner[partner >= 0]
    assert partner[linked].tolist() == torch.nonzero(partner >= 0).squeeze(1).tolist()


def test_contrastive_loss_is_infonce_by_hand():
    torch.manual_seed(0)
    features = torch.randn(6, 8, dtype=torch.float64)
    partner = torch.tensor([1, 0, 3, 2, -1, -1])
    loss, hits = contrastive_loss(features, partner, temperature=0.1)
    z = F.normalize(features, dim=-1)
    terms, correct = [], 0
    for i in range(4):
        sims = {j: float(z[i] @ z[j]) / 0.1 for j in range(6) if j != i}
        log_norm = math.log(sum(math.exp(s) for s in sims.values()))
        terms.append(log_norm - sims[int(partner[i])])
        correct += max(sims, key=sims.get) == int(partner[i])
    assert loss.item() == pytest.approx(sum(terms) / 4, rel=1e-5)
    assert int(hits) == correct
    none, zero = contrastive_loss(features, torch.full((6,), -1), 0.1)
    assert none is None and int(zero) == 0


def test_the_contrastive_loss_trains_the_pooler_not_the_nsp_head():
    torch.manual_seed(0)
    model = BertForPreTraining(small_config())
    ids = torch.randint(5, 60, (4, 10))
    out = model(ids, attention_mask=torch.ones_like(ids))
    loss, _ = contrastive_loss(out.pooler_output, torch.tensor([1, 0, 3, 2]), 0.05)
    loss.backward()
    assert model.bert.pooler.dense.weight.grad.abs().sum() > 0
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.cls.seq_relationship.weight.grad is None


def test_mlm_contrastive_pretrains_pairs_chunks_and_loads_in_transformers(
    pretraining_corpus, tmp_path
):
    run = tmp_path / "run"
    result = pretrain(
        tiny_cfg(
            pretraining_corpus["nsp"],
            run,
            objective="mlm_contrastive",
            max_steps=150,
            eval_every=75,
            batch_size=32,
        )
    )
    records = [r for r in read_metrics(run) if r["split"] == "train"]
    assert all({"mlm_loss", "contrastive_loss", "contrastive_accuracy"} <= set(r) for r in records)
    first = sum(r["contrastive_loss"] for r in records[:10]) / 10
    last = sum(r["contrastive_loss"] for r in records[-10:]) / 10
    assert last < first - 0.05, (first, last)  # 32-wide, 150 steps: it starts to spread them
    before, after = result["initial"]["val"], result["final"]["val"]
    assert after["loss"] < before["loss"] - 0.4
    assert 0.0 <= after["contrastive_accuracy"] <= 1.0
    assert after["nsp_accuracy"] is None  # no NSP labels in split batches
    assert (run / "curves.png").stat().st_size > 10_000

    transformers = pytest.importorskip("transformers")
    model_dir = run / "model"
    theirs = transformers.BertForPreTraining.from_pretrained(model_dir).eval()
    ours = BertForPreTraining.from_pretrained(model_dir).eval()
    batch = Tokenizer.from_file(model_dir).encode_batch(["to be or not"], return_tensors="pt")
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-4, rtol=1e-4)


def test_mlm_contrastive_needs_sentence_pairs(pretraining_corpus, tmp_path):
    cfg = tiny_cfg(
        pretraining_corpus["packed"], tmp_path / "run", objective="mlm_contrastive", max_steps=1
    )
    with pytest.raises(BertforgeError, match="--mode nsp"):
        pretrain(cfg)


def test_contrastive_temperature_must_be_positive(pretraining_corpus, tmp_path):
    with pytest.raises(BertforgeError, match="--train.contrastive_temperature"):
        tiny_cfg(pretraining_corpus["nsp"], tmp_path, contrastive_temperature=0.0)
