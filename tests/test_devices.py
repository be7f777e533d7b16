"""Every buffer, padded layout and fused path follows its inputs' device: checked without a GPU.

The tensors of these tests report the ``meta`` device while their numbers sit in CPU memory
(``tests/support/device_audit.py``): the model takes the paths it takes on a GPU, and any operation that
meets a CPU tensor beside them fails as CUDA would ("Expected all tensors to be on the same
device"). Issue 40's crash (the tied decoder's padded logits allocated on the CPU by
``ops.scratch``) fails here. ``forced`` runs the CPU-tuned torch forms (scratch pools, padded
decoder rows, the summed embedding gradient, the scratch products) on that device too, where
only the CPU would choose them. The numbers match the same step on the CPU (without dropout,
whose masks the CPU draws in its own way).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.device_audit import DEVICE, DeviceAudit, to_cpu, to_fake_device
from test_fast_paths import padded_batch

from bertforge.modeling import ops
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForReplacedTokenDetection,
    BertForSequenceClassification,
    BertModel,
    bag_of_words_loss,
    contrastive_loss,
)
from bertforge.modeling.ops import common, embedding, loss, products
from bertforge.training.objectives import objective_for
from bertforge.training.optim import build_optimizer
from bertforge.training.pretrain import train_step
from bertforge.training.steps import set_dropout

MODELS = {
    "mlm_nsp": BertForPreTraining,
    "mlm": BertForMaskedLM,
    "rtd": BertForReplacedTokenDetection,
    "mlm_contrastive": BertForPreTraining,
}


@pytest.fixture(autouse=True)
def _restore_global_rng():
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


@pytest.fixture(params=[False, True], ids=["chosen", "forced"])
def forced(request, monkeypatch) -> bool:
    """``forced``: the CPU-tuned torch forms (``ops.cpu_tuned``) run on the other device too."""
    if request.param:
        for module in (products, loss, embedding):  # each module that asks it
            monkeypatch.setattr(module, "cpu_tuned", lambda *tensors: True)
    return request.param


def pretraining_batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """test_fast_paths' padded batch (MLM and NSP labels on real tokens) with contrastive
    partners."""
    return {**padded_batch(vocab, seed), "partner": torch.tensor([1, 0, -1, 4, 3])}


def fake_run(model: torch.nn.Module, objective: str, device: torch.device) -> SimpleNamespace:
    """What ``pretrain.train_step`` reads of a run: the config, one process, the model."""
    train = SimpleNamespace(
        objective=objective,
        nsp_weight=1.0,
        bow_weight=0.5 if objective == "mlm_nsp" else 0.0,
        bow_target="shared",  # both segments' bags built on the device
        similarity_weight=0.5 if objective == "mlm_nsp" else 0.0,  # its target too
        contrastive_temperature=0.05,
        max_grad_norm=1.0,
    )
    return SimpleNamespace(
        cfg=SimpleNamespace(train=train),
        info=SimpleNamespace(world_size=1, enabled=False),
        device=device,
        precision="fp32",
        forward=model,
        compiled=False,
        raw=model,
        ddp=model,
        objective=objective_for(train),
    )


def pretraining_step(model, objective, batch, device):
    """``pretrain.train_step`` (forward, every loss of the objective, backward, clipping) and
    an AdamW step; returns the step's report and the optimizer."""
    run = fake_run(model, objective, device)
    if objective == "mlm_nsp":  # the bag-of-words and similarity losses ride on mlm_nsp
        run.objective.bow_weights = torch.linspace(0.0, 1.0, model.config.vocab_size).to(device)
    optimizer = build_optimizer(model, 1e-3)
    report, _ = train_step(run, [batch], stop_requested=False)
    optimizer.step()
    return report, optimizer


