"""Sentence vectors from hidden states (:func:`pool`) and the sentence-transformers pooling
declaration of a model directory: ``modules.json`` and the folders of its Pooling and Normalize
modules (``1_Pooling/config.json``, ``2_Normalize``), which say how ``embed`` turns hidden states
into one vector. Read by ``bertforge.inference`` (embed, the server), copied by an ONNX export and
by an MLM run started from such a model (``--init_from``), written by ``finetune --task
embedding`` (:func:`write_pooling_declaration`), so that ``SentenceTransformer(dir)`` loads it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text, make_directory, read_json_object

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len"]
"""Sentence-vector poolings (sentence-transformers' names without ``pooling_mode_``)."""
POOLINGS: tuple[str, ...] = get_args(PoolingMode)


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, T, H) hidden states and (B, T) attention mask -> (B, H) sentence vectors, as
    sentence-transformers' Pooling module computes them (``cls``: the [CLS] state; ``mean``: the
    mean over real tokens; ``max``; ``mean_sqrt_len``: the sum over real tokens / sqrt(count))."""
    if pooling == "cls":
        return hidden[:, 0]
    keep = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if pooling == "max":
        return hidden.masked_fill(keep == 0, float("-inf")).amax(1)
    count = keep.sum(1).clamp(min=1.0)  # (B, 1)
    summed = (hidden * keep).sum(1)  # (B, H)
    return summed / (count if pooling == "mean" else count.sqrt())


def declared_pooling(directory: str | Path) -> tuple[str | None, str | None, bool]:
    """``(pooling, file it is declared in, normalize)`` as a sentence-transformers model
    directory declares them (``modules.json``, ``1_Pooling/config.json``); ``(None, None,
    False)`` for a plain BERT directory."""
    directory = Path(directory)
    modules: list[Any] = []
    if (directory / "modules.json").is_file():
        try:
            modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise BertforgeError(
                f"{directory / 'modules.json'}: not readable JSON ({err})"
            ) from None
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    folder = str(kinds["Pooling"].get("path", "1_Pooling")) if "Pooling" in kinds else "1_Pooling"
    path = directory / folder / "config.json"
    normalize = "Normalize" in kinds
    if not path.is_file():
        return None, None, normalize
    config = read_json_object(path, "restore it or pass --pooling")
    named = config.get("pooling_mode")  # sentence-transformers 6: "mean" (or a list of them)
    if named is not None:
        names = [named] if isinstance(named, str) else list(named)
    else:  # earlier versions: a flag per mode, pooling_mode_mean_tokens: true
        names = [k.removeprefix("pooling_mode_") for k, v in config.items()
                 if k.startswith("pooling_mode_") and v is True]  # fmt: skip
    modes = [str(n).removesuffix("_tokens").removesuffix("_token") for n in names]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise BertforgeError(
            f"{path}: pooling {' + '.join(modes) or 'none'} is not supported; choose one of "
            f"{', '.join(POOLINGS)} with --pooling (pooling= in Python)"
        )
    return modes[0], f"{folder}/config.json", normalize


def pooling_declaration(model_dir: Path) -> list[str]:
    """The files and folders of ``model_dir`` that say how ``embed`` pools and normalises (read by
    :func:`declared_pooling`): a sentence-transformers model's
    ``modules.json`` and the folders of its Pooling and Normalize modules (``1_Pooling``,
    ``2_Normalize``); [] for a plain BERT directory. An ONNX export copies them (so that
    ``embed --backend onnx`` pools and normalises as the eager model does), and so does an
    MLM run started from such a model (``--init_from``)."""
    names = ["1_Pooling"]  # read even without a modules.json
    if (model_dir / "modules.json").is_file():
        names.append("modules.json")
        try:
            modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            modules = []  # copied as it is: embed reports it, on the export as on the model
        for module in modules if isinstance(modules, list) else []:
            kind = str(module.get("type", "")) if isinstance(module, dict) else ""
            if kind.rsplit(".", 1)[-1] in ("Pooling", "Normalize") and module.get("path"):
                names.append(str(module["path"]))
    inside = model_dir.resolve()
    return sorted(
        {
            name
            for name in names
            if (model_dir / name).exists() and (model_dir / name).resolve().is_relative_to(inside)
        }
    )


def copy_pooling_declaration(start: str | Path, model_dir: Path) -> list[str]:
    """Copy a sentence-transformers model's pooling declaration (:func:`pooling_declaration`)
    from ``start`` into ``model_dir``, so ``embed`` pools the model there as it pools ``start``
    (mean, normalised for all-MiniLM-L6-v2): an ONNX export, or an MLM run from ``start``. The
    names copied ([] for a plain BERT directory)."""
    start = Path(start)
    names = pooling_declaration(start)
    for name in names:
        source, target = start / name, model_dir / name
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    return names


def write_pooling_declaration(
    directory: Path, pooling: str, normalize: bool, dim: int, max_seq_length: int
) -> list[str]:
    """Write the sentence-transformers layout around a BERT saved in ``directory``:
    ``modules.json`` (Transformer, Pooling, Normalize when ``normalize``), ``1_Pooling/config.json``
    (``pooling`` over ``dim`` wide states), ``2_Normalize/``, ``sentence_bert_config.json``
    (``max_seq_length``) and ``config_sentence_transformers.json``; what
    :func:`declared_pooling` reads back. Returns the names written."""
    if pooling not in POOLINGS:
        raise BertforgeError(f"pooling {pooling!r} is unknown; choose one of {', '.join(POOLINGS)}")
    kinds = [("Transformer", ""), ("Pooling", "1_Pooling")]
    if normalize:
        kinds.append(("Normalize", "2_Normalize"))
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (kind, path) in enumerate(kinds)
    ]
    config: dict[str, Any] = {"word_embedding_dimension": dim}
    for mode in POOLINGS:
        suffix = "_token" if mode == "cls" else "_tokens"
        config[f"pooling_mode_{mode}{suffix}"] = mode == pooling
    make_directory(directory / "1_Pooling")
    atomic_write_text(directory / "1_Pooling" / "config.json", json.dumps(config, indent=2) + "\n")
    if normalize:
        make_directory(directory / "2_Normalize")
    elif (directory / "2_Normalize").is_dir():  # a declaration copied from the start model
        shutil.rmtree(directory / "2_Normalize")
    settings = {"max_seq_length": max_seq_length, "do_lower_case": False}
    atomic_write_text(directory / "sentence_bert_config.json", json.dumps(settings, indent=2))
    versions = {"__version__": {"bertforge": "sentence embeddings"}, "similarity_fn_name": "cosine"}
    atomic_write_text(
        directory / "config_sentence_transformers.json", json.dumps(versions, indent=2)
    )
    atomic_write_text(directory / "modules.json", json.dumps(modules, indent=2) + "\n")
    names = ["modules.json", "1_Pooling", "sentence_bert_config.json"]
    return names + ["config_sentence_transformers.json"] + (["2_Normalize"] if normalize else [])


def declared_max_length(model_dir: str | Path) -> int | None:
    """The ``max_seq_length`` a sentence-transformers model declares (sentence_bert_config.json),
    which its users embed with; None without one (the model's positions)."""
    path = Path(model_dir) / "sentence_bert_config.json"
    if not path.is_file():
        return None
    value = read_json_object(path, "restore it or pass --max_length").get("max_seq_length")
    return int(value) if isinstance(value, int) else None


__all__ = [
    "POOLINGS",
    "PoolingMode",
    "copy_pooling_declaration",
    "declared_max_length",
    "declared_pooling",
    "pool",
    "pooling_declaration",
    "write_pooling_declaration",
]
