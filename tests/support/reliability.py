"""What the reliability tests (test_integrity, test_faults, test_hostile_input) share: tiny real
artefacts (a tokenizer and model trained here, prepared shards, labelled rows), the argument
lists of tiny ``pretrain`` / ``finetune`` / ``prepare`` runs, byte flipping, weight comparison,
and the counters behind docs/reliability.md (see support/reliability_table.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from bertforge.data.shards import PrepareConfig, prepare

TINY_PRETRAIN = [
    *("--model.preset", "tiny", "--model.hidden_size", "32", "--model.num_attention_heads", "4"),
    *("--model.num_hidden_layers", "1", "--model.intermediate_size", "64"),
    *("--model.max_position_embeddings", "64", "--train.objective", "mlm"),
    *("--train.batch_size", "8", "--train.progress", "false", "--train.eval_every", "0"),
    *("--train.precision", "fp32", "--train.device", "cpu", "--train.eval_examples", "8"),
    *("--train.num_threads", "1", "--train.keep_checkpoints", "3"),
]
TINY_FINETUNE = [
    *("--batch_size", "8", "--max_length", "32", "--progress", "false", "--num_threads", "1"),
    *("--precision", "fp32", "--device", "cpu", "--keep_checkpoints", "3"),
]


def pretrain_argv(data: Path, out: Path, steps: int, save_every: int, *extra: str) -> list[str]:
    return [
        *("pretrain", "--data", str(data), "--output", str(out), *TINY_PRETRAIN),
        *("--train.max_steps", str(steps), "--train.save_every", str(save_every), *extra),
    ]


def finetune_argv(art: dict[str, Path], out: Path, steps: int, every: int, *extra) -> list[str]:
    return [
        *("finetune", "--model", str(art["mlm"]), "--train", str(art["train"])),
        *("--output", str(out), *TINY_FINETUNE, "--max_steps", str(steps)),
        *("--eval_every", str(every), *extra),
    ]


def prepare_argv(art: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        *("prepare", "--input", str(art["corpus"]), "--tokenizer", str(art["mlm"])),
        *(
            "--output",
            str(out),
            "--max_seq_length",
            "32",
            "--mode",
            "packed",
            "--progress",
            "false",
        ),
        *extra,
    ]


def make_artefacts(root: Path, task_files: Any) -> dict[str, Path]:
    """A tiny MLM with its tokenizer, its corpus, packed shards prepared from it and 64
    labelled rows, under ``root`` (``task_files``: the conftest fixture)."""
    mlm = task_files.tiny_start_model(root, kind="mlm")
    task_files.write_sentiment(root / "train.csv", 64, seed=0)
    data = root / "data"
    prepare(
        PrepareConfig(
            [str(root / "corpus.txt")],
            str(mlm),
            str(data),
            max_seq_length=32,
            mode="packed",
            validation_fraction=0.1,
            progress=False,
        )
    )
    return {"mlm": mlm, "train": root / "train.csv", "data": data, "corpus": root / "corpus.txt"}


def flip_bytes(path: Path, count: int = 64, before_end: int = 100) -> None:
    """Invert ``count`` bytes ending ``before_end - count`` bytes before the end of ``path``
    (near the end of a safetensors file: inside the last tensor's data)."""
    data = bytearray(path.read_bytes())
    start = len(data) - before_end
    data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
    path.write_bytes(bytes(data))


def same_weights(a: Path, b: Path) -> bool:
    """Whether two safetensors files hold bit-identical tensors under the same names."""
    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def record(name: str, **counts: int) -> None:
    """Add ``counts`` (faults injected, survived, data lost, examples...) under ``name`` to the
    JSON file named by ``$BERTFORGE_RELIABILITY_LOG`` (nothing when unset), so a run of the
    suite can print the real numbers behind docs/reliability.md."""
    target = os.environ.get("BERTFORGE_RELIABILITY_LOG")
    if not target:
        return
    path = Path(target)
    log = json.loads(path.read_text()) if path.is_file() else {}
    entry = log.setdefault(name, {})
    for key, value in counts.items():
        entry[key] = entry.get(key, 0) + value
    path.write_text(json.dumps(log, indent=1, sort_keys=True) + "\n")
