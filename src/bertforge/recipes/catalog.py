"""The recipes: each a chain of ``bertforge`` commands on the data in ``../shared/data`` (or
``--data``), with a ``--smoke`` variant (a tiny model, a slice, a few steps) that the test suite
runs. Every recipe writes ``OUTPUT/results.json`` (its numbers and each command with its wall
time) and prints a summary table.

- ``reviews-adapted``: all-MiniLM-L6-v2 adapted by masked-LM training on IMDB review text
  (unsup + train, never the test reviews), the fresh MLM head alone for the first 2 minutes;
  MLM on held-out IMDB and WikiText-2 before and after;
  fill-mask before/after; IMDB and AG News fine-tuning from the adapted model vs MiniLM.
- ``review-scores``: Metacritic score regression from MiniLM with and without a short
  task-adaptive pretraining on the training split's review text; Spearman and MAE on a fixed 20%.
- ``news-from-scratch``: a WordPiece tokenizer and BERT-Mini pretrained from nothing on a fixed
  80% of the AG News test texts; MLM on the other 20% vs random init and the token-frequency
  guesser; fine-tuned on the 2,000 labelled train rows (beside its random twin, once per seed),
  tested on the held-out 20%.
- ``general``: a WordPiece vocabulary and BERT-Tiny pretrained from nothing on general English
  (Wikipedia + Project Gutenberg books), see :mod:`bertforge.recipes.general`.
- ``wikitext-nsp``: BERT-Mini with MLM + NSP on WikiText-2 test + Tiny Shakespeare, evaluated on
  WikiText-2 validation (MLM loss, perplexity, masked-token and NSP accuracy vs random init).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from bertforge.data.dataset import PretrainingDataset
from bertforge.inference.predict import fill_mask_side_by_side
from bertforge.io import atomic_write_text, text_lines
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM, BertModel
from bertforge.progress import format_duration, parse_duration
from bertforge.recipes.general import general
from bertforge.recipes.runner import (
    Recipe,
    clean_text,
    fixed_split,
    minilm_dir,
    pretrain_results,
    read_rows,
    sample,
    unigram_baseline,
    write_rows,
)
from bertforge.runtime import seed_everything
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.start import head_warm_counts, warm_fresh_head

REVIEW_SENTENCES = [
    "I really really [MASK] this show! It's awesome and full of mystery!",
    "This movie was a complete [MASK] of time.",
    "The acting was [MASK] and the plot made no sense.",
    "One of the best [MASK] I have ever seen.",
    "The [MASK] was beautiful, but the story was boring.",
]
"""Fill-mask before vs after (the first is the anime-review write-up's)."""


# ---- shared steps -----------------------------------------------------------------------------


def tiny_encoder(r: Recipe, tokenizer_dir: Path) -> Path:
    """The smoke runs' stand-in for a published encoder: a 2-layer, 32-wide ``BertModel`` (no MLM
    head, like all-MiniLM-L6-v2) with ``tokenizer_dir``'s vocabulary, in Hugging Face's layout."""
    out = r.path("tiny-encoder")
    if not (out / "model.safetensors").is_file():
        tokenizer = Tokenizer.from_file(tokenizer_dir)
        seed_everything(0)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
        )
        BertModel(config).save_pretrained(out, tokenizer=tokenizer)
    return out


def prepare_data(
    r: Recipe,
    tokenizer: Path,
    inputs: list[Any],
    output: Path,
    validation_fraction: str,
    *,
    mode: str = "packed",
    extra: list[Any] | None = None,
) -> None:
    """``bertforge prepare`` of ``inputs`` into ``output`` with ``tokenizer``: 128-token
    sequences, ``mode`` packed or nsp, a progress line every 5% of the input once it has run
    10 s (a bar on a terminal); skipped when already done."""
    argv: list[Any] = ["prepare", "--tokenizer", tokenizer, "--input", *inputs, *(extra or [])]
    argv += ["--output", output, "--max_seq_length", "128", "--mode", mode]
    argv += ["--validation_fraction", validation_fraction]
    r.run(argv, done=output / "meta.json")


