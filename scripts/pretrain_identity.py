"""Tiny pretraining runs of every objective and every start variant, fingerprinted: the sha256 of
each run's ``model/model.safetensors`` and its logged losses and evaluations. Run it before and
after a change to the pretraining code; identical output means the change kept behaviour
byte-for-byte (CPU, fp32, one thread).

    python scripts/pretrain_identity.py --data /tmp/id-data --out /tmp/before.json
    python scripts/pretrain_identity.py --data /tmp/id-data --out /tmp/after.json \
        --compare /tmp/before.json

The data comes from 60 kB of Tiny Shakespeare through ``bertforge tokenizer train`` and
``bertforge prepare`` (both layouts: ``nsp`` sentence pairs and ``packed`` sequences), made once
in ``--data`` and reused: training the tokenizer twice on the same text does not give the same
vocabulary (ties between equally frequent pairs are broken in no fixed order).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
TIMING = {"seconds", "elapsed", "tokens_per_s", "time", "compile_seconds"}

FRESH = {"data": "nsp", "objective": "mlm_nsp"}
CASES: dict[str, dict] = {
    # every objective, on the layouts it reads
    "mlm/packed": {"data": "packed", "objective": "mlm"},
    "rtd/packed": {"data": "packed", "objective": "rtd"},
    "mlm/pairs": {"data": "nsp", "objective": "mlm"},
    "rtd/pairs": {"data": "nsp", "objective": "rtd"},
    "mlm_nsp/pairs": FRESH,
    "mlm_nsp+bow+nsp_weight/pairs": FRESH | {"bow_weight": 0.5, "nsp_weight": 2.0},
    "mlm_nsp+bow/accum": FRESH | {"bow_weight": 0.5, "micro_batch_size": 4},
    "mlm_contrastive/pairs": {"data": "nsp", "objective": "mlm_contrastive"},
    "mlm_contrastive/accum": {
        "data": "nsp",
        "objective": "mlm_contrastive",
        "micro_batch_size": 4,
    },
    # every start variant (a fresh model)
    "start:position sinusoidal": FRESH | {"position_init": "sinusoidal"},
    "start:position sinusoidal 0.2": FRESH
    | {"position_init": "sinusoidal", "position_init_std": 0.2},
    "start:segment 0.2": FRESH | {"segment_init_std": 0.2},
    "start:special 0.2": FRESH | {"special_init_std": 0.2},
    "start:attention identity": FRESH | {"attention_init": "identity"},
    "start:word cooccurrence": FRESH | {"word_init": "cooccurrence"},
    "start:fresh_head warm": FRESH | {"fresh_head": "warm"},
    "start:fresh_head warm/packed mlm": {
        "data": "packed",
        "objective": "mlm",
        "fresh_head": "warm",
    },
    "start:freeze": FRESH | {"freeze": "embeddings,layers:1"},
    "start:all": FRESH
    | {
        "position_init": "sinusoidal",
        "segment_init_std": 0.2,
        "special_init_std": 0.2,
        "attention_init": "identity",
        "word_init": "cooccurrence",
        "fresh_head": "warm",
        "freeze": "layers:1",
    },
    # starting from a model (--init_from): the rtd/packed run's encoder lacks every head
    "init_from encoder/mlm (warm head)": {
        "data": "packed",
        "objective": "mlm",
        "from": "rtd/packed",
    },
    "init_from encoder/mlm random head": {
        "data": "packed",
        "objective": "mlm",
        "from": "rtd/packed",
        "fresh_head": "random",
    },
    "init_from mlm/mlm_nsp freeze": FRESH | {"from": "mlm/pairs", "freeze": "embeddings"},
    # resuming: 2 steps, then the same config to 4
    "resume mlm_nsp+bow": FRESH | {"bow_weight": 0.5, "resume_at": 2},
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bertforge(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "bertforge", *argv], check=True, capture_output=True)


def make_data(root: Path) -> dict[str, Path]:
    out = {mode: root / f"data-{mode}" for mode in ("nsp", "packed")}
    if all((d / "meta.json").is_file() for d in out.values()):
        return out
    root.mkdir(parents=True, exist_ok=True)
    text = root / "text.txt"
    source = SHARED_DATA / "tiny_shakespeare" / "input.txt"
    text.write_text(source.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    bertforge(
        "tokenizer",
        "train",
        "--input",
        str(text),
        "--vocab_size",
        "300",
        "--output",
        str(root / "tok"),
    )
    for mode in ("nsp", "packed"):
        bertforge(
            "prepare", "--input", str(text), "--tokenizer", str(root / "tok"), "--output",
            str(out[mode]), "--max_seq_length", "32", "--mode", mode, "--validation_fraction",
            "0.05", "--progress", "false",
        )  # fmt: skip
    return out


def run_case(name: str, case: dict, data: dict[str, Path], root: Path) -> dict:
    from bertforge.progress import read_metrics
    from bertforge.training.config import ModelSection, PretrainConfig, TrainConfig
    from bertforge.training.pretrain import pretrain

    case = dict(case)
    layout = case.pop("data")
    start = case.pop("from", None)
    resume_at = case.pop("resume_at", None)
    out = root / name.replace("/", "_").replace(" ", "_").replace(":", "_")
    model = ModelSection(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    train = dict(
        batch_size=8,
        lr=3e-3,
        precision="fp32",
        device="cpu",
        eval_examples=32,
        eval_every=2,
        save_every=0,
        log_every=1,
        progress=False,
        warmup_ratio=0.25,
        num_threads=1,
        max_steps=4,
        seed=3,
    )
    cfg = lambda steps: PretrainConfig(  # noqa: E731
        data=str(data[layout]),
        output=str(out),
        model=ModelSection() if start else model,
        init_from=str(root / start.replace("/", "_") / "model") if start else None,
        train=TrainConfig(**(train | case | {"max_steps": steps})),
    )
    if resume_at:
        pretrain(cfg(resume_at))
    pretrain(cfg(4))
    records = [
        {k: v for k, v in r.items() if k not in TIMING}
        for r in read_metrics(out)
        if r.get("split") != "probe"
    ]
    return {
        "model.safetensors": sha256(out / "model" / "model.safetensors"),
        "train_losses": [r.get("loss") for r in records if r["split"] == "train"],
        "metrics.jsonl": hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="directory of the prepared data (made once)")
    parser.add_argument("--out", required=True, help="JSON file to write the fingerprints to")
    parser.add_argument(
        "--compare", help="an earlier --out file: print the table, fail on any change"
    )
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = make_data(Path(args.data))
        for name, case in CASES.items():
            if args.k not in name and not any(name == c.get("from") for c in CASES.values()):
                continue
            results[name] = run_case(name, case, data, root)
            print(f"{name:40s} {results[name]['model.safetensors'][:12]}", file=sys.stderr)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text(encoding="utf-8"))
    changed = 0
    print("| case | model.safetensors before -> after | train losses | metrics.jsonl |")
    print("|---|---|---|---|")
    for name, now in results.items():
        then = before.get(name)
        if then is None:
            print(f"| {name} | (new) {now['model.safetensors'][:12]} | | |")
            continue
        same = {k: then[k] == now[k] for k in now}
        changed += not all(same.values())
        mark = {k: "same" if v else "CHANGED" for k, v in same.items()}
        losses = " ".join(f"{x:.4f}" for x in now["train_losses"])
        print(
            f"| {name} | {then['model.safetensors'][:12]} -> {now['model.safetensors'][:12]} "
            f"({mark['model.safetensors']}) | {losses} ({mark['train_losses']}) "
            f"| {mark['metrics.jsonl']} |"
        )
    print(f"{changed} of {len(results)} cases changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
