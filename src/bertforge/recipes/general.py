"""The ``general`` recipe: a BERT pretrained from nothing on general English (``general/`` of the
shared data: an English Wikipedia slice and Project Gutenberg books, bzip2, one paragraph per
line, a blank line between documents), for general tasks (GLUE) rather than one domain.

Steps, each skipped when its output exists (an interrupted run continues):

1. **held-out text** (``heldout.txt``): the last :data:`HELD_OUT` documents of
   ``wikipedia-03`` and ``gutenberg-01`` (Wikipedia articles and whole books never trained on);
   ``prepare`` takes them as the validation split and excludes them from training.
2. **tokenizer**: a WordPiece vocabulary (:data:`VOCAB`) trained on a random 100M-character sample
   of the corpus (``tokenizer train --max_chars``).
3. **prepare**: the whole corpus into 128-token sentence pairs for MLM + NSP (``--format text``
   splits each paragraph line into sentences), ``--workers`` one per core; WikiText-2 validation
   with the same tokenizer as an out-of-domain evaluation set.
4. **pretrain** (:data:`PRETRAIN`) for ``--budget`` (default :data:`BUDGET`); the learning-rate
   schedule follows the budget (warmup and linear decay over ``--train.max_time``). Options after
   ``--`` on the command line go to this step (``bertforge recipe general -- --train.lr 1e-3``).

The model ends at ``OUTPUT/run/model`` in Hugging Face's layout; ``bertforge benchmark --model
OUTPUT/run/model --suite glue --baseline true`` judges it on GLUE (docs/pretraining-study.md).
``--smoke``: a few hundred lines of two of the files, a 1,000-token vocabulary, BERT-Tiny for 3
steps.
"""

from __future__ import annotations

import math
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any

from bertforge.data.dataset import TOKENIZER_DIR, PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text, text_lines
from bertforge.progress import format_duration, parse_budget, parse_duration
from bertforge.recipes.runner import Recipe, pretrain_results, unigram_baseline
from bertforge.runtime import pick_device
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import TrainConfig
from bertforge.training.start import WORD_INIT_TOKENS, cooccurrence_cache, count_seconds

CORPUS = (
    "wikipedia-00.txt.bz2",
    "wikipedia-01.txt.bz2",
    "wikipedia-02.txt.bz2",
    "wikipedia-03.txt.bz2",
    "gutenberg-00.txt.bz2",
    "gutenberg-01.txt.bz2",
)
"""The files of ``general/`` the recipe reads (all six: about 92M words)."""

HELD_OUT = {"wikipedia-03.txt.bz2": 100, "gutenberg-01.txt.bz2": 2}
"""Documents held out for validation: the last N of each file (100 articles, 2 books)."""

VOCAB = 8192
"""WordPieces: at 30k the MLM output layer of BERT-Tiny costs about twice its encoder."""

BUDGET = "2h"
"""The default pretraining time (one session on 2 CPU cores can run and benchmark it)."""

PRETRAIN: tuple[str, ...] = (
    "--model.preset", "tiny",
    "--masking.mlm_probability", "0.25",
    "--train.objective", "mlm_nsp",
    "--train.word_init", "cooccurrence",
    "--train.position_init", "sinusoidal",
    "--train.position_init_std", "0.2",
    "--train.segment_init_std", "0.2",
    "--train.bow_weight", "1.0",
    "--train.similarity_weight", "1.0",
    "--train.batch_size", "64",
    "--train.lr", "2e-3",
    "--train.warmup_ratio", "0.1",
    "--train.dropout", "0",
    "--train.eval_every", "1000",
    "--train.eval_examples", "2048",
    "--train.save_every", "1000",
    "--train.log_every", "20",
    "--train.progress", "false",
)  # fmt: skip
"""The pretraining settings: the 20-minute IMDB recipe's (``configs/imdb-20m.yaml``, measured in
docs/pretraining-study.md), BERT-Tiny with MLM + NSP on sentence pairs, co-occurrence word
vectors, sinusoidal positions, a bag-of-words loss on the pooler, no dropout; and a
pair-similarity loss on the pooler, the one screen that paid on GLUE at 30 minutes (+2.5 over two
pretraining runs each, docs/pretraining-study.md)."""

