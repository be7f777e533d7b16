"""AG News with little labelled data: ``bertforge finetune`` against the same run in transformers.

Both start from all-MiniLM-L6-v2 with the SAME freshly initialised 4-class head, see the same
examples in the same order (the split and the batch order come from ``bertforge.data``,
the learning rate from ``bertforge.optim.lr_at``), and use the same hyper-parameters: AdamW
(no decay on biases/LayerNorm, eps 1e-6), linear warmup + decay, gradient clipping, bf16
autocast, dropout as given. The reference side is transformers' ``BertForSequenceClassification``
and ``BertTokenizerFast`` with a hand-written loop mirroring ours step by step. Both then pick
the best validation checkpoint (evaluated at the same steps) and are scored on the 7,600-row
test set.

    flock /tmp/bertforge-heavy.lock python benchmarks/finetune_reference.py --output runs/agnews

Prints a table (test accuracy, macro-F1, MCC, training time) and how far apart the two
per-step training losses were; writes ``results.json`` into ``--output``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from _common import SHARED_DATA, log, machine_markdown, markdown_table, minilm_dir

from bertforge.data.encoding import batch_order, collate, encode_examples
from bertforge.data.labelled import LabelledData, load_labelled, stratified_split
from bertforge.evaluation.metrics import classification_metrics
from bertforge.evaluation.task_scores import evaluate_sequence_model
from bertforge.modeling.model import BertForSequenceClassification
from bertforge.progress import read_metrics
from bertforge.runtime import autocast, seed_everything
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.finetune import FinetuneConfig, finetune
from bertforge.training.optim import lr_at

COLUMNS = {"text_column": "title", "text_pair_column": "description", "label_column": "label"}


def hf_encode(hf_tok, data: LabelledData, max_length: int) -> list[tuple[np.ndarray, int]]:
    """transformers' tokenization in the (ids, length of segment A) form our collate takes."""
    enc = hf_tok(data.texts, data.pairs, truncation="longest_first", max_length=max_length)
    out = []
    for ids, types in zip(enc["input_ids"], enc["token_type_ids"], strict=True):
        out.append((np.asarray(ids, dtype=np.int32), len(types) - sum(types)))
    return out


@torch.inference_mode()
def hf_logits(model, encoded, pad_id: int, batch_size: int, precision: str) -> np.ndarray:
    model.eval()
    out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    order = batch_order([len(e[0]) for e in encoded], batch_size, seed=0, epoch=0, shuffle=False)
    for index in order:
        batch = collate([encoded[i] for i in index], pad_id)
        with autocast(torch.device("cpu"), precision):
            out[index] = model(**batch).logits.float().numpy()
    model.train()
    return out


