"""The sentence-transformers pooling declaration of a model directory: ``modules.json`` and the
folders of its Pooling and Normalize modules (``1_Pooling/config.json``, ``2_Normalize``), which
say how ``embed`` turns hidden states into one vector. Read by ``bertforge.inference`` (embed, the
server), copied by an ONNX export and by an MLM run started from such a model (``--init_from``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal, get_args

from bertforge.errors import BertforgeError
from bertforge.io import read_json_object

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len"]
"""Sentence-vector poolings (sentence-transformers' names without ``pooling_mode_``)."""
POOLINGS: tuple[str, ...] = get_args(PoolingMode)


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
    modes = [
        k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
        for k, v in config.items()
        if k.startswith("pooling_mode_") and v is True
    ]
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


__all__ = [
    "POOLINGS",
    "PoolingMode",
    "copy_pooling_declaration",
    "declared_pooling",
    "pooling_declaration",
]
