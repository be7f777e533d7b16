"""The model against Hugging Face transformers: same names, same shapes, same function."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from bertforge import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)


def hf_config(cfg: BertConfig, **extra) -> transformers.BertConfig:
    d = cfg.to_dict()
    d.pop("architectures", None)
    d.update(extra)
    return transformers.BertConfig(**d)


def padded_batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    mask[3, 10:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    types[mask == 0] = 0
    return ids, mask, types


def test_state_dict_keys_and_shapes_equal_hf(tiny_config):
    ours = BertForPreTraining(tiny_config).state_dict()
    theirs = transformers.BertForPreTraining(hf_config(tiny_config)).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {
        k: tuple(v.shape) for k, v in theirs.items()
    }


@pytest.mark.parametrize("direction", ["ours_to_hf", "hf_to_ours"])
def test_pretraining_outputs_match_hf(tiny_config, direction):
    torch.manual_seed(1)
    ours = BertForPreTraining(tiny_config).eval()
    hf = transformers.BertForPreTraining(hf_config(tiny_config)).eval()
    if direction == "ours_to_hf":
        hf.load_state_dict(ours.state_dict())
    else:
        ours.load_state_dict(hf.state_dict())
    ids, mask, types = padded_batch(tiny_config.vocab_size)
    labels = torch.full_like(ids, -100)
    labels[0, [1, 4]] = torch.tensor([7, 8])
    labels[1, 2] = 9
    labels[2, 1] = 11
    labels[3, 9] = 12
    nsp = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        a = ours(ids, mask, types)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        # padded positions carry no meaning; compare the real tokens
        real = mask.bool()
        torch.testing.assert_close(
            a.prediction_logits[real], b.prediction_logits[real], atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-5, rtol=0
        )
        a = ours(ids, mask, types, labels=labels, next_sentence_label=nsp)
        b = hf(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=types,
            labels=labels,
            next_sentence_label=nsp,
        )
        torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=0)
        # sparse logits are exactly the dense logits at the labelled positions
        torch.testing.assert_close(
            a.prediction_logits, b.prediction_logits[labels != -100], atol=1e-5, rtol=0
        )


def test_sparse_mlm_loss_equals_dense_and_gradients_match(tiny_config):
    torch.manual_seed(2)
    model = BertForMaskedLM(tiny_config).eval()
    ids, mask, types = padded_batch(tiny_config.vocab_size, seed=3)
    labels = torch.full_like(ids, -100)
    labels[
        mask.bool() & (torch.rand(ids.shape, generator=torch.Generator().manual_seed(4)) < 0.3)
    ] = 5
    labels[0, 0] = 6
    sparse = model(ids, mask, types, labels=labels)
    sparse.loss.backward()
    g_sparse = model.bert.embeddings.word_embeddings.weight.grad.clone()
    model.zero_grad()
    dense_logits = model(ids, mask, types).logits
    dense = torch.nn.functional.cross_entropy(
        dense_logits.view(-1, tiny_config.vocab_size), labels.view(-1)
    )
    dense.backward()
    torch.testing.assert_close(sparse.loss, dense, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        g_sparse, model.bert.embeddings.word_embeddings.weight.grad, atol=1e-6, rtol=1e-5
    )


def test_training_gradients_match_hf(tiny_config):
    """Train mode with gradients recorded (the path with in-place sums, sparse prediction and
    skipped padding): loss and every parameter's gradient equal transformers'. Dropout 0 keeps
    both sides deterministic."""
    torch.manual_seed(4)
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    ours = BertForPreTraining(tiny_config).train()
    with torch.no_grad():  # non-zero biases and LayerNorm affines
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf = transformers.BertForPreTraining(hf_config(tiny_config)).train()
    hf.load_state_dict(ours.state_dict())
    ids, mask, types = padded_batch(tiny_config.vocab_size)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = torch.tensor([7, 8, 9, 10])
    labels[0, 8] = 11
    nsp = torch.tensor([0, 1, 1, 0])
    kwargs = dict(attention_mask=mask, token_type_ids=types, labels=labels, next_sentence_label=nsp)
    a = ours(ids, **kwargs).loss
    b = hf(input_ids=ids, **kwargs).loss
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("task", ["sequence", "token"])
def test_task_model_training_gradients_match_hf_over_two_steps(tiny_config, task):
    """The task models in training (skipped padding, the tagger's labelled rows only, the word
    table's gradient in a reused buffer): over two backward passes, the second with the first's
    gradient zeroed in place and one with it set to None, every gradient equals transformers'."""
    from bertforge.modeling.model import BertForTokenClassification

    torch.manual_seed(6)
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    tiny_config.num_labels = 3
    mine, theirs = {
        "sequence": (BertForSequenceClassification, transformers.BertForSequenceClassification),
        "token": (BertForTokenClassification, transformers.BertForTokenClassification),
    }[task]
    ours = mine(tiny_config).train()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf = theirs(hf_config(tiny_config)).train()
    hf.load_state_dict(ours.state_dict())
    for step, set_to_none in enumerate((False, True)):
        ids, mask, types = padded_batch(tiny_config.vocab_size, seed=step)
        ids[0, :3] = ids[1, 4]  # a word repeated in the batch: its rows' gradients add up
        if task == "sequence":
            labels = torch.tensor([0, 2, 1, 1])
        else:
            labels = torch.randint(0, 3, ids.shape)
            labels[mask == 0] = -100
            labels[:, 0] = -100
        kwargs = dict(attention_mask=mask, token_type_ids=types, labels=labels)
        a, b = ours(ids, **kwargs).loss, hf(input_ids=ids, **kwargs).loss
        a.backward()
        b.backward()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        hf_params = dict(hf.named_parameters())
        for name, p in ours.named_parameters():
            expected = hf_params[name].grad
            torch.testing.assert_close(p.grad, expected, atol=1e-5, rtol=1e-4, msg=name)
        ours.zero_grad(set_to_none=set_to_none)
        hf.zero_grad(set_to_none=set_to_none)


def test_attention_probabilities_match_hf(tiny_config):
    torch.manual_seed(5)
    ours = BertModel(tiny_config).eval()
    hf = transformers.BertModel(hf_config(tiny_config, attn_implementation="eager")).eval()
    hf.load_state_dict(ours.state_dict())
    ids, mask, types = padded_batch(tiny_config.vocab_size)
    with torch.no_grad():
        a = ours(ids, mask, types, output_attentions=True)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
        fast = ours(ids, mask, types)
    assert len(a.attentions) == tiny_config.num_hidden_layers
    for x, y in zip(a.attentions, b.attentions, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)
    # the explicit-softmax path and the fused SDPA path compute the same function
    torch.testing.assert_close(a.last_hidden_state, fast.last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_labels", [3, 1])
def test_sequence_classification_matches_hf(tiny_config, num_labels):
    cfg = BertConfig(**{**tiny_config.__dict__, "num_labels": num_labels})
    torch.manual_seed(6)
    ours = BertForSequenceClassification(cfg).eval()
    hf = transformers.BertForSequenceClassification(hf_config(cfg)).eval()
    hf.load_state_dict(ours.state_dict())
    ids, mask, types = padded_batch(cfg.vocab_size)
    labels = torch.tensor([0, 2, 1, 2]) if num_labels == 3 else torch.tensor([0.5, -1.0, 2.0, 0.0])
    with torch.no_grad():
        a = ours(ids, mask, types, labels=labels)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=0)


def test_initialisation_follows_bert(tiny_config):
    model = BertForPreTraining(
        BertConfig(
            **{
                **tiny_config.__dict__,
                "vocab_size": 2000,
                "hidden_size": 128,
                "num_attention_heads": 2,
                "intermediate_size": 256,
            }
        )
    )
    w = model.bert.encoder.layer[0].attention.self.query.weight
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert torch.count_nonzero(model.bert.encoder.layer[0].attention.self.query.bias) == 0
    assert torch.all(model.bert.embeddings.word_embeddings.weight[0] == 0)  # [PAD] row
    assert torch.all(model.bert.embeddings.LayerNorm.weight == 1)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_presets_follow_google_sizes():
    mini = BertConfig.preset("mini")
    assert (
        mini.num_hidden_layers,
        mini.hidden_size,
        mini.num_attention_heads,
        mini.intermediate_size,
    ) == (4, 256, 4, 1024)
    base = BertConfig.preset("base")
    assert base == BertConfig(architectures=None)


def test_too_long_input_says_what_to_do(tiny_config):
    model = BertModel(tiny_config)
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        model(torch.ones(1, 65, dtype=torch.long))


@pytest.mark.slow
def test_real_minilm_weights_match_hf(minilm_dir: Path, shared_data: Path):
    ours = BertModel.from_pretrained(minilm_dir).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    lines = [
        ln.strip()
        for ln in (shared_data / "wikitext2" / "wiki.valid.tokens").read_text().splitlines()
        if len(ln.split()) > 3 and not ln.startswith(" =")
    ][:24]
    lines += ["Hi.", "The cat sat on the mat, and then it slept for a very long time indeed."]
    batch = tok(lines, padding=True, truncation=True, max_length=128, return_tensors="pt")
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 10  # many different lengths
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        b = theirs(**batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(
        a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)
