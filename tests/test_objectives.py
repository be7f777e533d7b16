"""The pretraining objectives as units (``training/objectives.py``): the registry matches the
config's choices, each objective's named terms come out of its model, the training step sums
whatever terms an objective names (a new one included) with their units and weights, and an
unknown name is a one-line error naming the option."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import get_args

import pytest
import torch
from test_fast_paths import padded_batch

from bertforge.data.loader import masked_rows
from bertforge.errors import BertforgeError
from bertforge.training.config import Objective as ObjectiveName
from bertforge.training.config import TrainConfig
from bertforge.training.objectives import (
    OBJECTIVES,
    UNITS,
    MaskedLM,
    Objective,
    Term,
    objective_class,
    objective_for,
    unit_counts,
)
from bertforge.training.pretrain import train_step
from bertforge.training.steps import set_dropout

TERMS = {
    "mlm": {"mlm_loss": Term("masked")},
    "mlm_nsp": {"mlm_loss": Term("masked"), "nsp_loss": Term("pairs", 2.0)},
    "rtd": {"mlm_loss": Term("masked"), "rtd_loss": Term("tokens", 50.0)},
    "mlm_contrastive": {"mlm_loss": Term("masked"), "contrastive_loss": Term("pairs")},
}
"""Each objective's terms with ``nsp_weight`` 2 where it applies, as the log names them."""


def train_config(objective: str, **options) -> TrainConfig:
    weight = {"nsp_weight": 2.0} if objective == "mlm_nsp" else {}
    return TrainConfig(objective=objective, max_steps=1, **(weight | options))


def batch_for(objective: type[Objective], vocab: int) -> dict[str, torch.Tensor]:
    """test_fast_paths' padded batch, with contrastive partners (rows 0-1 and 3-4)."""
    batch = padded_batch(vocab)
    batch["masked_rows"] = masked_rows(batch["labels"])  # as the loop hands them over
    if objective.split_pairs:
        batch["partner"] = torch.tensor([1, 0, -1, 4, 3])
    return batch


def one_step(model: torch.nn.Module, objective: Objective, micro_batches: list[dict]):
    """``pretrain.train_step`` on a run of one process, the model as it is."""
    run = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(max_grad_norm=1.0)),
        info=SimpleNamespace(world_size=1, enabled=False),
        device=torch.device("cpu"),
        precision="fp32",
        forward=model,
        compiled=False,  # eager: the masked rows as the labels give them
        raw=model,
        ddp=model,
        objective=objective,
    )
    report, stop = train_step(run, micro_batches, stop_requested=False)
    assert not stop
    return report


def test_the_registry_holds_every_objective_the_config_offers():
    assert list(OBJECTIVES) == list(get_args(ObjectiveName))  # the same names, the same order
    for name, cls in OBJECTIVES.items():
        assert cls.name == name and objective_class(name) is cls


def test_an_unknown_objective_is_one_line_naming_the_option():
    with pytest.raises(BertforgeError) as caught:
        objective_class("mlm_sop")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--train.objective 'mlm_sop'")
    assert "mlm_nsp, mlm, rtd, mlm_contrastive" in message
    with pytest.raises(BertforgeError, match="--train.objective 'mlm_sop': choose one of"):
        TrainConfig(objective="mlm_sop", max_steps=1)  # the config says the same


def test_each_objective_declares_its_data_and_model():
    pairs = {name for name, cls in OBJECTIVES.items() if cls.reads_pairs}
    assert pairs == {"mlm_nsp", "mlm_contrastive"}
    assert [n for n, cls in OBJECTIVES.items() if cls.split_pairs] == ["mlm_contrastive"]
    assert {n: cls.model_class.__name__ for n, cls in OBJECTIVES.items()} == {
        "mlm_nsp": "BertForPreTraining",
        "mlm": "BertForMaskedLM",
        "rtd": "BertForReplacedTokenDetection",
        "mlm_contrastive": "BertForPreTraining",
    }


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_each_objective_names_its_terms_and_the_step_logs_them(tiny_config, name):
    objective = objective_for(train_config(name))
    assert objective.terms == TERMS[name]
    torch.manual_seed(0)
    model = objective.model_class(tiny_config).train()
    set_dropout(model, 0.0)
    batch = batch_for(type(objective), tiny_config.vocab_size)
    counts = dict(zip(UNITS, unit_counts(batch, objective.pair_field), strict=True))
    torch.manual_seed(1)  # rtd's generator samples its replacements from the global RNG
    output = model(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        labels=batch["labels"],
        **objective.forward_kwargs(batch, counts),
    )
    terms = objective.losses(output, batch, model)
    assert set(terms) == set(TERMS[name]) | set(objective.scores)
    for term in TERMS[name]:
        assert terms[term].ndim == 0 and math.isfinite(float(terms[term].detach())), term
    # the step: the terms by name, and the loss their weighted sum
    torch.manual_seed(1)
    report = one_step(model, objective, [batch])
    assert list(report.losses) == ["loss", *TERMS[name], *objective.scores]
    weighted = sum(t.weight * report.losses[n] for n, t in TERMS[name].items())
    assert report.losses["loss"] == pytest.approx(weighted, rel=1e-12)
    for term in TERMS[name]:  # one micro-batch: the logged term is the model's own
        assert report.losses[term] == pytest.approx(float(terms[term].detach()), rel=1e-5), term
    assert report.tokens == float(batch["attention_mask"].sum())


