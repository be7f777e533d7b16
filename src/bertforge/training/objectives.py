"""The pretraining objectives, one class each: what data an objective reads, which model (and so
which heads) it trains, and its *named* loss terms. The training step
(:func:`bertforge.training.pretrain.train_step`) knows none of them by name: it counts each
micro-batch's units, calls :meth:`Objective.losses`, weighs every term by its share of the
global batch and sums the terms by name.

To add an objective: a subclass here (its ``name``, ``model_class``, data needs and
``losses``), its entry in :data:`OBJECTIVES` and its name in the config's ``Objective`` literal
(``training/config.py``; ``tests/test_objectives.py`` fails while the two disagree), and its
test in ``tests/test_objectives.py``. A new head goes into ``modeling/model.py`` with the model
class that carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import torch
from torch import Tensor

from bertforge.data.dataset import PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.modeling.auto import word_table
from bertforge.modeling.config import AnyConfig, ModernBertConfig
from bertforge.modeling.model import (
    IGNORE_INDEX,
    BertForMaskedLM,
    BertForPreTraining,
    BertForReplacedTokenDetection,
    bag_of_words_loss,
    bag_of_words_weights,
    contrastive_loss,
    segment_similarity,
    similarity_loss,
    split_half_score,
)
from bertforge.modeling.modernbert import ModernBertForMaskedLM
from bertforge.tokenizer.wordpiece import Tokenizer

PretrainingModel = (
    BertForPreTraining | BertForMaskedLM | BertForReplacedTokenDetection | ModernBertForMaskedLM
)

Unit = Literal["masked", "pairs", "tokens"]
"""What a loss term is a mean over: masked tokens, sentence pairs (or rows with a partner) or
real (non-padding) tokens."""
UNITS: tuple[Unit, ...] = get_args(Unit)

BOW_TOKENS = 50_000_000
"""Tokens of the training text counted for the bag-of-words weights (as for the word start)."""


@dataclass(frozen=True)
class Term:
    """How one named loss term enters the step's loss."""

    unit: Unit
    """Its value is a mean over these; a micro-batch's term counts by its share of them."""
    weight: float = 1.0
    """Its weight in the total loss."""


class Objective:
    """A pretraining objective: data needs, model, named loss terms. Subclasses set the class
    attributes and :meth:`losses`; an instance holds the run's weights (and what it read from
    the training split in :meth:`prepare`)."""

    name: ClassVar[str]
    """The ``--train.objective`` value."""
    model_class: ClassVar[type[PretrainingModel]]
    """The model it trains (which carries its heads)."""
    reads_pairs: ClassVar[bool] = False
    """Needs ``--mode nsp`` data (sentence pairs with their NSP labels)."""
    split_pairs: ClassVar[bool] = False
    """The collator turns each pair into two single-segment rows linked by ``partner``."""
    pair_field: ClassVar[str] = "next_sentence_label"
    """The batch field whose entries >= 0 are the ``pairs`` unit."""

    def __init__(self, train: Any) -> None:
        """``train``: the run's ``TrainConfig`` (the weights of the terms)."""
        self.train = train

    @property
    def terms(self) -> dict[str, Term]:
        """The loss terms by the name the log shows, in the order they are summed."""
        return {"mlm_loss": Term("masked")}

    @property
    def scores(self) -> dict[str, Unit]:
        """Counts logged beside the losses (not trained on), divided by the unit's total."""
        return {}

    def prepare(self, train: PretrainingDataset, tokenizer: Tokenizer, vocab_size: int) -> bool:
        """Start-up work on the training split; True when there was any (its time is charged to
        the budget)."""
        return False

    def to(self, device: torch.device) -> None:
        """Move what :meth:`prepare` made to the training device."""

    def forward_kwargs(
        self, batch: dict[str, Tensor], counts: dict[str, float]
    ) -> dict[str, Tensor]:
        """Batch fields the model takes beyond ids, mask, segments and MLM labels, given the
        micro-batch's unit ``counts`` (known on the host): by default the masked positions the
        loop found on the host (``masked_rows``), which the sparse MLM head reads instead of
        finding them on the device."""
        return {"masked_rows": batch["masked_rows"]}

    def losses(
        self, output: Any, batch: dict[str, Tensor], model: torch.nn.Module
    ) -> dict[str, Tensor]:
        """This micro-batch's loss terms by name, each a mean over its unit (a term without any
        unit in the micro-batch is left out), and the sums of its :attr:`scores`."""
        return {"mlm_loss": output.loss}