HEAD_FIT = "2m"
"""How much of ``reviews-adapted``'s budget fits the fresh MLM head alone (the encoder frozen)."""


def init_from_args(
    r: Recipe, init: Path, data: Path, output: Path, extra: list[Path], lr: str, freeze: str
) -> list[Any]:
    """What the head run and the adaptation share: ``bertforge pretrain --init_from``, MLM only,
    no dropout, 6% warmup, batch 16 and 500 evaluation sequences (``--smoke``: 3 steps of 8,
    32 sequences, no evaluation along the way)."""
    argv: list[Any] = ["pretrain", "--init_from", init, "--data", data, "--output", output]
    if extra:
        argv += ["--extra_eval", "[" + ",".join(str(p) for p in extra) + "]"]
    argv += ["--train.objective", "mlm", "--train.lr", lr, "--train.warmup_ratio", "0.06"]
    argv += ["--train.dropout", "0", "--train.freeze", freeze, "--train.progress", "false"]
    if r.smoke:
        argv += ["--train.max_steps", "3", "--train.batch_size", "8", "--train.eval_examples", "32"]
        return argv + ["--train.eval_every", "0"]
    return argv + ["--train.batch_size", "16", "--train.eval_examples", "500"]


def head_fit_args(r: Recipe, init: Path, data: Path, output: Path, extra: list[Path]) -> list[Any]:
    """``bertforge pretrain --init_from`` with everything but the heads frozen: the fresh MLM
    head (started warm) learns to read the encoder for ``HEAD_FIT`` at a peak LR of 2e-3 before
    the encoder trains, so the encoder's first updates follow a head that already predicts
    instead of noise (linear probing, then fine-tuning: Kumar et al. 2022). A head-only step
    costs about a third of a full one."""
    argv = init_from_args(r, init, data, output, extra, "2e-3", "embeddings,layers:all")
    argv += ["--train.save_every", "0"]
    if not r.smoke:
        argv += ["--train.max_time", HEAD_FIT, "--train.eval_every", "0"]
    return argv


def adapt_args(
    r: Recipe, init: Path, data: Path, output: Path, extra: list[Path], budget: str | None = None
) -> list[Any]:
    """``bertforge pretrain --init_from``: word embeddings (and with them the tied output layer)
    frozen, a peak LR of 6e-4 with linear decay over the budget (``budget``: what the head run
    left of it), evaluated and saved every 200 steps. Measured in docs/results.md: after
    ``head_fit_args``' 2 minutes, 13 more take held-out IMDB masked-token accuracy to 35.8% on 2
    cores."""
    argv = init_from_args(r, init, data, output, extra, "6e-4", "embeddings")
    if not r.smoke:
        argv += ["--train.max_time", budget or r.budget]
        argv += ["--train.eval_every", "200", "--train.save_every", "200"]
    return argv


def finetune_args(r: Recipe, task: dict[str, Any], model: Path, output: Path, seed: int) -> list:
    """``bertforge finetune`` with a task's settings; ``--smoke``: 3 steps of 8 examples."""
    argv: list[Any] = ["finetune", "--model", model, "--train", task["train"], "--output", output]
    argv += task["options"] + ["--seed", seed, "--dropout", "0", "--progress", "false"]
    if r.smoke:
        argv += ["--max_steps", "3", "--batch_size", "8", "--max_length", "32"]
    return argv


