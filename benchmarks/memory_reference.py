"""transformers' peak resident memory on the jobs of docs/memory.md's table, one job per process
(its peak is the process's own high-water mark, ``VmHWM``), to set beside bertforge's:

* ``mlm``: ``BertForMaskedLM`` from all-MiniLM-L6-v2's weights trained by ``Trainer`` on
  batches of 32 x 128 tokens, 15% masked, a new batch each step (``--plain``: a hand-written
  step loop with fused AdamW instead of ``Trainer``);
* ``tiny``: the same from a fresh BERT-Tiny (2 x 128, V = 30,522), batches of 64, fp32;
* ``finetune``: ``BertForSequenceClassification`` from all-MiniLM-L6-v2 trained by ``Trainer``
  on IMDB reviews (``BertTokenizerFast``, 128 tokens, batch 32);
* ``evaluate``: ``BertForMaskedLM`` (all-MiniLM-L6-v2) scoring 512 masked sequences of 128
  tokens in batches of 64 without gradients (a plain forward, as evaluation runs);
* ``embed``: a ``feature-extraction`` pipeline of all-MiniLM-L6-v2 over 512 IMDB reviews
  (their first 1,000 characters, batch 32): the work of ``memory_serve.py``'s server under load.

    python benchmarks/memory_reference.py --job mlm --precision bf16 --steps 20
    python benchmarks/memory_reference.py --job evaluate --precision bf16
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from _common import SHARED_DATA, minilm_dir
from bench_train import precision_ctx, pretraining_batch

from bertforge.runtime import format_bytes, peak_memory_bytes


def mlm_items(steps: int, batch: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    """``steps`` new batches of ``batch`` masked sequences, one dict per sequence (Trainer's
    data set)."""
    items = []
    for k in range(steps):
        b = pretraining_batch(batch, 128, vocab, seed=k)
        for i in range(batch):
            items.append({key: b[key][i] for key in ("input_ids", "attention_mask", "labels")})
    return items


def imdb_texts(n: int) -> tuple[list[str], list[int]]:
    """The first ``n`` IMDB training reviews and their labels."""
    import csv
    import gzip

    texts, labels = [], []
    with gzip.open(SHARED_DATA / "imdb" / "train-00.csv.gz", "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            texts.append(row["text"].replace("<br />", " "))
            labels.append(int(row["label"] in ("1", "pos")))
            if len(texts) == n:
                break
    return texts, labels


def train_with_trainer(model, items: list[dict], batch: int, steps: int, precision: str) -> None:
    from transformers import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=steps,
            learning_rate=1e-4,
            bf16=precision == "bf16",
            use_cpu=True,
            optim="adamw_torch_fused",
            save_strategy="no",
            report_to=[],
            logging_steps=10**6,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        Trainer(model=model, args=args, train_dataset=items).train()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=["mlm", "tiny", "finetune", "evaluate", "embed"])
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plain", action="store_true", help="mlm: a plain step loop, not Trainer")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    t0 = time.perf_counter()
    what = f"{args.job}, {args.precision}"
    if args.job in ("mlm", "tiny"):
        if args.job == "mlm":
            model = transformers.BertForMaskedLM.from_pretrained(str(minilm_dir()))
            batch = 32
        else:
            config = transformers.BertConfig(
                hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
            )
            model, batch = transformers.BertForMaskedLM(config), 64
        items = mlm_items(args.steps, batch, model.config.vocab_size)
        what += f", {args.steps} steps of {batch} x 128"
        if not args.plain:
            train_with_trainer(model.train(), items, batch, args.steps, args.precision)
        else:
            what += ", plain loop"
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            for k in range(args.steps):
                part = items[k * batch : (k + 1) * batch]
                b = {key: torch.stack([x[key] for x in part]) for key in part[0]}
                with precision_ctx(args.precision):
                    loss = model.train()(**b).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    elif args.job == "finetune":
        tok = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir()))
        model = transformers.BertForSequenceClassification.from_pretrained(
            str(minilm_dir()), num_labels=2
        )
        texts, labels = imdb_texts(32 * args.steps)
        enc = tok(texts, truncation=True, max_length=128, padding="max_length")
        items = [
            {
                "input_ids": torch.tensor(enc["input_ids"][i]),
                "attention_mask": torch.tensor(enc["attention_mask"][i]),
                "labels": torch.tensor(labels[i]),
            }
            for i in range(len(texts))
        ]
        what += f", {args.steps} steps of 32 x 128"
        train_with_trainer(model.train(), items, 32, args.steps, args.precision)
    elif args.job == "evaluate":
        model = transformers.BertForMaskedLM.from_pretrained(str(minilm_dir())).eval()
        items = mlm_items(8, 64, model.config.vocab_size)
        what += ", 512 sequences of 128 in batches of 64"
        with torch.no_grad(), precision_ctx(args.precision):
            for k in range(8):
                part = items[k * 64 : (k + 1) * 64]
                b = {key: torch.stack([x[key] for x in part]) for key in part[0]}
                model(**b)
    else:
        texts = [t[:1000] for t in imdb_texts(512)[0]]  # as memory_serve.py sends them
        pipe = transformers.pipeline("feature-extraction", model=str(minilm_dir()), device="cpu")
        what += ", 512 IMDB reviews in batches of 32"
        with torch.no_grad(), precision_ctx(args.precision):
            pipe(texts, batch_size=32, truncation=True, max_length=256)
    seconds = time.perf_counter() - t0
    print(
        f"transformers {transformers.__version__} ({what}): {seconds:.0f} s, "
        f"peak {format_bytes(peak_memory_bytes())} resident"
    )


if __name__ == "__main__":
    main()