PRETRAIN_GPU: tuple[str, ...] = (
    "--model.preset", "medium",
    "--train.word_init", "normal",
    "--train.position_init_std", "0.02",
    "--train.segment_init_std", "0.02",
    "--train.batch_size", "256",
    "--train.lr", "5e-4",
    "--train.eval_every", "2000",
    "--train.save_every", "2000",
    "--train.log_every", "100",
)  # fmt: skip
"""What changes when the pretraining step runs on CUDA (docs/gpu.md): BERT-Medium (8 layers of
512) at batch 256, peak LR 5e-4, and words from BERT's normal draw (counting co-occurrences
takes about 95 s of CPU for this corpus, a large part of a GPU's minutes), with the position
and segment tables at the same 0.02: beside 0.02 word vectors, the CPU recipe's 0.2 tables
leave the words 1% of the embedding's variance, and a 3-minute H200 run so set stayed at the
unigram loss (7.0) for all its 4,084 steps (docs/gpu.md). Compiled, as every CUDA run is by
default."""

GPU_BUDGET = "10m"
"""The default pretraining time on a GPU."""


def last_documents(path: Path, count: int) -> list[list[str]]:
    """The last ``count`` documents of a blank-line-separated text file (each a list of its
    non-blank lines, newlines dropped), read as it streams."""
    kept: deque[list[str]] = deque(maxlen=count)
    document: list[str] = []
    for line in text_lines(path):
        text = line.rstrip("\n")
        if text.strip():
            document.append(text)
        elif document:
            kept.append(document)
            document = []
    if document:
        kept.append(document)
    return list(kept)


def write_documents(path: Path, documents: list[list[str]]) -> Path:
    """Documents as text: a line each paragraph, a blank line between documents (atomic)."""
    return atomic_write_text(path, "\n\n".join("\n".join(d) for d in documents) + "\n")


def smoke_corpus(r: Recipe, corpus: list[Path]) -> list[Path]:
    """The first lines of the first Wikipedia and Gutenberg files, as small text files."""
    pieces = []
    for path, lines in ((corpus[0], 400), (corpus[4], 300)):
        piece = r.path(f"slice-{path.name.removesuffix('.bz2')}")
        if not piece.exists():
            head = []
            for number, line in enumerate(text_lines(path)):
                if number >= lines:
                    break
                head.append(line)
            atomic_write_text(piece, "".join(head))
        pieces.append(piece)
    return pieces


def option_value(argv: list[str], option: str) -> str | None:
    """The value of the last ``option VALUE`` in ``argv``, or None."""
    found = None
    for i, word in enumerate(argv[:-1]):
        if word == option:
            found = argv[i + 1]
    return found


def on_gpu(pretrain_args: list[str]) -> bool:
    """Whether the pretraining step will run on CUDA: ``--train.device`` as given after ``--``,
    else ``auto`` (a GPU when there is one), as ``bertforge pretrain`` decides it."""
    name = option_value(pretrain_args, "--train.device") or "auto"
    return pick_device(name, "--train.device").type == "cuda"


START_SHARE = 0.25
"""The most of the pretraining budget the co-occurrence count may take: below four times its
foreseen time, the recipe starts from ``--train.word_init normal`` (and says so)."""


def word_init_for_budget(r: Recipe, extra: list[str], data: Path) -> list[str]:
    """What the pretraining step's word vectors need, decided before the data steps: ``[]``
    when the budget holds the co-occurrence count (or it is cached in ``data``, or the run is a
    smoke or GPU one, which do not count), else ``--train.word_init normal`` with a line saying
    why; a ``--train.word_init cooccurrence`` given after ``--`` that the budget cannot hold is
    refused before any step runs."""
    asked = option_value(extra, "--train.word_init")
    if r.smoke or asked == "normal" or r.budget is None:
        return []
    window = int(option_value(extra, "--train.word_init_window") or TrainConfig.word_init_window)
    if cooccurrence_cache(data, window).is_file():
        return []
    budget = parse_duration(r.budget) or float("inf")
    foreseen = count_seconds(WORD_INIT_TOKENS, window)
    least = format_duration(math.ceil(foreseen / START_SHARE / 60) * 60)
    if foreseen <= START_SHARE * budget:
        return []
    if asked == "cooccurrence":
        raise BertforgeError(
            f"recipe {r.name}: --train.word_init cooccurrence counts about "
            f"{format_duration(foreseen)} ({WORD_INIT_TOKENS:,} tokens on one CPU core), more "
            f"than a quarter of the budget {r.budget}; give a budget of {least} or more, or "
            "drop --train.word_init cooccurrence"
        )
    print(
        f"recipe {r.name}: the budget {r.budget} is under {least}, too short to count "
        f"co-occurrence word vectors (about {format_duration(foreseen)} on one CPU core): "
        "pretraining starts from --train.word_init normal",
        file=sys.stderr,
        flush=True,
    )
    return ["--train.word_init", "normal"]


