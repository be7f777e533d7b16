"""Everything ``pretrain`` sets up before its first step, checked against each other: the prepared
data (datasets, this process's sampler, the masking collator and the micro-batch split of the
global batch), the model (fresh, started from a published or our own model with ``--init_from``,
or continued from a checkpoint), which layers stay frozen, which checkpoint to resume from and
the settings a resumed run must keep.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.loader import PretrainingCollator, PretrainingLoader, PretrainingSampler
from bertforge.data.shards import TOKENIZER_DIR, PretrainingDataset, read_meta
from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import check_tokenizer_fits, read_safetensors
from bertforge.modeling.config import CONFIG_NAME, BertConfig
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForReplacedTokenDetection,
    bag_of_words_weights,
    cooccurrence_vectors,
)
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import (
    TRAIN_STATE_JSON,
    intact_checkpoint,
    latest_checkpoint,
)
from bertforge.training.config import ALL_LAYERS, ModelSection, PretrainConfig, parse_freeze


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
    if tc.objective in PAIR_OBJECTIVES and train_ds.mode != "nsp":
        raise BertforgeError(
            f"{cfg.data} was prepared in {train_ds.mode!r} mode, without the sentence pairs "
            f"--train.objective {tc.objective} needs; use --train.objective mlm or prepare "
            "with --mode nsp"
        )
    if cfg.init_from:
        model_config = start_config(cfg.init_from, cfg.model)
        check_start_tokenizer(cfg.init_from, meta, cfg.data)
        check_tokenizer_fits(tokenizer, model_config, cfg.init_from)
    else:
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
        split_pairs=tc.objective == "mlm_contrastive",
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


def start_config(directory: str | Path, section: ModelSection) -> BertConfig:
    """The config of the model in ``directory`` (its own sizes, vocabulary and dropout), after
    refusing any ``--model.*`` value that was changed from its default and contradicts it."""
    path = Path(directory)
    if not (path / CONFIG_NAME).is_file():
        raise BertforgeError(
            f"--init_from {path}: no {CONFIG_NAME} there; give a model directory "
            "(config.json + model.safetensors + vocab.txt or tokenizer.json)"
        )
    config = dataclasses.replace(BertConfig.load(path / CONFIG_NAME), architectures=None)
    clash = model_contradictions(section, config)
    if clash:
        field, ours, theirs = clash[0]
        raise BertforgeError(
            f"--model.{field} {ours} contradicts --init_from {path}/{CONFIG_NAME} ({theirs}); "
            "the starting model's own config is used: drop the --model.* option"
        )
    return config


def model_contradictions(section: ModelSection, config: BertConfig) -> list[tuple[str, Any, Any]]:
    """``(field, our value, the checkpoint's)`` for every ``--model.*`` option that differs from
    its default and from ``config`` (a value left at its default defers to the checkpoint)."""
    defaults = ModelSection()
    out: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(ModelSection):
        value = getattr(section, f.name)
        if value is None or value == getattr(defaults, f.name):
            continue
        if f.name == "preset":
            sized = BertConfig.preset(value)
            keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
            ours = {k: getattr(sized, k) for k in keys}
            theirs = {k: getattr(config, k) for k in keys}
            if ours != theirs:
                shape = ", ".join(f"{k} {v}" for k, v in theirs.items())
                out.append((f.name, value, shape))
        elif value != getattr(config, f.name):
            out.append((f.name, value, f"{f.name} {getattr(config, f.name)}"))
    return out


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


PretrainingModel = BertForPreTraining | BertForMaskedLM | BertForReplacedTokenDetection
PAIR_OBJECTIVES = ("mlm_nsp", "mlm_contrastive")
"""The objectives that read ``--mode nsp`` sentence pairs and train BERT's pretraining model."""


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


def pretraining_class(objective: str) -> type[PretrainingModel]:
    """The model an objective trains: BERT's pretraining model (mlm_nsp), the MLM-only model
    (mlm) or the ELECTRA pair of generator and discriminator (rtd)."""
    if objective == "rtd":
        return BertForReplacedTokenDetection
    return BertForPreTraining if objective in PAIR_OBJECTIVES else BertForMaskedLM


def random_twin(cfg: PretrainConfig, data: PretrainingData) -> PretrainingModel:
    """The same network freshly initialised with the run's seed (the global RNG is left as it
    was): the third column of the start vs adapted table."""
    model_cls = pretraining_class(cfg.train.objective)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        return model_cls(data.model_config)


def freeze_parameters(model: torch.nn.Module, freeze: str | None) -> list[str]:
    """Stop gradients into the embeddings and/or the lowest N encoder layers (``--train.freeze``);
    returns the frozen modules' names. Frozen word embeddings also freeze the tied output
    decoder (the head's transform and bias still train)."""
    embeddings, layers = parse_freeze(freeze)
    base = getattr(model, "bert", model)
    total = len(base.encoder.layer)
    if layers == ALL_LAYERS:
        layers = total
    if layers > total:
        raise BertforgeError(
            f"--train.freeze {freeze}: the model has {total} layers; freeze at most {total}"
        )
    frozen = (["embeddings"] if embeddings else []) + [f"encoder.layer.{i}" for i in range(layers)]
    for name in frozen:
        base.get_submodule(name).requires_grad_(False)
    return frozen


def warm_fresh_head(
    model: BertForPreTraining | BertForMaskedLM, missing: list[str], counts: torch.Tensor
) -> list[str]:
    """Start a freshly initialised MLM head where a context-free guesser stands instead of at
    noise (a random head's first predictions are uniform over the vocabulary and its first
    gradients into the encoder are noise): the output bias becomes the log frequency of each
    token in ``counts`` (add-0.5 smoothed, mean 0; special tokens, which are never masked, get
    the floor), the transform's dense layer the identity, so the encoder's last hidden states
    meet the tied word embeddings as they are. Only parameters in ``missing`` change; returns
    what was set. On all-MiniLM-L6-v2 and IMDB text the start moves from 0.02% to 8.7%
    held-out masked-token accuracy (docs/results.md)."""
    head = model.cls.predictions
    done: list[str] = []
    with torch.no_grad():
        if "cls.predictions.bias" in missing:
            log_p = torch.log((counts.double() + 0.5) / (counts.double() + 0.5).sum())
            head.bias.copy_((log_p - log_p.mean()).to(head.bias.dtype))
            done.append("cls.predictions.bias = log token frequencies of the training text")
        dense = head.transform.dense
        if "cls.predictions.transform.dense.weight" in missing:
            dense.weight.copy_(torch.eye(dense.weight.shape[0], dtype=dense.weight.dtype))
            if "cls.predictions.transform.dense.bias" in missing:
                dense.bias.zero_()
            done.append("cls.predictions.transform.dense = identity")
    return done


WARM_HEAD_PARAMETERS = [
    "cls.predictions.bias",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
]
"""What ``warm_fresh_head`` sets in a fresh model (``--train.fresh_head warm`` without
``--init_from``)."""

WARM_HEAD_TOKENS = 50_000_000
"""Tokens of the training text counted for a warm head's bias: plenty for a unigram estimate,
and start-up stays seconds on a corpus of billions."""


def head_warm_counts(
    train: PretrainingDataset, tokenizer: Tokenizer, vocab_size: int
) -> torch.Tensor:
    """Token counts of the training split for ``warm_fresh_head`` (one per id of a model with
    ``vocab_size`` words), special tokens zeroed."""
    counts = train.token_counts(vocab_size, tokenizer.special_ids, WARM_HEAD_TOKENS)
    return torch.from_numpy(counts)


WORD_INIT_TOKENS = 50_000_000
"""Tokens of the training text counted for ``--train.word_init cooccurrence``: 31M took ~10 s
on two cores (AMD EPYC Zen 4), and more text hardly changes the vectors of a small model."""
WORD_INIT_CONTEXTS = 8192
"""Context words of the co-occurrence matrix: the most frequent ones (all of a vocabulary this
small), which keeps the matrix at vocabulary x 8,192 for a vocabulary of any size."""


def init_word_vectors(model: torch.nn.Module, cfg: PretrainConfig, data: PretrainingData) -> str:
    """``--train.word_init cooccurrence``: count the training split's co-occurrences, factorise
    them (:func:`~bertforge.modeling.model.cooccurrence_vectors`) and start the model's word
    embeddings there; returns what it did, for the log."""
    tc, vocab = cfg.train, model.config.vocab_size
    special = data.tokenizer.special_ids
    frequency = data.train.token_counts(vocab, special, WORD_INIT_TOKENS)
    contexts = np.sort(np.argsort(-frequency, kind="stable")[:WORD_INIT_CONTEXTS])
    contexts = contexts[frequency[contexts] > 0]
    if len(contexts) < 2:
        raise BertforgeError(
            f"{cfg.data}: too few distinct tokens for --train.word_init cooccurrence; "
            "use --train.word_init normal"
        )
    counts = data.train.cooccurrence_counts(
        vocab, contexts, tc.word_init_window, special, WORD_INIT_TOKENS
    )
    vectors, rows = cooccurrence_vectors(
        counts, model.config.hidden_size, tc.word_init_std, seed=tc.seed
    )
    model.init_word_vectors(vectors, rows)
    return (
        f"word embeddings start from co-occurrence vectors: {int(rows.sum()):,} of {vocab:,} "
        f"words, {vectors.shape[1]} dimensions, window {tc.word_init_window}, "
        f"{int(frequency.sum()):,} tokens counted"  # token_counts stops at WORD_INIT_TOKENS
    )


def bag_of_words_token_weights(data: PretrainingData, vocab_size: int) -> torch.Tensor:
    """``--train.bow_weight``: the weight of each word in the bag-of-words targets
    (:func:`~bertforge.modeling.model.bag_of_words_weights` of the training split's counts;
    special tokens 0)."""
    counts = data.train.token_counts(vocab_size, data.tokenizer.special_ids, WORD_INIT_TOKENS)
    return bag_of_words_weights(torch.from_numpy(counts))


def build_model(
    cfg: PretrainConfig, data: PretrainingData, resume_dir: Path | None
) -> PretrainingModel:
    """A fresh model of the objective (:func:`pretraining_class`) sized by
    ``cfg.model``, the model in ``--init_from`` (heads it lacks freshly initialised: see
    ``model.loading_info["missing"]``), or the one in ``resume_dir``, which must have the same
    config. ``--train.freeze`` is applied to each."""
    model_config = data.model_config
    model_cls = pretraining_class(cfg.train.objective)
    if resume_dir is None:
        if cfg.init_from:
            model = model_cls.from_pretrained(cfg.init_from)
            info = getattr(model, "loading_info", None)
            warmable = info and info["missing"] and hasattr(model, "cls")  # not for a full model
            if warmable and cfg.train.fresh_head != "random":  # None: warm
                counts = head_warm_counts(data.train, data.tokenizer, model.config.vocab_size)
                info["warmed"] = warm_fresh_head(model, info["missing"], counts)
        else:
            model = model_cls(model_config)
            if cfg.train.position_init == "sinusoidal":
                model.init_sinusoidal_positions(cfg.train.position_init_std)
            if cfg.train.segment_init_std is not None:
                model.init_segment_embeddings(cfg.train.segment_init_std)
            if cfg.train.special_init_std is not None:
                special = sorted(data.tokenizer.special_ids)
                model.init_special_embeddings(special, cfg.train.special_init_std)
            if cfg.train.attention_init == "identity":
                model.init_identity_attention()
            if cfg.train.fresh_head == "warm" and hasattr(model, "cls"):
                counts = head_warm_counts(data.train, data.tokenizer, model.config.vocab_size)
                warm_fresh_head(model, WARM_HEAD_PARAMETERS, counts)
        freeze_parameters(model, cfg.train.freeze)
        return model.train()  # from_pretrained returns a model in eval mode
    model = model_cls.from_pretrained(resume_dir)
    if model.config.to_dict() | {"architectures": None} != model_config.to_dict() | {
        "architectures": None
    }:
        raise BertforgeError(
            f"{resume_dir}: its model config differs from --model.*; resume "
            "with the original settings or start a new --output"
        )
    freeze_parameters(model, cfg.train.freeze)
    return model.train()


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
    "start_pooler",
    "init_word_vectors",
    "check_start_tokenizer",
    "find_resume",
    "freeze_parameters",
    "fresh_modules",
    "model_contradictions",
    "open_data",
    "random_twin",
    "run_identity",
    "start_config",
    "start_report",
    "head_warm_counts",
    "warm_fresh_head",
]
