"""``finetune --task embedding``: the parts of the fine-tuning loop (``training.finetune``) that
train sentence embeddings: the data (pairs, scored pairs or plain texts, ``data.pairs``), the
encoder, one optimizer step (:func:`embedding_step`: the batch's columns embedded and pooled,
the loss of ``training.sentence_losses``, GradCache when ``--micro_batch_size`` is below the
batch), the validation score (``evaluation.embedding``: STS or retrieval) and the saved model:
a ``BertModel`` with the sentence-transformers layout (``modules.json``, ``1_Pooling``, ...)
that ``SentenceTransformer(dir)``, ``bertforge embed`` and the server read alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.encoding import collate, encode_examples
from bertforge.data.labelled import random_split
from bertforge.data.pairs import PairData, load_pairs, unique_batches
from bertforge.evaluation.embedding import (
    baselines,
    model_vectors,
    random_vectors,
    score_vectors,
    scores_table,
)
from bertforge.modeling.auto import model_class
from bertforge.modeling.model import BertModel
from bertforge.modeling.pooling import declared_pooling, pool, write_pooling_declaration
from bertforge.runtime import autocast
from bertforge.training import steps
from bertforge.training.config import FinetuneConfig
from bertforge.training.sentence_losses import (
    cached_backward,
    embedding_loss,
    in_batch_negatives_loss,
)


@dataclass
class EmbeddingTaskData:
    """Training and validation data of an embedding run, encoded, with the pooling it trains."""

    train: PairData
    val: PairData
    columns: list[list[tuple[np.ndarray, int]]]
    """The encoded text columns the loss embeds (anchors, positives[, negatives]; plain texts
    twice: SimCSE's two dropout views)."""
    pooling: str
    normalize: bool
    warnings: list[str]
    id2label: None = None
    scale: None = None

    @property
    def encoded_train(self) -> list[tuple[np.ndarray, int]]:
        """The encoded anchors (one per training row)."""
        return self.columns[0]

    def batches(self, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
        """The epoch's batches, no text twice in one (:func:`unique_batches`) when the loss
        ranks in-batch negatives; CoSENT's scored pairs may repeat a text."""
        if self.train.kind == "scored":
            rng = np.random.default_rng([seed, epoch])
            order = rng.permutation(len(self.train))
            return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        return unique_batches(self.train.columns(), batch_size, seed=seed, epoch=epoch)


def start_pooling(cfg: FinetuneConfig) -> tuple[str, bool]:
    """``(pooling, normalize)``: those given, else the start model's declaration (a
    sentence-transformers model), else mean pooling without normalising."""
    declared, _, declared_norm = declared_pooling(cfg.model)
    pooling = cfg.pooling or declared or "mean"
    normalize = declared_norm if cfg.normalize is None else cfg.normalize
    return pooling, normalize


def load_embedding_data(cfg: FinetuneConfig, tokenizer: Any) -> EmbeddingTaskData:
    """Read and encode the training and validation data; without ``--validation`` a random
    ``--validation_fraction`` of the training rows is held out (a pure function of the seed)."""
    columns = dict(
        text_column=cfg.text_column,
        text_pair_column=cfg.text_pair_column,
        negative_column=cfg.negative_column,
        label_column=cfg.label_column,
        encoding_errors=cfg.encoding_errors,
    )
    train = load_pairs(cfg.train, **columns)
    if cfg.validation:
        val = load_pairs(cfg.validation, **columns)
    else:
        rows, val_rows = random_split(len(train), cfg.validation_fraction, cfg.seed, "rows")
        train, val = train.subset(rows), train.subset(val_rows)
    encoded = [
        encode_examples(tokenizer, texts, max_length=cfg.max_length, truncation=cfg.truncation)
        for texts in train.columns()
    ]
    if cfg.embedding_loss == "simcse":
        encoded = [encoded[0], encoded[0]]  # one text, two dropout views
    pooling, normalize = start_pooling(cfg)
    warnings = []
    if cfg.embedding_loss == "simcse" and not cfg.dropout and cfg.dropout is not None:
        warnings.append(
            "--loss simcse with --dropout 0: both views of a text are the same, nothing to learn"
        )
    return EmbeddingTaskData(train, val, encoded, pooling, normalize, warnings)


def load_embedding_model(cfg: FinetuneConfig, resume_dir: Path | None) -> BertModel:
    """The encoder of the start model (any BERT or ModernBERT directory: its heads are left
    out), or of the checkpoint being resumed."""
    directory = resume_dir or cfg.model
    return model_class(directory, "encoder").from_pretrained(directory)


def sentence_vectors(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    pooling: str,
    device: torch.device,
    precision: str,
) -> torch.Tensor:
    """(B, H) pooled float32 vectors of a padded batch, with a graph when grad is enabled."""
    with autocast(device, precision):
        # token-wise ops on the real tokens only; pooling masks the (zero) pads
        hidden = model(**batch, skip_padding=True).last_hidden_state  # (B, T, H)
    return pool(hidden.float(), batch["attention_mask"], pooling)


def embedding_step(run: Any, rows: np.ndarray) -> steps.StepReport:
    """Forward/backward of the batch ``rows``: each column embedded, the loss of the whole
    batch, GradCache (:func:`cached_backward`) when ``--micro_batch_size`` is below the batch;
    then gradient clipping."""
    cfg, data, device = run.cfg, run.data, run.device
    micro = cfg.micro_batch
    parts = [rows[i : i + micro] for i in range(0, len(rows), micro)]
    scores = None
    if data.train.scores is not None:
        scores = torch.as_tensor(data.train.scores[rows], device=device)

    def embed(c: int, m: int) -> torch.Tensor:
        examples = [data.columns[c][i] for i in parts[m]]
        batch = {k: v.to(device) for k, v in collate(examples, run.tokenizer.pad_id).items()}
        return sentence_vectors(run.model, batch, data.pooling, device, run.precision)

    def loss_of(embeddings: list[torch.Tensor]) -> torch.Tensor:
        kind = cfg.embedding_loss
        return embedding_loss(kind, embeddings, scores, scale=cfg.scale, dims=cfg.matryoshka_dims)

    if len(parts) == 1:
        loss = loss_of([embed(c, 0) for c in range(len(data.columns))])
        loss.backward()
    else:
        loss = cached_backward(embed, len(data.columns), len(parts), loss_of)
    grad_norm = steps.clip_gradients(run.model.parameters(), cfg.max_grad_norm)
    tokens = sum(len(column[i][0]) for column in data.columns for i in rows)
    return steps.StepReport(0.0, grad_norm, tokens, 0.0, {"loss": float(loss.detach())})


def memory_probe(
    data: EmbeddingTaskData, model: torch.nn.Module, pad_id: int, **kw: Any
) -> Callable[[int], torch.Tensor]:
    """``forward(k)`` for ``--max_memory``'s measurement: the ``k`` longest training rows, every
    column of them embedded with a graph (what a step without GradCache holds; a GradCache
    replay holds one column's mini-batch, so the estimate is on the safe side)."""
    total = [sum(len(column[i][0]) for column in data.columns) for i in range(len(data.train))]
    longest = np.argsort(total, kind="stable")[-4:][::-1].tolist()

    def forward(k: int) -> torch.Tensor:
        loss = torch.zeros(())
        for column in data.columns:
            batch = collate([column[i] for i in longest[:k]], pad_id)
            batch = {key: v.to(kw["device"]) for key, v in batch.items()}
            loss = loss + sentence_vectors(model, batch, data.pooling, **kw).square().sum()
        return loss

    return forward


def validate_embeddings(run: Any, model: torch.nn.Module) -> tuple[dict[str, float], None]:
    """The validation scores of ``model``: STS of scored pairs, retrieval of pairs, the SimCSE
    loss (dropout off: how spread the texts are) of plain texts."""
    cfg, data = run.cfg, run.data
    options = dict(
        pooling=data.pooling,
        normalize=data.normalize,
        batch_size=cfg.eval_batch_size,
        max_length=cfg.max_length,
        precision=run.precision,
    )
    vectors = model_vectors(model, run.tokenizer, **options)
    if data.val.kind == "texts":
        return {"loss": texts_loss(vectors(data.val.anchors), cfg.batch_size, cfg.scale)}, None
    return score_vectors(data.val, vectors), None


def texts_loss(vectors: np.ndarray, batch_size: int, scale: float) -> float:
    """The in-batch-negatives loss of texts as their own positives, over batches in order."""
    v = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
    losses = [
        float(in_batch_negatives_loss(v[i : i + batch_size], v[i : i + batch_size], scale=scale))
        * len(v[i : i + batch_size])
        for i in range(0, len(v), batch_size)
    ]
    return sum(losses) / len(v)


def validation_baselines(
    cfg: FinetuneConfig, data: EmbeddingTaskData, dim: int
) -> dict[str, dict[str, float]]:
    """Constant and random ``dim``-wide vectors scored on the validation data; ``random`` is the
    one printed beside every validation score."""
    if data.val.kind == "texts":
        texts = data.val.anchors
        random = texts_loss(random_vectors(dim)(texts), cfg.batch_size, cfg.scale)
        constant = texts_loss(np.ones((len(texts), dim)), cfg.batch_size, cfg.scale)
        return {"random": {"loss": random}, "constant": {"loss": constant}}
    return baselines(data.val, dim)


def save_embedding_model(model: BertModel, out: Path, tokenizer: Any, run: Any) -> None:
    """The encoder and tokenizer, with the sentence-transformers layout around them."""
    model.save_pretrained(out, tokenizer=tokenizer)
    write_pooling_declaration(
        out, run.data.pooling, run.data.normalize, model.config.hidden_size, run.cfg.max_length
    )


def embedding_report(run: Any, metrics: dict[str, float]) -> dict[str, Any]:
    """The end-of-run report: the scores beside the baselines', as text and as data."""
    base = validation_baselines(run.cfg, run.data, run.model.config.hidden_size)
    table = scores_table({"model": metrics, **base})
    baseline = {
        "predicts": "random vectors",
        "definition": "a random vector per distinct text",
        **base["random"],
        "constant": base["constant"],
    }
    return {"baseline": baseline, "report_text": table}


__all__ = [
    "EmbeddingTaskData",
    "embedding_report",
    "embedding_step",
    "load_embedding_data",
    "load_embedding_model",
    "memory_probe",
    "save_embedding_model",
    "sentence_vectors",
    "start_pooling",
    "validate_embeddings",
    "validation_baselines",
]