class WordWeighted(Objective):
    """An objective whose pair losses weigh each word by its frequency (``bow_weights``,
    counted once in :meth:`prepare` when :meth:`weighs_words` says a loss needs them), and
    the pair-similarity loss they share: the two segments' similarity target
    (:func:`segment_similarity`) ranked by a per-pair ``prediction``."""

    def __init__(self, train: Any) -> None:
        super().__init__(train)
        self.bow_weights: Tensor | None = None
        """Each word's weight in the bag-of-words and similarity targets (:meth:`prepare`)."""

    def weighs_words(self) -> bool:
        """Whether a loss of this run reads word weights: the similarity loss's."""
        return bool(self.train.similarity_weight)

    def prepare(self, train: PretrainingDataset, tokenizer: Tokenizer, vocab_size: int) -> bool:
        if not self.weighs_words():
            return False
        counts = train.token_counts(vocab_size, tokenizer.special_ids, BOW_TOKENS)
        self.bow_weights = bag_of_words_weights(torch.from_numpy(counts))
        return True

    def to(self, device: torch.device) -> None:
        if self.bow_weights is not None:
            self.bow_weights = self.bow_weights.to(device)

    def similarity(
        self, words: Tensor, text: Tensor, batch: dict[str, Tensor], prediction: Tensor
    ) -> Tensor | None:
        """The pair-similarity loss of ``prediction`` (B,) against the cosine of each pair's two
        segments of ``text`` (the unmasked ids) as bags of ``words`` (no gradient into the
        target); None when the micro-batch holds no pair."""
        assert self.bow_weights is not None
        pairs = batch["next_sentence_label"] >= 0  # not the rows that only pad the batch
        target = segment_similarity(words.detach(), text, batch["token_type_ids"], self.bow_weights)
        return similarity_loss(prediction, target, pairs)


def unmasked_text(batch: dict[str, Tensor]) -> Tensor:
    """(B, T) the batch's ids with each masked position's original token put back."""
    labels, ids = batch["labels"], batch["input_ids"]
    return torch.where(labels != IGNORE_INDEX, labels, ids)


class MaskedLM(WordWeighted):
    """mlm: masked language modelling alone (RoBERTa's and cramming's choice); on a ModernBERT
    with ``--train.similarity_weight``, plus BERT's pair-similarity loss on the [CLS] head.

    ModernBERT has no pooler and no token types, so the loss moves: the data is ``--mode nsp``
    pairs, [CLS] a [SEP] b [SEP], whose token types the model ignores but the target reads to
    split the two segments (the same :func:`segment_similarity` as mlm_nsp's); the prediction
    is the model's own ``head`` (dense -> GELU -> norm, the module
    ``ModernBertForSequenceClassification`` inherits) at the [CLS], read along the fixed
    :func:`split_half_score` direction, so no parameter is added and the checkpoint keeps
    transformers' keys. A BERT trains this loss with mlm_nsp (the config refuses it here)."""

    name = "mlm"
    model_class = BertForMaskedLM

    @property
    def terms(self) -> dict[str, Term]:
        terms = {"mlm_loss": Term("masked")}
        if self.train.similarity_weight:
            terms["similarity_loss"] = Term("pairs", self.train.similarity_weight)
        return terms

    def forward_kwargs(self, batch: dict[str, Tensor], counts: dict[str, float]) -> dict[str, Any]:
        out: dict[str, Any] = super().forward_kwargs(batch, counts)
        if self.train.similarity_weight:
            out["cls_head"] = True
        return out

    def losses(
        self, output: Any, batch: dict[str, Tensor], model: torch.nn.Module
    ) -> dict[str, Tensor]:
        out = {"mlm_loss": output.loss}
        if self.bow_weights is None:
            return out
        prediction = split_half_score(output.cls_head_output)  # (B,)
        similarity = self.similarity(word_table(model), unmasked_text(batch), batch, prediction)
        if similarity is not None:
            out["similarity_loss"] = similarity
        return out


class MaskedLMWithNSP(WordWeighted):
    """mlm_nsp: BERT's objective, masked LM + next-sentence prediction (``--train.nsp_weight``),
    with an optional bag-of-words loss (``--train.bow_weight``) and pair-similarity loss
    (``--train.similarity_weight``) on the pooler."""

    name = "mlm_nsp"
    model_class = BertForPreTraining
    reads_pairs = True

    @property
    def terms(self) -> dict[str, Term]:
        terms = {"mlm_loss": Term("masked"), "nsp_loss": Term("pairs", self.train.nsp_weight)}
        if self.train.bow_weight:
            terms["bow_loss"] = Term("pairs", self.train.bow_weight)
        if self.train.similarity_weight:
            terms["similarity_loss"] = Term("pairs", self.train.similarity_weight)
        return terms

    def weighs_words(self) -> bool:
        return bool(self.train.bow_weight or self.train.similarity_weight)

    def forward_kwargs(
        self, batch: dict[str, Tensor], counts: dict[str, float]
    ) -> dict[str, Tensor]:
        out = super().forward_kwargs(batch, counts)
        if counts["pairs"] > 0:  # known here: the model need not ask the device
            out["next_sentence_label"] = batch["next_sentence_label"]
        return out

    def losses(
        self, output: Any, batch: dict[str, Tensor], model: torch.nn.Module
    ) -> dict[str, Tensor]:
        out = {"mlm_loss": output.mlm_loss}
        if output.nsp_loss is not None:
            out["nsp_loss"] = output.nsp_loss
        if self.bow_weights is None:
            return out
        words, text = model.bert.embeddings.word_embeddings.weight, unmasked_text(batch)
        if self.train.similarity_weight:
            prediction = output.pooler_output.float().mean(-1)
            similarity = self.similarity(words, text, batch, prediction)
            if similarity is not None:
                out["similarity_loss"] = similarity
        if self.train.bow_weight:
            shared = None
            if self.train.bow_target == "shared":  # first segment against the second
                second = batch["token_type_ids"] == 1
                text, shared = text.masked_fill(second, -1), text.masked_fill(~second, -1)
            bow = bag_of_words_loss(
                output.pooler_output, words, text, self.bow_weights, shared_with=shared
            )
            if bow is not None:
                out["bow_loss"] = bow
        return out