def finetune_and_score(
    r: Recipe, tasks: list[dict[str, Any]], models: dict[str, Path]
) -> dict[str, Any]:
    """Fine-tune each model with each seed on each task and evaluate it on the task's test file
    (seed by seed, so the first seed's full comparison comes first); returns
    ``{task: {model: {"seeds": {seed: metrics}, "mean": {metric: mean}}}}``."""
    scores: dict[str, Any] = {t["name"]: {name: {} for name in models} for t in tasks}
    for seed in r.seeds:
        for task in tasks:
            for name, model in models.items():
                run = r.path("finetune", f"{task['name']}-{name}-seed{seed}")
                r.run(finetune_args(r, task, model, run, seed), done=run / "config.json")
                out = run / "test.json"
                r.run(["evaluate", "--model", run, "--data", task["test"], "--output", out], out)
                result = json.loads(out.read_text())
                metrics = {k: result[k] for k in task["metrics"] if k in result}
                scores[task["name"]][name][str(seed)] = metrics
    return {
        task["name"]: {
            name: seeds_and_mean(runs, task["metrics"])
            for name, runs in scores[task["name"]].items()
        }
        for task in tasks
    }


def seeds_and_mean(runs: dict[str, dict[str, float]], metrics: Sequence[str]) -> dict[str, Any]:
    """``{"seeds": runs, "mean": {metric: mean over the seeds}}`` of one model on one task
    (``runs``: seed -> metrics)."""
    mean = {
        k: sum(v[k] for v in runs.values()) / len(runs)
        for k in metrics
        if all(k in v for v in runs.values())
    }
    return {"seeds": runs, "mean": mean}


def imdb_task(r: Recipe) -> dict[str, Any]:
    """IMDB sentiment on fixed slices: 2,000 train reviews, 2,000 test reviews (seed 0; smoke
    64 + 64), 128 tokens head+tail, one epoch, batch 16, lr 1e-4."""
    imdb = r.need("imdb")
    n = 64 if r.smoke else 2000
    train = sample(list(read_rows(sorted(imdb.glob("train-*.csv.gz")))), n, seed=0)
    test = sample(list(read_rows(sorted(imdb.glob("test-*.csv.gz")))), n, seed=0)
    options = ["--text_column", "text", "--max_length", "128", "--truncation", "head_tail"]
    options += ["--batch_size", "16", "--lr", "1e-4", "--epochs", "1"]
    options += ["--validation_fraction", "0.05"]
    return {
        "name": "imdb",
        "train": write_rows(r.path("imdb-train.csv"), train, ["text", "label"]),
        "test": write_rows(r.path("imdb-test.csv"), test, ["text", "label"]),
        "options": options,
        "metrics": ("accuracy", "macro_f1"),
    }


