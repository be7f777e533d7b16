"""Tokens one epoch costs under each side's batching: why the training-time ratios of
``finetune_{ner,glue,qa}_reference.py`` differ from task to task (issue 39).

Both sides pad a batch to its longest row. bertforge sorts shuffled rows by length inside
windows of 50 batches (``bertforge.data.encoding.batch_order``, its default); transformers'
``Trainer`` draws rows at random (``RandomSampler``, the ``run_*.py`` default) or, with
``group_by_length=True``, in megabatches of 50 sorted by length
(``get_length_grouped_indices``). For each task's training rows as the reference scripts
encode them (MiniLM's tokenizer, the same lengths and batch sizes), this prints the real
tokens, the padded tokens each sampler feeds the model in one epoch (seed 0), and their ratio:
the share of the speed-up that is padding, not kernels.

    python benchmarks/batch_padding.py
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import SHARED_DATA, markdown_table, minilm_dir


def padded(lengths: np.ndarray, batches: list) -> int:
    return int(sum(lengths[np.asarray(b)].max() * len(b) for b in batches))


def epoch_tokens(lengths: np.ndarray, batch_size: int) -> dict[str, int]:
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    from bertforge.data.encoding import batch_order

    n = len(lengths)
    random = np.random.default_rng(0).permutation(n)
    grouped = np.asarray(
        get_length_grouped_indices(
            lengths.tolist(), batch_size, generator=torch.Generator().manual_seed(0)
        )
    )
    split = lambda order: [order[i : i + batch_size] for i in range(0, n, batch_size)]  # noqa: E731
    return {
        "real": int(lengths.sum()),
        "trainer": padded(lengths, split(random)),
        "trainer_grouped": padded(lengths, split(grouped)),
        "bertforge": padded(lengths, batch_order(lengths, batch_size, seed=0, epoch=0)),
    }


def task_lengths(tokenizer, max_length: int) -> dict[str, tuple[np.ndarray, int]]:
    """Row lengths (in tokens, as the reference scripts encode them) and batch size per task."""
    import argparse as ap

    from finetune_glue_reference import prepare as glue_prepare
    from finetune_glue_reference import read_tsv, spec_of
    from finetune_ner_reference import DATASETS, TRAIN_FILE, read_conll
    from finetune_qa_reference import hf_features

    from bertforge.data.qa import read_qa

    out = {}
    for name, batch in (("wikiann", 32), ("wnut17", 16)):
        sents = read_conll(SHARED_DATA / "ner" / DATASETS[name] / TRAIN_FILE[name])[:2000]
        enc = tokenizer([w for w, _ in sents], is_split_into_words=True, truncation=True,
                        max_length=64)  # fmt: skip
        out[f"{name} (2,000 sentences, batch {batch})"] = (
            np.array([len(x) for x in enc["input_ids"]]),
            batch,
        )
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        glue_args = ap.Namespace(
            tasks=["CoLA", "SST-2", "MRPC", "STS-B", "RTE"], sst2_examples=5000, train_examples=None
        )
        glue_prepare(glue_args, Path(tmp))
        for task in glue_args.tasks:
            spec = spec_of(task)
            header, rows = read_tsv(Path(tmp) / "data" / spec.folder / "train.tsv")
            a = [r[header.index(spec.columns["text_column"])] for r in rows]
            pair = spec.columns.get("text_pair_column")
            b = [r[header.index(pair)] for r in rows] if pair else None
            enc = tokenizer(a, b, truncation=True, max_length=max_length)
            out[f"{task} ({len(rows):,} rows, batch 32)"] = (
                np.array([len(x) for x in enc["input_ids"]]),
                32,
            )
    examples, _ = read_qa(SHARED_DATA / "qa" / "squad_dev_train.json.gz")
    windows = hf_features(tokenizer, examples, ap.Namespace(max_length=384, doc_stride=128), True)
    out[f"squad_dev_train ({len(windows):,} windows, batch 32)"] = (
        np.array([len(w["input_ids"]) for w in windows]),
        32,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_length", type=int, default=128, help="GLUE's")
    args = parser.parse_args()
    import transformers

    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir())
    rows = []
    for name, (lengths, batch) in task_lengths(tokenizer, args.max_length).items():
        t = epoch_tokens(lengths, batch)
        rows.append(
            [
                name,
                f"{lengths.mean():.1f}",
                f"{t['real']:,}",
                f"{t['bertforge']:,} ({t['bertforge'] / t['real']:.2f}x)",
                f"{t['trainer']:,} ({t['trainer'] / t['real']:.2f}x)",
                f"{t['trainer_grouped']:,} ({t['trainer_grouped'] / t['real']:.2f}x)",
                f"{t['trainer'] / t['bertforge']:.2f}x",
            ]
        )
    print(
        markdown_table(
            [
                "training set",
                "mean tokens",
                "real tokens",
                "bertforge (bucketed)",
                "Trainer (random)",
                "Trainer (group_by_length)",
                "Trainer random / bertforge",
            ],
            rows,
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
