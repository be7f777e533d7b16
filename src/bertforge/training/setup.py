"""Everything ``pretrain`` sets up before its first step, checked against each other: the prepared
data (datasets, this process's sampler, the masking collator and the micro-batch split of the
global batch, as the objective needs them), the model (fresh, with the start variants of
``training/start.py``; started from a published or our own model with ``--init_from``; or
continued from a checkpoint), which checkpoint to resume from and the settings a resumed run
must keep. The objectives themselves are in ``training/objectives.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.data.loader import PretrainingCollator, PretrainingLoader, PretrainingSampler
from bertforge.data.shards import TOKENIZER_DIR, PretrainingDataset, read_meta
from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import check_tokenizer_fits, read_safetensors
from bertforge.modeling.config import CONFIG_NAME, AnyConfig, ModernBertConfig, load_config
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import (
    TRAIN_STATE_JSON,
    intact_checkpoint,
    latest_checkpoint,
)
from bertforge.training.config import ModelSection, PretrainConfig, check_similarity
from bertforge.training.objectives import PretrainingModel, model_class_for, objective_class
from bertforge.training.start import (
    freeze_parameters,
    head_warm_counts,
    start_fresh,
    warm_fresh_head,
)


@dataclass
class PretrainingData:
    """The prepared data of a run, as this process reads it."""

    meta: dict[str, Any]
    """The data directory's meta.json (max_seq_length, tokenizer fingerprint, splits)."""
    tokenizer: Tokenizer
    """The data's tokenizer (saved with every checkpoint and the final model)."""
    model_config: AnyConfig
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

    @property
    def loader(self) -> PretrainingLoader:
        """The training batches: dataset + sampler + collator (the sampler holds the position)."""
        return PretrainingLoader(self.train, self.sampler, self.collator)


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
    objective = objective_class(tc.objective)
    if cfg.init_from:
        model_config = start_config(cfg.init_from, cfg.model)
        check_start_tokenizer(cfg.init_from, meta, cfg.data)
        check_tokenizer_fits(tokenizer, model_config, cfg.init_from)
    else:
        special = {"pad": tokenizer.pad_id, "cls": tokenizer.cls_id, "sep": tokenizer.sep_id}
        model_config = cfg.model.to_model_config(tokenizer.vocab_size, special)
    model_class_for(objective, model_config)  # an objective the architecture has no heads for
    check_similarity(tc, isinstance(model_config, ModernBertConfig))  # --init_from's too
    if objective.reads_pairs and train_ds.mode != "nsp":
        raise BertforgeError(
            f"{cfg.data} was prepared in {train_ds.mode!r} mode, without the sentence pairs "
            f"--train.objective {tc.objective} needs; use --train.objective mlm or prepare "
            "with --mode nsp"
        )
    if tc.similarity_weight and train_ds.mode != "nsp":
        raise BertforgeError(
            f"{cfg.data} was prepared in {train_ds.mode!r} mode; --train.similarity_weight "
            f"{tc.similarity_weight} compares the two segments of sentence pairs: prepare with "
            "--mode nsp or drop --train.similarity_weight"
        )
    if meta["max_seq_length"] > model_config.max_position_embeddings:
        raise BertforgeError(
            f"data max_seq_length={meta['max_seq_length']} exceeds "
            f"--model.max_position_embeddings={model_config.max_position_embeddings}; raise "
            f"--model.max_position_embeddings to {meta['max_seq_length']} or prepare the data "
            "with a shorter --max_seq_length"
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
        split_pairs=objective.split_pairs,
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


# ---- starting from a published (or our own) model: --init_from -------------------------------


def start_config(directory: str | Path, section: ModelSection) -> AnyConfig:
    """The config of the model in ``directory`` (its own sizes, vocabulary and dropout), after
    refusing any ``--model.*`` value that was changed from its default and contradicts it."""
    path = Path(directory)
    if not (path / CONFIG_NAME).is_file():
        raise BertforgeError(
            f"--init_from {path}: no {CONFIG_NAME} there; give a model directory "
            "(config.json + model.safetensors + vocab.txt or tokenizer.json)"
        )
    config = dataclasses.replace(load_config(path / CONFIG_NAME), architectures=None)
    clash = model_contradictions(section, config)
    if clash:
        field, ours, theirs = clash[0]
        raise BertforgeError(
            f"--model.{field} {ours} contradicts --init_from {path}/{CONFIG_NAME} ({theirs}); "
            "the starting model's own config is used: drop the --model.* option"
        )
    return config


def model_contradictions(section: ModelSection, config: AnyConfig) -> list[tuple[str, Any, Any]]:
    """``(field, our value, the checkpoint's)`` for every ``--model.*`` option that differs from
    its default and from ``config`` (a value left at its default defers to the checkpoint)."""
    defaults = ModelSection()
    modern = isinstance(config, ModernBertConfig)
    # ModernBERT's names for ModelSection's BERT-named fields
    names = MODERN_NAMES if modern else {}
    out: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(ModelSection):
        value = getattr(section, f.name)
        if value is None or value == getattr(defaults, f.name):
            continue
        if f.name == "architecture":
            if value != config.model_type:
                out.append((f.name, value, f"model_type {config.model_type}"))
        elif f.name == "preset":
            sized = type(config).preset(value)
            keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
            ours = {k: getattr(sized, k) for k in keys}
            theirs = {k: getattr(config, k) for k in keys}
            if ours != theirs:
                shape = ", ".join(f"{k} {v}" for k, v in theirs.items())
                out.append((f.name, value, shape))
        else:
            name = names.get(f.name, f.name)
            if hasattr(config, name) and value != getattr(config, name):
                out.append((f.name, value, f"{name} {getattr(config, name)}"))
    return out


MODERN_NAMES = {
    "hidden_act": "hidden_activation",
    "hidden_dropout_prob": "mlp_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}
"""``ModelSection`` fields under their ``ModernBertConfig`` names."""


def check_start_tokenizer(directory: str | Path, meta: dict[str, Any], data_dir: str) -> None:
    """The data must have been prepared with the starting model's own tokenizer."""
    own = Tokenizer.from_file(directory)
    if own.fingerprint != meta["tokenizer_fingerprint"]:
        raise BertforgeError(
            f"{data_dir} was prepared with tokenizer {meta['tokenizer_fingerprint']} but "
            f"--init_from {directory} has its own ({own.fingerprint}); prepare the text with "
            f"bertforge prepare --tokenizer {directory}"
        )


def fresh_modules(missing: list[str]) -> list[str]:
    """The modules (or lone parameters) behind the parameter names a checkpoint lacked, e.g.
    ``cls.predictions.transform.dense.weight`` -> ``cls.predictions.transform.dense``."""
    names: list[str] = []
    for key in missing:
        module, _, leaf = key.rpartition(".")
        name = key if module in ("cls.predictions", "") else module
        if leaf not in ("weight", "bias"):
            name = key
        if name not in names:
            names.append(name)
    return names


_START_POOLER = re.compile(r"(?:bert\.)?pooler\.dense\.(weight|bias)")


def start_pooler(directory: str | Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The pooler of the ``--init_from`` model in ``directory``, keyed for ``model``'s save, when
    ``model`` has none of its own (an MLM-only run): MLM never trains it, but a classifier
    fine-tuned from the run reads it, and all-MiniLM-L6-v2's is trained; without this the run's
    model would hand the classifier a random pooler. {} when the start has none."""
    own = model.state_dict()
    if any(_START_POOLER.fullmatch(k) for k in own):
        return {}
    prefix = getattr(model, "base_prefix", "")
    hidden = model.config.hidden_size  # type: ignore[union-attr]
    shapes = {"weight": (hidden, hidden), "bias": (hidden,)}
    found = {}
    for key, tensor in read_safetensors(Path(directory)).items():
        match = _START_POOLER.fullmatch(key)
        if match and tuple(tensor.shape) == shapes[match.group(1)]:
            found[f"{prefix}pooler.dense.{match.group(1)}"] = tensor
    return found if len(found) == 2 else {}


def random_twin(cfg: PretrainConfig, data: PretrainingData) -> PretrainingModel:
    """The same network freshly initialised with the run's seed (the global RNG is left as it
    was): the third column of the start vs adapted table."""
    model_cls = model_class_for(objective_class(cfg.train.objective), data.model_config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        return model_cls(data.model_config)


def build_model(
    cfg: PretrainConfig, data: PretrainingData, resume_dir: Path | None
) -> PretrainingModel:
    """The objective's model (:attr:`~bertforge.training.objectives.Objective.model_class`):
    fresh, sized by ``cfg.model``, with each start variant of
    :data:`~bertforge.training.start.FRESH_STARTS` it asks for (those charged to the budget are
    left to the caller: :func:`~bertforge.training.start.start_fresh`); the model in
    ``--init_from`` (heads it lacks freshly initialised, see ``model.loading_info["missing"]``,
    and an MLM head among them started warm unless ``--train.fresh_head random``); or the one
    in ``resume_dir``, which must have the same config. ``--train.freeze`` is applied to each."""
    model_cls = model_class_for(objective_class(cfg.train.objective), data.model_config)
    if resume_dir is not None:
        model = model_cls.from_pretrained(resume_dir)
        ours, theirs = model.config.to_dict(), data.model_config.to_dict()
        if ours | {"architectures": None} != theirs | {"architectures": None}:
            raise BertforgeError(
                f"{resume_dir}: its model config differs from --model.*; resume "
                "with the original settings or start a new --output"
            )
    elif cfg.init_from:
        model = model_cls.from_pretrained(cfg.init_from)
        info = getattr(model, "loading_info", None)
        warmable = info and info["missing"] and hasattr(model, "cls")  # not for a full model
        if warmable and cfg.train.fresh_head != "random":  # None: warm
            counts = head_warm_counts(data.train, data.tokenizer, model.config.vocab_size)
            info["warmed"] = warm_fresh_head(model, info["missing"], counts)
    else:
        model = model_cls(data.model_config)
        start_fresh(model, cfg, data, charged=False)
    freeze_parameters(model, cfg.train.freeze)
    return model.train()  # from_pretrained returns a model in eval mode


def start_report(cfg: PretrainConfig, model: torch.nn.Module) -> str:
    """What a run starting from ``--init_from`` says first: where from, which heads are new and
    what is frozen."""
    missing = getattr(model, "loading_info", {}).get("missing", [])
    fresh = fresh_modules(missing)
    lines = [
        f"starting from {cfg.init_from}"
        + (
            f"; freshly initialised (not in the checkpoint): {', '.join(fresh)}"
            if fresh
            else "; every weight comes from the checkpoint"
        )
    ]
    warmed = getattr(model, "loading_info", {}).get("warmed")
    if warmed:
        lines.append("fresh MLM head started warm: " + "; ".join(warmed))
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if cfg.train.freeze:
        lines.append(f"frozen ({cfg.train.freeze}): {len(frozen)} parameter tensors")
    return "\n".join(lines)


def find_resume(cfg: PretrainConfig) -> Path | None:
    """The checkpoint to continue from: ``--resume`` (a checkpoint or a run directory), else the
    newest checkpoint already in ``--output``, else None (a fresh run). One whose files differ
    from its manifest is refused, naming the newest checkpoint that verifies."""
    if cfg.resume:
        path = Path(cfg.resume)
        if (path / TRAIN_STATE_JSON).is_file():
            return intact_checkpoint(path, _offer_resume)
        latest = latest_checkpoint(path)
        if latest is None:
            raise BertforgeError(
                f"--resume {path}: no checkpoint-* with a train state there; "
                "give a checkpoint directory or a run directory holding one"
            )
        return intact_checkpoint(latest, _offer_resume)
    return intact_checkpoint(latest_checkpoint(cfg.output), _offer_resume)


def _offer_resume(good: Path, bad: Path) -> str:
    return f"resume from it with --resume {good}"


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
    "check_start_tokenizer",
    "find_resume",
    "fresh_modules",
    "model_contradictions",
    "open_data",
    "random_twin",
    "run_identity",
    "start_config",
    "start_pooler",
    "start_report",
]