def general(r: Recipe) -> None:
    """Held-out text, tokenizer, prepared pairs, pretraining (see the module docstring)."""
    smoke = r.smoke
    vocab = 1000 if smoke else VOCAB
    heldout = r.path("heldout.txt")
    tok = r.path(f"tokenizer-{vocab}")
    data = r.path(f"data-{vocab}-128-nsp")
    wiki = r.path(f"wikitext2-{vocab}")
    extra = list(r.pretrain_args)
    if "--train.max_time" in extra[:-1]:  # a budget given as a pretrain option is the budget
        r.budget = option_value(extra, "--train.max_time")
        parse_budget(r.budget, "--train.max_time")  # a bare 3 is refused before the data steps
    gpu = on_gpu(extra)
    r.budget = r.budget or (GPU_BUDGET if gpu else BUDGET)
    # the start's cost is known before the data steps, which take ~25 minutes on one core
    words = [] if gpu else word_init_for_budget(r, extra, data)
    # the corpus is read only by the data steps: a folder that has their outputs (copied to a
    # GPU machine, say) pretrains without it
    corpus = [r.data / "general" / name for name in CORPUS]  # named in the steps' lines
    if not all(p.exists() for p in (heldout, tok / "vocab.txt", data / "meta.json")):
        corpus = [r.need("general", name) for name in CORPUS]
        if smoke:
            corpus = smoke_corpus(r, corpus)
    if not heldout.exists():
        held_out = {corpus[0]: 2} if smoke else {p: HELD_OUT.get(p.name, 0) for p in corpus}
        documents = [d for path, n in held_out.items() if n for d in last_documents(path, n)]
        write_documents(heldout, documents)
    r.run(
        ["tokenizer", "train", "--input", *corpus, "--vocab_size", vocab, "--output", tok],
        done=tok / "vocab.txt",
    )
    workers = str(max(1, min(4, r.num_threads or os.cpu_count() or 1)))
    argv: list[Any] = ["prepare", "--tokenizer", tok, "--input", *corpus, "--format", "text"]
    argv += ["--validation", heldout, "--output", data]
    argv += ["--max_seq_length", "128", "--mode", "nsp", "--workers", workers]
    r.run(argv, done=data / "meta.json")  # a line every 5% of the input (~20 minutes)
    wikitext = wiki / "meta.json"
    source = r.data / "wikitext2" / "wiki.valid.tokens"
    if not wikitext.exists():
        source = r.need("wikitext2", "wiki.valid.tokens")
    argv = ["prepare", "--tokenizer", tok, "--input", source]
    argv += ["--output", wiki, "--max_seq_length", "128", "--mode", "nsp"]
    r.run(argv + ["--validation_fraction", "0"], done=wikitext)

    run = r.path("run")
    argv = ["pretrain", "--data", data, "--extra_eval", f"[{wiki}]", "--output", run]
    argv += list(PRETRAIN) + (list(PRETRAIN_GPU) if gpu and not smoke else []) + words
    if smoke:
        argv += ["--train.max_steps", "3", "--train.batch_size", "8"]
        argv += ["--train.eval_examples", "32", "--train.eval_every", "0"]
    elif "--train.max_time" not in extra:
        argv += ["--train.max_time", r.budget]
    r.run(argv + extra, done=run / "results.json")
    r.results["mlm"] = pretrain_results(run)
    r.results["mlm"]["frequency_guesser"] = frequency_guessers(
        data,
        {"val": data, f"val:{wiki.name}": wiki},  # the evaluation sets as pretrain names them
    )
    r.results["model"] = str(run / "model")


def frequency_guessers(train: Path, held_out: dict[str, Path]) -> dict[str, dict[str, float]]:
    """:func:`unigram_baseline` of ``train``'s training split on each held-out set (its
    validation split for ``train`` itself, else the set's training split), by the evaluation
    set's name in the pretraining results (``val``, ``val:NAME``): the line a model must beat
    that has learned only which words are frequent."""
    tokenizer = Tokenizer.from_file(train / TOKENIZER_DIR)
    counts = PretrainingDataset(train, "train", tokenizer)
    return {
        name: unigram_baseline(
            counts,
            PretrainingDataset(path, "validation" if path == train else "train", tokenizer),
            tokenizer.vocab_size,
        )
        for name, path in held_out.items()
    }
