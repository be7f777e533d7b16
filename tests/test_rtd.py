"""ELECTRA's replaced-token detection (``--train.objective rtd``): the discriminator's targets are
exactly the replaced tokens, a real run learns, resumes bit-exactly and leaves an encoder and a
generator that transformers loads with our outputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from test_pretrain import tiny_cfg, train_losses, weights

from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForReplacedTokenDetection,
    BertForSequenceClassification,
    BertModel,
    sample_tokens,
)
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.pretrain import GENERATOR_DIR, pretrain


def small_config() -> BertConfig:
    return BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )


def test_the_discriminator_is_told_exactly_which_tokens_were_replaced():
    torch.manual_seed(0)
    model = BertForReplacedTokenDetection(small_config()).eval()
    assert model.generator.bert.config.num_hidden_layers == 1  # half the depth
    # the generator's embeddings are the discriminator's (one tensor, stored once)
    assert model.generator.bert.embeddings is model.bert.embeddings
    assert not any(k.startswith("generator.bert.embeddings") for k in model.state_dict())
    with torch.no_grad():  # a generator that always proposes token 7
        model.generator.cls.predictions.bias.fill_(-1e4)
        model.generator.cls.predictions.bias[7] = 1e4
    ids = torch.tensor([[2, 10, 11, 12, 13, 3, 0, 0], [2, 7, 20, 21, 22, 23, 24, 3]])
    mask = (ids != 0).long()
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 1], labels[1, 4] = 11, 7, 22  # masked: 11 -> 7, 7 -> 7, 22 -> 7
    masked = ids.clone()
    masked[labels != -100] = 4  # [MASK]
    out = model(masked, attention_mask=mask, labels=labels)
    replaced = torch.zeros_like(ids, dtype=torch.float)
    replaced[0, 2] = replaced[1, 4] = 1.0  # the sample equal to the original is not "replaced"
    real = mask.bool()
    expected = F.binary_cross_entropy_with_logits(out.rtd_logits[real], replaced[real])
    torch.testing.assert_close(out.rtd_loss, expected)
    assert int(out.rtd_tokens) == int(mask.sum())
    correct = ((out.rtd_logits[real] > 0).float() == replaced[real]).sum()
    assert int(out.rtd_correct) == int(correct)
    torch.testing.assert_close(out.loss, out.mlm_loss + 50.0 * out.rtd_loss)
    # in eval mode the samples come from a fixed seed: the same batch scores the same
    again = model(masked, attention_mask=mask, labels=labels)
    assert torch.equal(out.rtd_logits, again.rtd_logits)
    with pytest.raises(ValueError, match="needs MLM labels"):
        model(masked, attention_mask=mask)


def test_an_rtd_run_learns_resumes_exactly_and_leaves_an_hf_encoder(pretraining_corpus, tmp_path):
    cfg = tiny_cfg(pretraining_corpus["packed"], tmp_path / "full", max_steps=40, save_every=20)
    cfg = replace(
        cfg,
        masking=replace(cfg.masking, mlm_probability=0.25),
        train=replace(cfg.train, objective="rtd", keep_checkpoints=0),
    )
    full = pretrain(cfg)
    before, after = full["initial"]["val"], full["final"]["val"]
    assert after["loss"] < before["loss"] - 0.3, (before, after)  # the generator's MLM
    assert after["rtd_accuracy"] > before["rtd_accuracy"] + 0.1, (before, after)
    losses = train_losses(tmp_path / "full")
    assert len(losses) == 40 and all(v > 0 for v in losses.values())

    resumed = pretrain(
        replace(
            cfg,
            output=str(tmp_path / "resumed"),
            resume=str(tmp_path / "full" / "checkpoint-00000020"),
        )
    )
    b = train_losses(tmp_path / "resumed")
    assert sorted(b) == list(range(21, 41)) and all(losses[s] == b[s] for s in b)
    assert resumed["final"] == full["final"]
    for name in ("model", GENERATOR_DIR):
        wa, wb = weights(tmp_path / "full" / name), weights(tmp_path / "resumed" / name)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    # model/ is the discriminator as a plain encoder; generator/ a fill-mask model
    encoder_dir, generator_dir = tmp_path / "full" / "model", tmp_path / "full" / GENERATOR_DIR
    trained = BertForReplacedTokenDetection.from_pretrained(
        sorted((tmp_path / "full").glob("checkpoint-*"))[-1]
    ).eval()
    tokenizer = Tokenizer.from_file(encoder_dir)
    batch = tokenizer.encode_batch(["to be or not to be", "my lord"], return_tensors="pt")
    ours = BertModel.from_pretrained(encoder_dir).eval()
    classifier = BertForSequenceClassification.from_pretrained(encoder_dir, num_labels=2)
    assert torch.equal(
        classifier.bert.encoder.layer[1].output.dense.weight,
        trained.bert.encoder.layer[1].output.dense.weight,
    )
    generator = BertForMaskedLM.from_pretrained(generator_dir).eval()
    assert generator.config.num_hidden_layers == 1
    transformers = pytest.importorskip("transformers")
    with torch.no_grad():
        hidden = ours(**batch).last_hidden_state
        expected = trained.bert(**batch).last_hidden_state
        theirs = transformers.BertModel.from_pretrained(encoder_dir, add_pooling_layer=False)
        theirs_hidden = theirs.eval()(**batch).last_hidden_state
        logits = generator(**batch).logits
        theirs_logits = (
            transformers.BertForMaskedLM.from_pretrained(generator_dir).eval()(**batch).logits
        )
    torch.testing.assert_close(hidden, expected)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(hidden[real], theirs_hidden[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[real], theirs_logits[real], atol=1e-4, rtol=1e-4)


def test_sampled_tokens_follow_the_generators_softmax():
    probs = torch.tensor([0.2, 0.5, 0.3, 0.0])
    logits = probs.clamp_min(1e-30).log().expand(40_000, 4).contiguous()
    seed = torch.Generator().manual_seed(0)
    drawn = sample_tokens(logits, seed)
    freq = torch.bincount(drawn, minlength=4).float() / drawn.numel()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    assert sample_tokens(logits[:0]).shape == (0,)
    again = sample_tokens(logits, torch.Generator().manual_seed(0))
    assert torch.equal(drawn, again)