def agnews_task(r: Recipe, test_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """AG News with little labelled data: the 2,000 labelled train rows (title + description as
    a pair), 3 epochs, batch 16, lr 1e-4, 128 tokens; tested on the 7,600 test rows or
    ``test_rows`` (smoke: 64 + 64)."""
    ag = r.need("ag_news")
    train = list(read_rows([ag / "train_partial_first2000.csv"]))
    test = test_rows if test_rows is not None else list(read_rows([ag / "test.csv"]))
    if r.smoke:
        train, test = sample(train, 64), sample(test, 64)
    columns = ["label", "title", "description"]
    options = ["--text_column", "title", "--text_pair_column", "description"]
    options += ["--max_length", "128", "--batch_size", "16", "--lr", "1e-4", "--epochs", "3"]
    return {
        "name": "agnews",
        "train": write_rows(r.path("agnews-train.csv"), train, columns),
        "test": write_rows(r.path("agnews-test.csv"), test, columns),
        "options": options,
        "metrics": ("accuracy", "macro_f1"),
    }


# ---- reviews-adapted --------------------------------------------------------------------------


def reviews_adapted(r: Recipe) -> None:
    imdb = r.need("imdb")
    wiki = r.need("wikitext2", "wiki.valid.tokens")
    r.budget = r.budget or "15m"
    init = r.init or (tiny_encoder(r, minilm_dir()) if r.smoke else minilm_dir())
    if r.smoke:  # a slice of the unlabelled reviews
        lines = list(islice(text_lines(imdb / "unsup-00.txt.gz"), 150))
        text = r.path("imdb-slice.txt")
        atomic_write_text(text, "".join(lines))
        inputs: list[Any] = [text]
        wiki_text = r.path("wiki-slice.txt")
        atomic_write_text(
            wiki_text, "".join(wiki.read_text(encoding="utf-8").splitlines(True)[:400])
        )
        wiki = wiki_text
    else:
        inputs = sorted(imdb.glob("unsup-*.txt.gz")) + sorted(imdb.glob("train-*.csv.gz"))
    data, wikidata = r.path("data-imdb"), r.path("data-wikitext2")
    # never the test reviews (266 unlabelled reviews repeat one); the smoke slice skips the check
    exclude = [] if r.smoke else ["--exclude", *sorted(imdb.glob("test-*.csv.gz"))]
    fraction = "0.01" if not r.smoke else "0.1"
    prepare_data(r, init, inputs, data, fraction, extra=["--text_column", "text", *exclude])
    prepare_data(r, init, [wiki], wikidata, "0")
    # the starting point as the run sees it: the encoder with a fresh MLM head, started warm
    start = r.path("start")
    if not (start / "model.safetensors").is_file():
        seed_everything(0)
        model, tokenizer = BertForMaskedLM.from_pretrained(init), Tokenizer.from_file(init)
        train = PretrainingDataset(data, "train")
        counts = head_warm_counts(train, tokenizer, model.config.vocab_size)
        warm_fresh_head(model, model.loading_info["missing"], counts)
        model.save_pretrained(start, tokenizer)
    # first the head alone (HEAD_FIT), then the encoder too for the rest of the budget
    tag = "smoke" if r.smoke else r.budget
    head = r.path(f"head-{tag}")
    r.run(head_fit_args(r, init, data, head, [wikidata]), done=head / "results.json")
    rest = None if r.smoke else format_duration(parse_duration(r.budget) - parse_duration(HEAD_FIT))
    run = r.path(f"adapt-{tag}")
    r.run(adapt_args(r, head / "model", data, run, [wikidata], rest), done=run / "results.json")
    r.results["mlm"] = pretrain_results(run, head)

    answers = run / "fill-mask.jsonl"
    top_k = ["--top_k", "5"]
    r.run(
        ["fill-mask", "--model", start, "--compare", run / "model", *top_k]
        + ["--output", answers, *REVIEW_SENTENCES],
        done=answers,
    )
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    table = fill_mask_side_by_side(
        {
            "start (warm head)": [rec["models"][str(start)] for rec in records],
            "adapted": [rec["models"][str(run / "model")] for rec in records],
        }
    )
    atomic_write_text(run / "fill-mask.txt", table)
    r.results["fill_mask"] = {
        rec["text"]: {
            "start": [g["token"] for g in rec["models"][str(start)]["masks"][0]],
            "adapted": [g["token"] for g in rec["models"][str(run / "model")]["masks"][0]],
        }
        for rec in records
    }
    # the budget in the name: a --budget 30m run in the same --output reuses MiniLM's fine-tunes
    models = {f"adapted-{tag}": run / "model", "minilm": init}
    r.results["downstream"] = finetune_and_score(r, [imdb_task(r), agnews_task(r)], models)
    print(table, file=sys.stderr)


# ---- review-scores ----------------------------------------------------------------------------


def review_scores(r: Recipe) -> None:
    rows = list(read_rows([r.need("bert_tlsa_reviews", "metacritic_reviews.csv")]))
    if r.smoke:
        rows = sample(rows, 200)
    for row in rows:
        row["text"], row["label"] = clean_text(row["review"]), row["score"]
    train_idx, test_idx = fixed_split(len(rows), 0.2, seed=0)
    train = write_rows(r.path("train.csv"), [rows[i] for i in train_idx], ["text", "label"])
    test = write_rows(r.path("test.csv"), [rows[i] for i in test_idx], ["text", "label"])
    text = r.path("train-text.txt")
    atomic_write_text(text, "".join(rows[i]["text"] + "\n" for i in train_idx))
    r.budget = r.budget or "5m"
    init = r.init or (tiny_encoder(r, minilm_dir()) if r.smoke else minilm_dir())
    data = r.path("data-train-text")
    prepare_data(r, init, [text], data, "0.05")
    run = r.path(f"tapt-{'smoke' if r.smoke else r.budget}")
    r.run(adapt_args(r, init, data, run, []), done=run / "results.json")
    r.results["mlm"] = pretrain_results(run)
    options = ["--task", "regression", "--max_length", "128", "--truncation", "head_tail"]
    options += ["--batch_size", "16", "--lr", "1e-4", "--epochs", "2"]
    task = {
        "name": "metacritic",
        "train": train,
        "test": test,
        "options": options,
        "metrics": ("spearman", "pearson", "mae", "mse"),
    }
    models = {"adapted": run / "model", "minilm": init}
    r.results["downstream"] = finetune_and_score(r, [task], models)


# ---- news-from-scratch ------------------------------------------------------------------------


def news_from_scratch(r: Recipe) -> None:
    ag = r.need("ag_news")
    rows = list(read_rows([ag / "test.csv"]))
    if r.smoke:
        rows = sample(rows, 400)
    pre_idx, held_idx = fixed_split(len(rows), 0.2, seed=0)

    def text(row: dict[str, Any]) -> str:
        return clean_text(
            row["title"].replace("\\", " ") + ". " + row["description"].replace("\\", " ")
        )

    pre, held = r.path("pretrain-text.txt"), r.path("heldout-text.txt")
    atomic_write_text(pre, "".join(text(rows[i]) + "\n" for i in pre_idx))
    atomic_write_text(held, "".join(text(rows[i]) + "\n" for i in held_idx))
    held_rows = [rows[i] for i in held_idx]
    tok = r.path("tokenizer")
    vocab = "1000" if r.smoke else "8000"
    r.run(
        ["tokenizer", "train", "--input", pre, "--vocab_size", vocab, "--output", tok],
        done=tok / "vocab.txt",
    )
    data, held_data = r.path("data"), r.path("data-heldout")
    prepare_data(r, tok, [pre], data, "0.02")
    prepare_data(r, tok, [held], held_data, "0")
    r.budget = r.budget or "15m"
    run = r.path(f"pretrain-{'smoke' if r.smoke else r.budget}")
    argv: list[Any] = ["pretrain", "--data", data, "--output", run]
    argv += ["--extra_eval", f"[{held_data}]", "--train.objective", "mlm"]
    argv += ["--train.dropout", "0", "--train.eval_every", "0", "--train.progress", "false"]
    if r.smoke:
        argv += ["--model.preset", "tiny", "--train.max_steps", "3", "--train.batch_size", "8"]
    else:
        argv += ["--model.preset", "mini", "--train.max_time", r.budget, "--train.lr", "1e-3"]
        argv += ["--train.batch_size", "64", "--train.warmup_ratio", "0.05"]
        argv += ["--train.eval_examples", "null"]
    r.run(argv, done=run / "results.json")
    r.results["mlm"] = pretrain_results(run)
    tokenizer = Tokenizer.from_file(tok)
    r.results["mlm"]["frequency_guesser"] = unigram_baseline(
        PretrainingDataset(data, "train", tokenizer),
        PretrainingDataset(held_data, "train", tokenizer),
        tokenizer.vocab_size,
    )
    task = agnews_task(r, test_rows=held_rows)
    scores: dict[str, dict[str, Any]] = {"pretrained": {}, "random_init": {}}
    for seed in r.seeds:  # the same twin each time; the fine-tuning seed varies
        out = r.path("downstream", f"seed{seed}")
        argv = ["downstream", "--model", run / "model", "--train", task["train"]]
        argv += ["--test", task["test"], "--output", out, *task["options"], "--seed", seed]
        argv += ["--dropout", "0", "--progress", "false"]
        if r.smoke:
            argv += ["--max_steps", "3", "--batch_size", "8", "--max_length", "32"]
        r.run(argv, done=out / "downstream.json")
        both = json.loads((out / "downstream.json").read_text())
        for name, runs in scores.items():
            runs[str(seed)] = {k: both[name][k] for k in task["metrics"]}
            if "beats_baseline" in both[name]:  # a column that learned nothing is no comparison
                runs[str(seed)]["beats_baseline"] = both[name]["beats_baseline"]
    r.results["downstream"] = {
        "agnews": {name: seeds_and_mean(runs, task["metrics"]) for name, runs in scores.items()}
    }


# ---- wikitext-nsp -----------------------------------------------------------------------------


def wikitext_nsp(r: Recipe) -> None:
    wiki_test = r.need("wikitext2", "wiki.test.tokens")
    wiki_valid = r.need("wikitext2", "wiki.valid.tokens")
    shakespeare = r.need("tiny_shakespeare", "input.txt")
    inputs: list[Path] = [wiki_test, shakespeare]
    if r.smoke:
        inputs = []
        for path, n in ((wiki_test, 600), (shakespeare, 1500), (wiki_valid, 300)):
            piece = r.path(f"slice-{path.name}")
            atomic_write_text(piece, "".join(path.read_text(encoding="utf-8").splitlines(True)[:n]))
            inputs.append(piece)
        wiki_valid = inputs.pop()
    tok = r.path("tokenizer")
    vocab = "1000" if r.smoke else "8000"
    r.run(
        ["tokenizer", "train", "--input", *inputs, "--vocab_size", vocab, "--output", tok],
        done=tok / "vocab.txt",
    )
    data, valid = r.path("data"), r.path("data-wikitext2-valid")
    prepare_data(r, tok, inputs, data, "0.01", mode="nsp")
    prepare_data(r, tok, [wiki_valid], valid, "0", mode="nsp")
    r.budget = r.budget or "20m"
    run = r.path(f"pretrain-{'smoke' if r.smoke else r.budget}")
    argv: list[Any] = ["pretrain", "--data", data, "--output", run, "--extra_eval", f"[{valid}]"]
    argv += ["--train.objective", "mlm_nsp", "--train.dropout", "0", "--train.eval_every", "0"]
    argv += ["--train.progress", "false"]
    if r.smoke:
        argv += ["--model.preset", "tiny", "--train.max_steps", "3", "--train.batch_size", "8"]
    else:
        argv += ["--model.preset", "mini", "--train.max_time", r.budget, "--train.lr", "1e-3"]
        argv += ["--train.batch_size", "64", "--train.warmup_ratio", "0.05"]
        argv += ["--train.eval_examples", "null"]
    r.run(argv, done=run / "results.json")
    r.results["mlm"] = pretrain_results(run)


RECIPES: dict[str, tuple[Callable[[Recipe], None], str]] = {
    "general": (general, "tokenizer + BERT-Tiny from nothing on Wikipedia + books (2h)"),
    "reviews-adapted": (reviews_adapted, "all-MiniLM-L6-v2 adapted on IMDB review text (15m)"),
    "review-scores": (review_scores, "Metacritic scores from MiniLM, with/without adaptation"),
    "news-from-scratch": (news_from_scratch, "tokenizer + BERT-Mini from nothing on AG News"),
    "wikitext-nsp": (wikitext_nsp, "BERT-Mini MLM + NSP on WikiText-2 test + Shakespeare (20m)"),
}

TAKES_PRETRAIN_OPTIONS = frozenset({"general"})
"""Recipes whose pretraining step takes the options after ``--``."""


__all__ = ["RECIPES", "REVIEW_SENTENCES", "TAKES_PRETRAIN_OPTIONS"]
