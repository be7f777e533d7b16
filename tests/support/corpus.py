"""One text prepared both ways, as the pretraining tests need it: sentence pairs (``nsp``) and
packed sequences (``packed``) of 32 tokens, 5% held out for validation; and its validation
pairs as one batch, for the tests that score the pooler's losses on them."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge.data.dataset import PretrainingDataset
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.modeling.model import BertForPreTraining, bag_of_words_weights
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.pretrain import pretrain


def prepare_quiet(
    text: Path,
    tokenizer: Tokenizer | Path,
    out: Path,
    length: int = 32,
    mode: str = "packed",
    validation_fraction: float = 0.05,
) -> Path:
    """``out``: ``text`` prepared in ``mode`` at ``length`` tokens with ``tokenizer`` (one, or
    a directory holding one), ``validation_fraction`` held out, no progress lines."""
    held = tokenizer if isinstance(tokenizer, Tokenizer) else None
    cfg = PrepareConfig(
        [str(text)],
        "" if held else str(tokenizer),
        str(out),
        max_seq_length=length,
        mode=mode,
        validation_fraction=validation_fraction,
        progress=False,
    )
    prepare(cfg, held)
    return out


def prepare_both_ways(text: Path, tokenizer: Tokenizer, root: Path) -> dict[str, Path]:
    """``{"nsp": root/data-nsp, "packed": root/data-packed}``, each prepared from ``text``."""
    return {
        m: prepare_quiet(text, tokenizer, root / f"data-{m}", mode=m) for m in ("nsp", "packed")
    }


def validation_pairs(data: Path, count: int = 64) -> tuple[torch.Tensor, ...]:
    """The first ``count`` validation pairs of prepared ``data`` as one padded batch, and the
    bag-of-words word weights of its training split: ``(ids, token_types, mask, weights)``."""
    validation = PretrainingDataset(data, "validation")
    tokenizer = Tokenizer.from_file(data / "tokenizer")
    pairs = [validation[i] for i in range(min(count, len(validation)))]
    width = max(len(p["input_ids"]) for p in pairs)
    ids, types, mask = (torch.zeros(len(pairs), width, dtype=torch.long) for _ in range(3))
    for i, p in enumerate(pairs):
        n = len(p["input_ids"])
        ids[i, :n] = torch.as_tensor(p["input_ids"])
        types[i, :n] = torch.as_tensor(p["token_type_ids"])
        mask[i, :n] = 1
    counts = PretrainingDataset(data, "train").token_counts(
        tokenizer.vocab_size, tokenizer.special_ids
    )
    return ids, types, mask, bag_of_words_weights(torch.from_numpy(counts))


def runs_with_and_without(
    data: Path, root: Path, option: str, steps: int = 40
) -> tuple[dict[float, Path], list[dict]]:
    """Two real pretraining runs of prepared ``data`` under ``root``, with the loss weight
    ``option`` (a TrainConfig field) at 0 and at 1: ``({0.0: run, 1.0: run}, the weighted
    run's train records)``, after checking it logged one record per step."""
    from test_pretrain import tiny_cfg  # test_pretrain imports conftest, which imports this module

    runs = {w: root / f"{option}{w}" for w in (0.0, 1.0)}
    for weight, run in runs.items():
        pretrain(tiny_cfg(data, run, max_steps=steps, **{option: weight}))
    records = [r for r in read_metrics(runs[1.0]) if r["split"] == "train"]
    assert len(records) == steps
    return runs, records


def pooler_scores(runs: dict[float, Path], data: Path, score) -> dict[float, float]:
    """Each run's model scored on the validation pairs of ``data``:
    ``score(pooled, word_embeddings, ids, token_types, word_weights)`` per run, no gradient."""
    ids, types, mask, token_weights = validation_pairs(data)
    scored = {}
    for weight, run in runs.items():
        model = BertForPreTraining.from_pretrained(run / "model").eval()
        with torch.no_grad():
            pooled = model.bert(ids, mask, types).pooler_output
            words = model.bert.embeddings.word_embeddings.weight
            scored[weight] = float(score(pooled, words, ids, types, token_weights))
    return scored