class ReplacedTokenDetection(Objective):
    """rtd: ELECTRA's generator (masked LM) and discriminator (replaced or original, at every
    real token, weighted ``rtd_weight``)."""

    name = "rtd"
    model_class = BertForReplacedTokenDetection

    @property
    def terms(self) -> dict[str, Term]:
        return {
            "mlm_loss": Term("masked"),
            "rtd_loss": Term("tokens", BertForReplacedTokenDetection.rtd_weight),
        }

    def forward_kwargs(
        self, batch: dict[str, Tensor], counts: dict[str, float]
    ) -> dict[str, Tensor]:
        return {}  # the generator finds its own rows (it replaces the tokens there)

    def losses(
        self, output: Any, batch: dict[str, Tensor], model: torch.nn.Module
    ) -> dict[str, Tensor]:
        return {"mlm_loss": output.mlm_loss, "rtd_loss": output.rtd_loss}


class MaskedLMContrastive(Objective):
    """mlm_contrastive: masked LM + InfoNCE on the pooler's output between the two halves of
    each IsNext pair (``--train.contrastive_temperature``)."""

    name = "mlm_contrastive"
    model_class = BertForPreTraining
    reads_pairs = True
    split_pairs = True
    pair_field = "partner"

    @property
    def terms(self) -> dict[str, Term]:
        return {"mlm_loss": Term("masked"), "contrastive_loss": Term("pairs")}

    @property
    def scores(self) -> dict[str, Unit]:
        return {"contrastive_accuracy": "pairs"}

    def losses(
        self, output: Any, batch: dict[str, Tensor], model: torch.nn.Module
    ) -> dict[str, Tensor]:
        out = {"mlm_loss": output.mlm_loss}
        temperature = self.train.contrastive_temperature
        loss, hits = contrastive_loss(output.pooler_output, batch["partner"], temperature)
        if loss is not None:
            out["contrastive_loss"] = loss
            out["contrastive_accuracy"] = hits  # rows that ranked their partner first
        return out


OBJECTIVES: dict[str, type[Objective]] = {
    o.name: o for o in (MaskedLMWithNSP, MaskedLM, ReplacedTokenDetection, MaskedLMContrastive)
}
"""Every objective by its ``--train.objective`` name."""


def objective_class(name: str) -> type[Objective]:
    """The objective called ``name``; a one-line error naming the option otherwise."""
    if name not in OBJECTIVES:
        raise BertforgeError(f"--train.objective {name!r}: choose one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def model_class_for(objective: type[Objective], config: AnyConfig) -> type[PretrainingModel]:
    """The model ``objective`` trains on an encoder of ``config``'s architecture: its
    ``model_class`` for BERT; for ModernBERT the masked LM, the one objective it has heads for
    (a one-line error for the others)."""
    if not isinstance(config, ModernBertConfig):
        return objective.model_class
    if objective is not MaskedLM:
        raise BertforgeError(
            f"--train.objective {objective.name}: ModernBERT has no token types (a pair is one "
            "segment, [CLS] a [SEP] b [SEP]) nor the pooler and BERT heads this objective "
            "trains; use --train.objective mlm (with --train.similarity_weight and --mode nsp "
            "data for a pair loss on its [CLS])"
        )
    return ModernBertForMaskedLM  # type: ignore[return-value]


def objective_for(train: Any) -> Objective:
    """The objective of a ``TrainConfig``, holding its weights."""
    return objective_class(train.objective)(train)


def unit_counts(batch: dict[str, Tensor], pair_field: str) -> list[float]:
    """A batch's masked tokens, pairs (entries >= 0 of ``pair_field``) and real tokens, in the
    order of :data:`UNITS`, counted on the host."""
    return [
        float((batch["labels"] != IGNORE_INDEX).sum()),
        float((batch[pair_field] >= 0).sum()),
        float(batch["attention_mask"].sum()),
    ]


__all__ = [
    "OBJECTIVES",
    "UNITS",
    "MaskedLM",
    "MaskedLMContrastive",
    "MaskedLMWithNSP",
    "Objective",
    "ReplacedTokenDetection",
    "Term",
    "objective_class",
    "model_class_for",
    "objective_for",
    "unit_counts",
]
