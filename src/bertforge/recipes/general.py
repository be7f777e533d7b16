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

import os
from collections import deque
from pathlib import Path
from typing import Any

from bertforge.io import atomic_write_text, text_lines
from bertforge.recipes.runner import Recipe, pretrain_results
from bertforge.runtime import pick_device

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


def general(r: Recipe) -> None:
    """Held-out text, tokenizer, prepared pairs, pretraining (see the module docstring)."""
    smoke = r.smoke
    vocab = 1000 if smoke else VOCAB
    heldout = r.path("heldout.txt")
    tok = r.path(f"tokenizer-{vocab}")
    data = r.path(f"data-{vocab}-128-nsp")
    wiki = r.path(f"wikitext2-{vocab}")
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
    r.run(argv + ["--progress", "false"], done=data / "meta.json")
    wikitext = wiki / "meta.json"
    source = r.data / "wikitext2" / "wiki.valid.tokens"
    if not wikitext.exists():
        source = r.need("wikitext2", "wiki.valid.tokens")
    argv = ["prepare", "--tokenizer", tok, "--input", source]
    argv += ["--output", wiki, "--max_seq_length", "128", "--mode", "nsp"]
    r.run(argv + ["--validation_fraction", "0", "--progress", "false"], done=wikitext)

    extra = list(r.pretrain_args)
    if "--train.max_time" in extra[:-1]:  # a budget given as a pretrain option is the budget
        r.budget = option_value(extra, "--train.max_time")
    gpu = on_gpu(extra)
    r.budget = r.budget or (GPU_BUDGET if gpu else BUDGET)
    run = r.path("run")
    argv = ["pretrain", "--data", data, "--extra_eval", f"[{wiki}]", "--output", run]
    argv += list(PRETRAIN) + (list(PRETRAIN_GPU) if gpu and not smoke else [])
    if smoke:
        argv += ["--train.max_steps", "3", "--train.batch_size", "8"]
        argv += ["--train.eval_examples", "32", "--train.eval_every", "0"]
    elif "--train.max_time" not in extra:
        argv += ["--train.max_time", r.budget]
    r.run(argv + extra, done=run / "results.json")
    r.results["mlm"] = pretrain_results(run)
    r.results["model"] = str(run / "model")