def test_the_bag_of_words_term_rides_on_mlm_nsp_with_its_weight(tiny_config):
    objective = objective_for(train_config("mlm_nsp", bow_weight=0.5))
    assert objective.terms["bow_loss"] == Term("pairs", 0.5)
    objective.bow_weights = torch.linspace(0.0, 1.0, tiny_config.vocab_size)
    torch.manual_seed(0)
    model = objective.model_class(tiny_config).train()
    report = one_step(model, objective, [batch_for(type(objective), tiny_config.vocab_size)])
    losses = report.losses
    assert list(losses) == ["loss", "mlm_loss", "nsp_loss", "bow_loss"] and losses["bow_loss"] > 0
    expected = losses["mlm_loss"] + 2.0 * losses["nsp_loss"] + 0.5 * losses["bow_loss"]
    assert losses["loss"] == pytest.approx(expected, rel=1e-12)


def test_a_term_missing_from_a_micro_batch_counts_by_its_units(tiny_config):
    """Contrastive rows only in the second micro-batch: the first adds no term, and the step's
    contrastive loss is the second's (all the pairs are there); the MLM loss is the mean over
    both micro-batches' masked tokens."""
    objective = objective_for(train_config("mlm_contrastive"))
    torch.manual_seed(0)
    model = objective.model_class(tiny_config).train()
    set_dropout(model, 0.0)
    lonely = batch_for(type(objective), tiny_config.vocab_size) | {"partner": torch.full((5,), -1)}
    paired = batch_for(type(objective), tiny_config.vocab_size)
    assert "contrastive_loss" not in objective.losses(
        model(lonely["input_ids"], lonely["attention_mask"], lonely["token_type_ids"],
              labels=lonely["labels"]),
        lonely,
        model,
    )  # fmt: skip
    both = one_step(model, objective, [lonely, paired])
    model.zero_grad()
    alone = one_step(model, objective, [paired])
    assert both.losses["contrastive_loss"] == pytest.approx(alone.losses["contrastive_loss"])
    assert both.losses["contrastive_accuracy"] == alone.losses["contrastive_accuracy"]
    assert both.losses["mlm_loss"] == pytest.approx(alone.losses["mlm_loss"], rel=1e-6)


def test_a_new_objective_is_one_class(tiny_config):
    """What adding an objective takes: a subclass with its terms and losses. The step logs and
    weighs its terms without knowing its name (here: MLM plus a made-up length penalty)."""

    class MaskedLMAndNorm(MaskedLM):
        name = "mlm_norm"

        @property
        def terms(self) -> dict[str, Term]:
            return {"mlm_loss": Term("masked"), "norm_loss": Term("tokens", 0.1)}

        def losses(self, output, batch, model):
            weight = model.bert.embeddings.word_embeddings.weight
            return {"mlm_loss": output.loss, "norm_loss": weight.pow(2).mean()}

    torch.manual_seed(0)
    objective = MaskedLMAndNorm(train_config("mlm"))
    model = objective.model_class(tiny_config).train()
    set_dropout(model, 0.0)
    report = one_step(model, objective, [padded_batch(tiny_config.vocab_size)])
    assert list(report.losses) == ["loss", "mlm_loss", "norm_loss"]
    norm = float(model.bert.embeddings.word_embeddings.weight.detach().pow(2).mean())
    assert report.losses["norm_loss"] == pytest.approx(norm, rel=1e-6)
    expected = report.losses["mlm_loss"] + 0.1 * report.losses["norm_loss"]
    assert report.losses["loss"] == pytest.approx(expected, rel=1e-12)
