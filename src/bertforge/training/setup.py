"""Everything ``pretrain`` sets up before its first step, checked against each other: the prepared
data (datasets, this process's sampler, the masking collator and the micro-batch split of the
global batch), the model (fresh, or continued from a checkpoint), which checkpoint to resume from
and the settings a resumed run must keep.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bertforge.data.loader import PretrainingCollator, PretrainingSampler
from bertforge.data.shards import TOKENIZER_DIR, PretrainingDataset, read_meta
from bertforge.errors import BertforgeError
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM, BertForPreTraining
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import TRAIN_STATE_JSON, latest_checkpoint
from bertforge.training.config import PretrainConfig


@dataclass
class PretrainingData:
    """The prepared data of a run, as this process reads it."""

    meta: dict[str, Any]
    """The data directory's meta.json (max_seq_length, tokenizer fingerprint, splits)."""
    tokenizer: Tokenizer
    """The data's tokenizer (saved with every checkpoint and the final model)."""
    model_config: BertConfig
    """The encoder ``cfg.model`` describes, sized to the tokenizer's vocabulary."""
    train: PretrainingDataset
    """The training split."""
    val: PretrainingDataset
    """The validation split."""
    extra: dict[str, PretrainingDataset]
    """More evaluation sets (``--extra_eval``) by directory name."""
    sampler: PretrainingSampler
    """This process's share of each global batch; resumable."""
    collator: PretrainingCollator
    """Pads a batch and masks it (80/10/10), deterministically per (seed, epoch, index)."""
    micro: int
    """Sequences per forward/backward pass."""
    accum: int
    """Micro-batches per optimizer step on this process."""


def open_data(cfg: PretrainConfig, *, rank: int = 0, world_size: int = 1) -> PretrainingData:
    """Open ``cfg.data`` (and ``cfg.extra_eval``) for process ``rank`` of ``world_size``."""
    tc = cfg.train
    meta = read_meta(cfg.data)
    tokenizer = Tokenizer.from_file(Path(cfg.data) / TOKENIZER_DIR)
    train_ds = PretrainingDataset(cfg.data, "train", tokenizer)
    val_ds = PretrainingDataset(cfg.data, "validation", tokenizer)
    extra = {}
    for path in cfg.extra_eval or []:
        splits = read_meta(path)["splits"]
        split = "validation" if splits.get("validation", {}).get("instances") else "train"
        extra[Path(path).name] = PretrainingDataset(path, split, tokenizer)
    use_nsp = tc.objective == "mlm_nsp"
    if use_nsp and train_ds.mode != "nsp":
        raise BertforgeError(
            f"{cfg.data} was prepared in {train_ds.mode!r} mode, without NSP "
            "labels; use --train.objective mlm or prepare with --mode nsp"
        )
    model_config = cfg.model.to_bert_config(tokenizer.vocab_size)
    if meta["max_seq_length"] > model_config.max_position_embeddings:
        raise BertforgeError(
            f"data max_seq_length={meta['max_seq_length']} exceeds "
            f"--model.max_position_embeddings={model_config.max_position_embeddings}"
        )
    if tc.batch_size % world_size:
        raise BertforgeError(
            f"--train.batch_size {tc.batch_size} is not divisible by the "
            f"{world_size} processes; choose a multiple of {world_size}"
        )
    per_rank = tc.batch_size // world_size
    micro = min(tc.micro_batch_size or per_rank, per_rank)
    if per_rank % micro:
        raise BertforgeError(
            f"--train.micro_batch_size {micro} does not divide the per-process "
            f"batch {per_rank} (= batch_size / processes); choose a divisor"
        )
    sampler = PretrainingSampler(
        len(train_ds),
        tc.batch_size,
        rank=rank,
        world_size=world_size,
        seed=tc.seed,
        lengths=train_ds.lengths if cfg.masking.bucket_window else None,
        bucket_window=cfg.masking.bucket_window,
    )
    collator = PretrainingCollator(
        tokenizer,
        mlm_probability=cfg.masking.mlm_probability,
        replace_probs=cfg.masking.replace_probs,
        whole_word=cfg.masking.whole_word,
        max_predictions=cfg.masking.max_predictions,
        seed=tc.seed,
    )
    return PretrainingData(
        meta,
        tokenizer,
        model_config,
        train_ds,
        val_ds,
        extra,
        sampler,
        collator,
        micro,
        per_rank // micro,
    )


def build_model(
    cfg: PretrainConfig, data: PretrainingData, resume_dir: Path | None
) -> BertForPreTraining | BertForMaskedLM:
    """A fresh ``BertForPreTraining`` (objective mlm_nsp) or ``BertForMaskedLM`` (mlm) sized by
    ``cfg.model``, or the one in ``resume_dir``, which must have the same config."""
    model_config = data.model_config
    model_cls = BertForPreTraining if cfg.train.objective == "mlm_nsp" else BertForMaskedLM
    if resume_dir is None:
        return model_cls(model_config)
    model = model_cls.from_pretrained(resume_dir)
    if model.config.to_dict() | {"architectures": None} != model_config.to_dict() | {
        "architectures": None
    }:
        raise BertforgeError(
            f"{resume_dir}: its model config differs from --model.*; resume "
            "with the original settings or start a new --output"
        )
    return model


def find_resume(cfg: PretrainConfig) -> Path | None:
    """The checkpoint to continue from: ``--resume`` (a checkpoint or a run directory), else the
    newest checkpoint already in ``--output``, else None (a fresh run)."""
    if cfg.resume:
        path = Path(cfg.resume)
        if (path / TRAIN_STATE_JSON).is_file():
            return path
        latest = latest_checkpoint(path)
        if latest is None:
            raise BertforgeError(
                f"--resume {path}: no checkpoint-* with a train state there; "
                "give a checkpoint directory or a run directory holding one"
            )
        return latest
    return latest_checkpoint(cfg.output)


def run_identity(cfg: PretrainConfig, meta: dict, n_train: int) -> dict[str, Any]:
    """What must not change between a run and its resumption for the data to continue exactly."""
    return json.loads(
        json.dumps(
            {
                "batch_size": cfg.train.batch_size,
                "seed": cfg.train.seed,
                "objective": cfg.train.objective,
                "masking": asdict(cfg.masking),
                "tokenizer": meta["tokenizer_fingerprint"],
                "train_examples": n_train,
            }
        )
    )


__all__ = [
    "PretrainingData",
    "build_model",
    "find_resume",
    "open_data",
    "run_identity",
]