def reference_run(
    cfg: FinetuneConfig,
    train: LabelledData,
    val: LabelledData,
    test: LabelledData,
    id2label: dict[int, str],
) -> dict:
    """The same fine-tuning in transformers, step for step (see the module docstring)."""
    import transformers

    device = torch.device("cpu")
    hf_tok = transformers.BertTokenizerFast.from_pretrained(cfg.model)
    seed_everything(
        cfg.seed
    )  # exactly as bertforge.training.finetune does before building the model...
    ours = BertForSequenceClassification.from_pretrained(
        cfg.model, num_labels=len(id2label), id2label=id2label
    )
    p = cfg.dropout
    overrides = (
        {}
        if p is None
        else {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p, "classifier_dropout": p}
    )
    model = transformers.BertForSequenceClassification.from_pretrained(
        cfg.model, num_labels=len(id2label), id2label=id2label, **overrides
    )
    with torch.no_grad():  # ...so both start from the very same head
        model.classifier.weight.copy_(ours.classifier.weight)
        model.classifier.bias.copy_(ours.classifier.bias)
    del ours
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        eps=1e-6,
        fused=True,
    )
    enc_train, enc_val, enc_test = (
        hf_encode(hf_tok, d, cfg.max_length) for d in (train, val, test)
    )
    lengths = [len(e[0]) for e in enc_train]
    steps_per_epoch = math.ceil(len(enc_train) / cfg.batch_size)
    total = round(cfg.epochs * steps_per_epoch)
    warmup = round(cfg.warmup_ratio * total)
    eval_every = cfg.eval_every or steps_per_epoch
    pad = hf_tok.pad_token_id
    losses, best, best_state, step, start = [], None, None, 0, time.perf_counter()
    model.train()
    for epoch in range(math.ceil(total / steps_per_epoch)):
        for index in batch_order(
            lengths, cfg.batch_size, seed=cfg.seed, epoch=epoch, bucket=cfg.bucket
        ):
            if step >= total:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, max_lr=cfg.lr, warmup=warmup, total=total)
            batch = collate([enc_train[i] for i in index], pad)
            with autocast(device, cfg.precision):
                logits = model(**batch).logits
            loss = torch.nn.functional.cross_entropy(
                logits.float(), torch.as_tensor(train.labels[index])
            )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            step += 1
            if step % eval_every == 0 or step == total:
                acc = float(
                    np.mean(
                        hf_logits(model, enc_val, pad, cfg.eval_batch_size, cfg.precision).argmax(
                            -1
                        )
                        == val.labels
                    )
                )
                log(f"transformers step {step}: val accuracy {acc:.4f}")
                if best is None or acc > best:
                    best, best_state = acc, {k: v.clone() for k, v in model.state_dict().items()}
    seconds = time.perf_counter() - start
    model.load_state_dict(best_state)
    predictions = hf_logits(model, enc_test, pad, cfg.eval_batch_size, cfg.precision).argmax(-1)
    return {
        "test": classification_metrics(test.labels, predictions, len(id2label)),
        "val_best": best,
        "train_seconds": seconds,
        "losses": losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="runs/agnews-reference")
    parser.add_argument(
        "--train", default=str(SHARED_DATA / "ag_news" / "train_partial_first2000.csv")
    )
    parser.add_argument("--test", default=str(SHARED_DATA / "ag_news" / "test.csv"))
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=float, default=4)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    args = parser.parse_args()
    out = Path(args.output)
    cfg = FinetuneConfig(
        model=str(minilm_dir()),
        train=[args.train],
        output=str(out / "bertforge"),
        **COLUMNS,
        max_length=args.max_length,
        batch_size=args.batch_size,
        lr=args.lr,
        epochs=args.epochs,
        dropout=args.dropout,
        seed=args.seed,
        precision=args.precision,
        progress=False,
    )
    # the data both sides see: our split of the 2,000 rows, and the test set
    data, id2label = load_labelled(cfg.train, **COLUMNS)
    train_idx, val_idx = stratified_split(data.labels, cfg.validation_fraction, cfg.seed)
    train, val = data.subset(train_idx), data.subset(val_idx)
    test, _ = load_labelled(args.test, **COLUMNS, label2id={v: k for k, v in id2label.items()})
    log(f"AG News: {len(train)} train, {len(val)} validation, {len(test)} test examples")

    log("bertforge finetune ...")
    start = time.perf_counter()
    result = finetune(cfg)
    ours_seconds = time.perf_counter() - start
    model = BertForSequenceClassification.from_pretrained(cfg.output)
    tok = Tokenizer.from_file(cfg.output)
    enc_test = encode_examples(tok, test.texts, test.pairs, max_length=cfg.max_length)
    ours_test, _ = evaluate_sequence_model(
        model, enc_test, test.labels, tok.pad_id, batch_size=64, precision=cfg.precision
    )
    ours_losses = [r["loss"] for r in read_metrics(cfg.output) if r["split"] == "train"]

    log("transformers reference ...")
    ref = reference_run(cfg, train, val, test, id2label)
    # our metrics.jsonl holds means over log_every steps: compare like with like
    k = cfg.log_every
    ref_means = [
        float(np.mean(ref["losses"][i : i + k])) for i in range(0, len(ref["losses"]) - k + 1, k)
    ]
    n = min(len(ours_losses), len(ref_means))
    gap = (
        float(np.max(np.abs(np.array(ours_losses[:n]) - np.array(ref_means[:n]))))
        if n
        else float("nan")
    )

    rows = [
        [
            "bertforge",
            f"{ours_test['accuracy']:.4f}",
            f"{ours_test['macro_f1']:.4f}",
            f"{ours_test['mcc']:.4f}",
            f"{result['validation']['accuracy']:.4f}",
            f"{result['train_seconds']:.0f}",
        ],
        [
            "transformers",
            f"{ref['test']['accuracy']:.4f}",
            f"{ref['test']['macro_f1']:.4f}",
            f"{ref['test']['mcc']:.4f}",
            f"{ref['val_best']:.4f}",
            f"{ref['train_seconds']:.0f}",
        ],
    ]
    table = markdown_table(
        ["run", "test accuracy", "test macro-F1", "test MCC", "best val accuracy", "train s"], rows
    )
    print(
        f"\nAG News, {len(train)} training rows (of the first 2,000), test on {len(test):,} rows; "
        f"{cfg.epochs:g} epochs, batch {cfg.batch_size}, lr {cfg.lr:g}, max_length {cfg.max_length}, "
        f"dropout {cfg.dropout}, {cfg.precision}\n\n{table}\n\nlargest gap between the two runs' "
        f"training losses (means of {k} steps, {n} points): {gap:.4f}\n\n{machine_markdown()}"
    )
    payload = {
        "config": json.loads(json.dumps(cfg.__dict__)),
        "bertforge": {
            "test": ours_test,
            "validation": result["validation"],
            "train_seconds": result["train_seconds"],
            "wall_seconds": ours_seconds,
        },
        "transformers": {k2: v for k2, v in ref.items() if k2 != "losses"},
        "loss_gap": gap,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