@pytest.mark.parametrize("objective", list(MODELS))
def test_a_pretraining_step_keeps_every_tensor_on_the_device(tiny_config, forced, objective):
    """MLM, NSP, bag of words, pair similarity, replaced-token detection, contrastive: forward,
    backward, clipping and AdamW on the other device; nothing meets a CPU tensor, and the losses
    and updated weights equal the same step run on the CPU."""
    torch.manual_seed(0)
    reference = MODELS[objective](tiny_config).train()
    model = MODELS[objective](tiny_config).train()
    model.load_state_dict(reference.state_dict())
    for m in (reference, model):  # the CPU draws its dropout masks otherwise
        set_dropout(m, 0.0)
    batch = pretraining_batch(tiny_config.vocab_size)
    torch.manual_seed(1)
    expected, _ = pretraining_step(reference, objective, batch, torch.device("cpu"))
    with DeviceAudit() as audit:
        to_fake_device(model)
        audit.reset()
        torch.manual_seed(1)
        report, _ = pretraining_step(model, objective, batch, DEVICE)
    assert not audit.mixed, audit.report()
    assert report.losses.keys() == expected.losses.keys()
    for name, value in expected.losses.items():
        assert report.losses[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(to_cpu(p).detach(), q.detach(), msg=name)


def test_the_model_step_creates_nothing_on_the_cpu(tiny_config, forced):
    """The model's own forward and backward (no loop bookkeeping): every tensor they make is
    on the device; the losses of every head are computed there."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).train()
    batch = pretraining_batch(tiny_config.vocab_size)
    with DeviceAudit() as audit:
        to_fake_device(model)
        on = {k: v.to(DEVICE) for k, v in batch.items()}
        audit.reset()
        out = model(**{k: v for k, v in on.items() if k != "partner"})
        doc, _ = contrastive_loss(out.pooler_output, on["partner"], 0.05)
        words = model.bert.embeddings.word_embeddings.weight
        weights = torch.ones(tiny_config.vocab_size, device=DEVICE)
        bow = bag_of_words_loss(out.pooler_output, words, on["input_ids"], weights)
        (out.loss + doc + bow).backward()
    assert not audit.mixed and not audit.created_on_cpu, audit.report()
    assert all(p.grad.device == DEVICE for p in model.parameters())


def test_classification_and_inference_stay_on_the_device(tiny_config, forced):
    """Fine-tuning's step (labels: the last layer on [CLS] only), classify (cls_only), embed
    (skipped padding) and fill-mask (dense logits) on the other device."""
    torch.manual_seed(0)
    config = tiny_config
    classifier = BertForSequenceClassification(config).train()
    encoder = BertModel(config).eval()
    mlm = BertForMaskedLM(config).eval()
    batch = pretraining_batch(config.vocab_size)
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    with DeviceAudit() as audit:
        for model in (classifier, encoder, mlm):
            to_fake_device(model)
        on = {k: batch[k].to(DEVICE) for k in inputs}
        labels = torch.tensor([0, 1, 0, 1, 1]).to(DEVICE)
        optimizer = build_optimizer(classifier, 1e-3)
        audit.reset()
        classifier(**on, labels=labels).loss.backward()
        optimizer.step()
        with torch.no_grad():
            classifier.eval()
            logits = classifier(**on, cls_only=True).logits
            hidden = encoder(**on, skip_padding=True).last_hidden_state
            words = mlm(**on).logits
    assert not audit.mixed and not audit.created_on_cpu, audit.report()
    assert logits.device == hidden.device == words.device == DEVICE
    assert words.shape == (*batch["input_ids"].shape, config.vocab_size)


def test_cpu_only_paths_are_chosen_only_for_cpu_tensors(tiny_config):
    """The C kernels and CPU buffer pools: chosen for CPU tensors, never for others."""
    x = torch.randn(4, 8)
    assert ops.cpu_tuned(x) and common._fp32_cpu(x)
    with DeviceAudit():
        y = x.to(DEVICE)
        assert not ops.cpu_tuned(y) and not common._fp32_cpu(y)
        assert not ops.cpu_tuned(x, y)
        assert ops.scratch("test.device", (3, 5), torch.float32, DEVICE).device == DEVICE
        rows = ops.padded_rows("test.device", (3, 5), 16, torch.float32, DEVICE)
        assert rows.device == DEVICE and rows.stride() == (16, 1)


def test_a_step_waits_for_the_device_once(tiny_config):
    """Host-device syncs of an MLM step on packed sequences (no padding): one read of the
    step's loss sums and gradient norm for the non-finite guard and the log. The sparse head's
    rows are found on the host by the loop (``masked_rows``: no ``nonzero`` on the device in
    the middle of the forward pass); the loop's bookkeeping never waits inside the step (it
    sums each micro-batch's counts on the CPU before); the attention mask of a batch without
    padding is dropped on the host (no ``mask.all()``)."""
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_config).train()
    batch = pretraining_batch(tiny_config.vocab_size)
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    with DeviceAudit() as audit:
        to_fake_device(model)
        audit.reset()
        pretraining_step(model, "mlm", batch, DEVICE)
    assert len(audit.syncs) == 1 and audit.syncs[0].endswith("to the CPU"), audit.syncs


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded, static rows"])
def test_the_pretraining_model_compiles_to_one_graph_given_its_masked_rows(tiny_config, padded):
    """The whole ``BertForPreTraining`` (MLM + NSP losses) is one graph when the loop hands it
    the masked positions (``masked_rows``) and NSP labels only when some pair has one: no
    ``nonzero`` of the labels nor ``bool(labels.any())`` inside (each broke the graph, and
    each is a wait for the GPU). A padded batch, as the compiled loop passes it, keeps its
    padding (no ``nonzero`` of the mask to skip it) and its masked rows come padded to a count
    that stays put (``static_masked_rows``): one graph too, so one compile serves every step."""
    import torch._dynamo

    from bertforge.data.loader import masked_rows, static_masked_rows

    model = BertForPreTraining(tiny_config).train().to("meta")
    batch = pretraining_batch(tiny_config.vocab_size)
    rows = static_masked_rows(batch["labels"], 0.15) if padded else masked_rows(batch["labels"])
    batch = {k: v.to("meta") for k, v in batch.items()}
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(
        batch["input_ids"],
        attention_mask=batch["attention_mask"] if padded else None,
        token_type_ids=batch["token_type_ids"],
        labels=batch["labels"],
        next_sentence_label=batch["next_sentence_label"],
        masked_rows=rows.to("meta"),
    )
    torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), [
        str(r.reason)[:200] for r in explained.break_reasons
    ]


def test_the_encoder_compiles_to_one_graph_with_or_without_padding(tiny_config):
    """``torch.compile`` of the encoder on a non-CPU device (``meta`` here: dynamo traces, no
    numbers) sees one graph, with an attention mask too: whether the batch is padded is never
    read from the mask inside the graph (it broke the graph at ``bool(mask.all())``)."""
    import torch._dynamo

    model = BertModel(tiny_config).train().to("meta")
    batch = {k: v.to("meta") for k, v in pretraining_batch(tiny_config.vocab_size).items()}
    for mask in (None, batch["attention_mask"]):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(batch["input_ids"], mask, batch["token_type_ids"])
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), [
            str(r.reason)[:200] for r in explained.break_reasons
        ]
    torch._dynamo.reset()
