"""Bad and hostile input through every command: exit status 2, one ``error: ...`` line naming the
file, field or option and the fix, no traceback, and nothing half-written left behind.

Each case builds its input in ``tmp_path`` (damaged copies of real, freshly made artefacts: a
tokenizer, prepared shards, model directories, a pretraining checkpoint), runs ``bertforge``
in-process and checks the message and that ``tmp_path`` holds no new file. Errors that other
test files already cover (missing files, empty corpora, bad UTF-8 in a corpus, unknown labels,
pickled weights, ...) are not repeated here.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard
from conftest import TaskFiles
from support.cli import one_line_error, run_cli
from support.corpus import prepare_quiet

from bertforge import cli
from bertforge.modeling.model import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import latest_checkpoint

TINY_PRETRAIN = [
    *("--model.preset", "tiny", "--model.hidden_size", "32", "--model.num_attention_heads", "4"),
    *("--model.num_hidden_layers", "1", "--model.intermediate_size", "64"),
    *("--model.max_position_embeddings", "64", "--train.objective", "mlm"),
    *("--train.max_steps", "2", "--train.batch_size", "8", "--train.progress", "false"),
    *("--train.precision", "fp32", "--train.device", "cpu", "--train.eval_examples", "8"),
    *("--train.num_threads", "1", "--train.eval_every", "0", "--train.save_every", "0"),
]
MODERN = ["--model.architecture", "modernbert", "--model.local_attention", "16"]
"""TINY_PRETRAIN as a ModernBERT (its sizes, a window inside its 64 positions)."""
FAST_FINETUNE = [
    "--max_steps",
    "1",
    "--batch_size",
    "8",
    "--max_length",
    "32",
    "--progress",
    "false",
]


@pytest.fixture(scope="module")
def fx(task_files, tmp_path_factory) -> dict[str, Path]:
    """Real artefacts to damage: a tiny MLM model with its tokenizer, a classifier, labelled
    data, packed pretraining shards and a pretraining run with one checkpoint."""
    root = tmp_path_factory.mktemp("bad_input")
    mlm = task_files.tiny_start_model(root, kind="mlm")
    torch.manual_seed(0)
    clf = root / "classifier"
    BertForSequenceClassification.from_pretrained(
        mlm, num_labels=2, id2label={0: "neg", 1: "pos"}
    ).save_pretrained(clf, tokenizer=Tokenizer.from_file(mlm))
    tagger = root / "tagger"
    BertForTokenClassification.from_pretrained(
        mlm, num_labels=3, id2label={0: "O", 1: "B-PER", 2: "I-PER"}
    ).save_pretrained(tagger, tokenizer=Tokenizer.from_file(mlm))
    task_files.write_sentiment(root / "train.csv", 32, seed=0)
    data = root / "data"
    prepare_quiet(root / "corpus.txt", mlm, data, validation_fraction=0.1)
    run = root / "run"
    threads = torch.get_num_threads()  # the run sets one thread; give the session its setting back
    assert cli.main(["pretrain", "--data", str(data), "--output", str(run), *TINY_PRETRAIN]) == 0
    torch.set_num_threads(threads)
    assert latest_checkpoint(run) is not None
    return {
        "mlm": mlm,
        "clf": clf,
        "tagger": tagger,
        "train": root / "train.csv",
        "data": data,
        "run": run,
    }


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _copy(src: Path, dst: Path, edit: Callable[[Path], object]) -> Path:
    """A copy of ``src`` changed by ``edit``, without its manifest (as another tool or an older
    bertforge writes it), so the checks behind the manifest's are what the case exercises."""
    shutil.copytree(src, dst)
    (dst / "manifest.json").unlink()
    edit(dst)
    return dst


def _edit_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        d = json.loads((directory / name).read_text())
        change(d)
        (directory / name).write_text(json.dumps(d))

    return edit


def _cut(name: str) -> Callable[[Path], None]:
    """Truncate a file to half its size (a copy killed half-way)."""

    def edit(directory: Path) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[: len(data) // 2])

    return edit


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def _parquet(path: Path, *, cut: bool = False) -> Path:
    """A Parquet file of an int64 ``id`` and a string ``body`` column (``cut``: its first half)."""
    pq.write_table(pa.table({"id": [1, 2], "body": ["One text.", "Two."]}), path)
    if cut:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _truncated_zst(path: Path) -> Path:
    packed = zstandard.ZstdCompressor().compress(b"One sentence here. And a second one.\n" * 50)
    return _write(path, packed[:-6])


def _dataset_dict(path: Path) -> Path:
    split = datasets.Dataset.from_dict({"text": ["a good film ."], "label": ["pos"]})
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(path)
    return path


def _blocked(path: Path, argv: list) -> list:
    """``argv`` with a plain file put where the command wants to write a directory."""
    _write(path, "x")
    return argv


def _dir(path: Path) -> Path:
    path.mkdir()
    return path


def _overwrite_idx(directory: Path) -> None:
    path = directory / "train-00000.idx"
    path.write_bytes(np.full(path.stat().st_size // 8, 7_000_000, dtype=np.int64).tobytes())


def _overwrite_ids(directory: Path) -> None:
    path = directory / "train-00000.ids"
    path.write_bytes(b"\xff" * path.stat().st_size)


# ---- cases: (id, argv builder (fixtures, tmp_path), expected parts of the message) ------------
Argv = Callable[[dict[str, Path], Path], list]


def _tok(t: Path, *extra) -> list:
    corpus = _write(t / "c.txt", "the cat sat on the mat .\n" * 20)
    return ["tokenizer", "train", "--input", corpus, "--output", t / "out", *extra]


def _prep(fx: dict, t: Path, *extra, tokenizer: Path | None = None, corpus=None) -> list:
    text = "One sentence here. And a second one.\n\nOther doc. Two.\n"
    corpus = corpus or _write(t / "c.txt", text)
    tok = tokenizer or fx["mlm"]
    return [
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        tok,
        "--output",
        t / "out",
        "--progress",
        "false",
    ] + [*extra]


def _pt(data: Path, t: Path, *extra) -> list:
    return ["pretrain", "--data", data, "--output", t / "out", *TINY_PRETRAIN, *extra]


def _bad_data(t: Path, fx: dict, edit: Callable[[Path], object]) -> Path:
    return _copy(fx["data"], t / "data", edit)


def _fm(model: Path, *extra) -> list:
    return ["fill-mask", "--model", model, "a [MASK] film .", *extra]


def _bad_model(t: Path, fx: dict, edit: Callable[[Path], object], kind: str = "mlm") -> Path:
    return _copy(fx[kind], t / "model", edit)


def _ft(fx: dict, t: Path, *extra, model: Path | None = None) -> list:
    model = model or fx["mlm"]
    return ["finetune", "--model", model, "--train", fx["train"], "--output", t / "out"] + [
        *FAST_FINETUNE,
        *extra,
    ]


def _bigger_tokenizer(directory: Path) -> None:
    big = Tokenizer.train_from_iterator([f"w{i} x{i} y{i}" for i in range(400)], 300)
    big.save(directory)


def _resume_damaged(edit: Callable[[Path], object]) -> Argv:
    """Continue the fixture's pretraining run after damaging its checkpoint."""

    def argv(fx: dict, t: Path) -> list:
        run = shutil.copytree(fx["run"], t / "out")
        (latest_checkpoint(run) / "manifest.json").unlink()  # an older bertforge's checkpoint
        edit(latest_checkpoint(run))
        return [*_pt(fx["data"], t), "--train.max_steps", "4"]

    return argv


CASES: list[tuple[str, Argv, tuple[str, ...]]] = [
    # tokenizer train
    (
        "tokenizer-output-is-a-file",
        lambda fx, t: _blocked(t / "out", _tok(t, "--vocab_size", "60")),
        ("out: a file is in the way", "choose another output path"),
    ),
    (
        "tokenizer-vocab-below-the-alphabet",
        lambda fx, t: _tok(t, "--vocab_size", "8"),
        ("--vocab_size 8 cannot hold the special tokens", "use at least"),
    ),
    (
        "tokenizer-model-max-length-negative",
        lambda fx, t: _tok(t, "--vocab_size", "60", "--model_max_length", "-5"),
        ("model_max_length=-5", "use e.g. 512"),
    ),
    (
        "tokenizer-non-integer-option",
        lambda fx, t: _tok(t, "--vocab_size", "lots"),
        ("bertforge tokenizer train:", "--vocab_size takes an integer, not 'lots'", "--help"),
    ),
    # prepare
    (
        "prepare-missing-option",
        lambda fx, t: ["prepare", "--input", "x.txt"],
        ("bertforge prepare: the following arguments are required: --tokenizer, --output",),
    ),
    (
        "prepare-output-is-a-file",
        lambda fx, t: _blocked(t / "out", _prep(fx, t, "--overwrite")),
        ("out: is a file, not a data directory", "another --output"),
    ),
    (
        "prepare-corrupt-gzip",
        lambda fx, t: _prep(fx, t, corpus=_write(t / "c.txt.gz", b"\x1f\x8b\x08junk")),
        ("c.txt.gz: cannot read the file", "check it"),
    ),
    (
        "prepare-parquet-without-the-column",
        lambda fx, t: _prep(fx, t, "--text_column", "text", corpus=_parquet(t / "t.parquet")),
        ("t.parquet: no column 'text'; the columns are id (int64), body (string)", "--text_column"),
    ),
    (
        "prepare-parquet-column-not-text",
        lambda fx, t: _prep(fx, t, "--text_column", "id", corpus=_parquet(t / "t.parquet")),
        ("t.parquet: column 'id' holds int64, not text", "naming a string column"),
    ),
    (
        "prepare-truncated-parquet",
        lambda fx, t: _prep(fx, t, "--text_column", "body", corpus=_parquet(t / "t.pq", cut=True)),
        ("t.pq: cannot read it as Parquet", "check the file"),
    ),
    (
        "prepare-truncated-zst",
        lambda fx, t: _prep(fx, t, corpus=_truncated_zst(t / "c.txt.zst")),
        ("c.txt.zst: cannot read the file (zstd file ended inside a frame", "check it"),
    ),
    (
        "prepare-folder-no-dataset",
        lambda fx, t: _prep(fx, t, corpus=_write(t / "folder" / "notes.md", "notes").parent),
        ("folder: directory holds no corpus file", "is no datasets folder (no state.json)"),
    ),
    (
        "prepare-dataset-dict",
        lambda fx, t: _prep(fx, t, "--text_column", "text", corpus=_dataset_dict(t / "dd")),
        ("dd: a DatasetDict of the splits ['test', 'train']", "pass one split's folder"),
    ),
    (
        "prepare-table-without-text-column",
        lambda fx, t: _prep(fx, t, corpus=_write(t / "t.csv", "a,b\n1,2\n")),
        ("t.csv: a table needs --text_column; the columns are ['a', 'b']",),
    ),
    (
        "prepare-tokenizer-config-not-an-object",
        lambda fx, t: _prep(
            fx, t, tokenizer=_bad_model(t, fx, lambda d: _write(d / "tokenizer_config.json", "[]"))
        ),
        ("tokenizer_config.json: expected a JSON object", "fix or delete the file"),
    ),
    # pretrain: damaged prepared data (found before the run directory is made)
    (
        "shards-index-truncated",
        lambda fx, t: _pt(_bad_data(t, fx, _cut("train-00000.idx")), t),
        ("train-00000: size differs from meta.json", "re-run bertforge prepare"),
    ),
    (
        "shards-index-overwritten",
        lambda fx, t: _pt(_bad_data(t, fx, _overwrite_idx), t),
        ("train-00000.idx: row 0", "does not describe a sequence", "re-run bertforge prepare"),
    ),
    (
        "shards-ids-outside-the-vocabulary",
        lambda fx, t: _pt(_bad_data(t, fx, _overwrite_ids), t),
        ("train-00000.ids: token id 65535 is outside the vocabulary", "re-run bertforge prepare"),
    ),
    (
        "meta-not-an-object",
        lambda fx, t: _pt(_bad_data(t, fx, lambda d: _write(d / "meta.json", "[]")), t),
        ("meta.json: expected a JSON object", "re-run bertforge prepare"),
    ),
    (
        "meta-missing-field",
        lambda fx, t: _pt(_bad_data(t, fx, _edit_json("meta.json", lambda m: m.pop("splits"))), t),
        ("meta.json: field 'splits' is missing", "re-run bertforge prepare"),
    ),
    (
        "meta-wrong-type",
        lambda fx, t: _pt(
            _bad_data(t, fx, _edit_json("meta.json", lambda m: m.update(max_seq_length="x"))), t
        ),
        ("field 'max_seq_length' is missing or not of type int",),
    ),
    (
        "meta-shard-outside-the-directory",
        lambda fx, t: _pt(
            _bad_data(
                t,
                fx,
                _edit_json(
                    "meta.json", lambda m: m["splits"]["train"]["shards"][0].update(name="../x")
                ),
            ),
            t,
        ),
        ("splits.train is missing or malformed",),
    ),
    # pretrain: options and YAML
    (
        "yaml-unknown-key",
        lambda fx, t: _pt(fx["data"], t, "--config", _write(t / "c.yaml", "train:\n  lrr: 1\n")),
        ("Group 'train' does not accept option 'lrr'", "c.yaml", "bertforge pretrain --help"),
    ),
    (
        "yaml-wrong-type",
        lambda fx, t: _pt(
            fx["data"], t, "--config", _write(t / "c.yaml", "train:\n  batch_size: lots\n")
        ),
        ("--train.batch_size takes an integer, not 'lots'", "c.yaml"),
    ),
    (
        "yaml-not-yaml",
        lambda fx, t: _pt(fx["data"], t, "--config", _write(t / "c.yaml", "train: [\n : :\n")),
        ("Problems parsing config", "c.yaml"),
    ),
    (
        "yaml-binary",
        lambda fx, t: _pt(fx["data"], t, "--config", _write(t / "c.yaml", bytes(range(256)))),
        ("can't decode byte", "c.yaml"),
    ),
    (
        "yaml-section-not-a-mapping",
        lambda fx, t: _pt(fx["data"], t, "--config", _write(t / "c.yaml", "model: 5\n")),
        ("a config section is not a mapping", "check the --config YAML"),
    ),
    (
        "pretrain-unknown-option",
        lambda fx, t: _pt(fx["data"], t, "--train.lrr", "1"),
        ("unknown option --train.lrr; did you mean --train.lr?",),
    ),
    (
        "pretrain-output-is-a-file",
        lambda fx, t: _blocked(t / "out", _pt(fx["data"], t)),
        ("out: a file is in the way",),
    ),
    *[
        (
            f"pretrain-{option}-{value}",
            lambda fx, t, o=option, v=value: _pt(fx["data"], t, o, v),
            (f"{option} {shown}",),
        )
        for option, value, shown in [
            ("--train.log_every", "0", "0 must be at least 1"),
            ("--train.eval_examples", "0", "0 must be at least 1"),
            ("--train.eps", "-1", "-1.0 must be at least 0"),
            ("--train.betas", "[2, 3]", "[2.0, 3.0]: two values in [0, 1)"),
            ("--masking.max_predictions", "0", "0 must be at least 1"),
            ("--masking.bucket_window", "-2", "-2 must be at least 0"),
        ]
    ],
    # pretrain --model.architecture modernbert: configs it cannot build
    *[
        (f"pretrain-modernbert-{name}", lambda fx, t, e=extra: _pt(fx["data"], t, *MODERN, *e), m)
        for name, extra, m in [
            (
                "window-past-the-context",
                ["--model.local_attention", "128"],
                ("local_attention=128 is larger than the context (max_position_embeddings=64)",),
            ),
            (
                "heads-do-not-divide-the-width",
                ["--model.num_attention_heads", "5"],
                ("hidden_size=32 is not divisible by num_attention_heads=5",),
            ),
            (
                "nsp",
                ["--train.objective", "mlm_nsp"],
                (
                    "--train.objective mlm_nsp: ModernBERT has no token types",
                    "use --train.objective mlm",
                ),
            ),
            ("bert-size", ["--model.preset", "small"], ("has no ModernBERT size",)),
            (
                "sine-positions",
                ["--train.position_init", "sinusoidal"],
                (
                    "--train.position_init sinusoidal: ModernBERT has rotary positions",
                    "drop it for --model.architecture modernbert",
                ),
            ),
            (
                "segment-table",
                ["--train.segment_init_std", "0.2"],
                ("--train.segment_init_std: ModernBERT has no token types",),
            ),
        ]
    ],
    (
        "pretrain-modernbert-from-a-bert-checkpoint",
        lambda fx, t: _pt(
            fx["data"], t, "--init_from", fx["mlm"], "--model.architecture", "modernbert"
        ),
        ("--model.architecture modernbert contradicts", "(model_type bert)"),
    ),
    # pretrain: resuming from a damaged checkpoint
    (
        "resume-state-json-not-json",
        _resume_damaged(lambda c: _write(c / "train_state.json", "{x")),
        ("damaged checkpoint", "delete this directory to resume from the one before it"),
    ),
    (
        "resume-state-json-without-step",
        _resume_damaged(_edit_json("train_state.json", lambda s: s.pop("step"))),
        ("damaged checkpoint (train_state.json lacks step)",),
    ),
    (
        "resume-state-pt-truncated",
        _resume_damaged(_cut("train_state.pt")),
        ("damaged checkpoint (PytorchStreamReader failed reading zip archive",),
    ),
    # model directories with a hand-edited or mismatched config.json / tokenizer
    *[
        (
            f"config-{field}-{value!r}",
            lambda fx, t, f=field, v=value: _fm(
                _bad_model(t, fx, _edit_json("config.json", lambda c: c.update({f: v})))
            ),
            (message, "config.json"),
        )
        for field, value, message in [
            ("hidden_size", "big", "hidden_size='big' is not of type int"),
            ("num_hidden_layers", 1.5, "num_hidden_layers=1.5 is not of type int"),
            ("layer_norm_eps", "x", "layer_norm_eps='x' is not of type float"),
            ("id2label", ["a", "b"], "id2label=['a', 'b'] is not of type dict"),
            ("id2label", {"x": "a"}, "id2label keys must be class ids"),
        ]
    ],
    (
        "config-no-labels",
        lambda fx, t: [
            "classify",
            "--model",
            _bad_model(
                t, fx, _edit_json("config.json", lambda c: c.update(id2label={})), kind="clf"
            ),
            "good",
        ],
        ("config.json: BertConfig.num_labels=0 must be positive",),
    ),
    (
        "config-dropout-out-of-range",
        lambda fx, t: _fm(
            _bad_model(t, fx, _edit_json("config.json", lambda c: c.update(hidden_dropout_prob=2)))
        ),
        ("hidden_dropout_prob=2 must lie in [0, 1]",),
    ),
    (
        "fill-mask-tokenizer-bigger-than-the-model",
        lambda fx, t: _fm(_bad_model(t, fx, _bigger_tokenizer)),
        ("the tokenizer has 133 tokens but the model's vocab_size is 120", "own tokenizer files"),
    ),
    (
        "finetune-tokenizer-bigger-than-the-model",
        lambda fx, t: _ft(fx, t, model=_bad_model(t, fx, _bigger_tokenizer)),
        ("the tokenizer has 133 tokens but the model's vocab_size is 120",),
    ),
    # inference commands
    (
        "fill-mask-batch-size-0",
        lambda fx, t: _fm(fx["mlm"], "--batch_size", "0"),
        ("--batch_size 0 must be at least 1", "bertforge fill-mask --help"),
    ),
    (
        "fill-mask-output-is-a-directory",
        lambda fx, t: _fm(fx["mlm"], "--output", _dir(t / "o")),
        ("o: is a directory; give a file name",),
    ),
    (
        "classify-binary-input",
        lambda fx, t: (
            ["classify", "--model", fx["clf"], "--input"] + [_write(t / "b.txt", bytes(range(256)))]
        ),
        ("b.txt:2: not UTF-8 text", "--encoding_errors replace"),
    ),
    (
        "classify-finetune-config-not-json",
        lambda fx, t: [
            "classify",
            "--model",
            _bad_model(t, fx, lambda d: _write(d / "finetune_config.json", "{x"), kind="clf"),
            "good",
        ],
        ("finetune_config.json: not valid JSON", "restore it or delete it"),
    ),
    (
        "classify-finetune-config-not-an-object",
        lambda fx, t: [
            "classify",
            "--model",
            _bad_model(t, fx, lambda d: _write(d / "finetune_config.json", "[]"), kind="clf"),
            "good",
        ],
        ("finetune_config.json: expected a JSON object",),
    ),
    (
        "evaluate-mlm-max-length-2",
        lambda fx, t: (
            ["evaluate", "--model", fx["mlm"], "--data", _write(t / "c.txt", "a b\n")]
            + ["--max_length", "2"]
        ),
        ("--max_length 2: must be at least 8",),
    ),
    (
        "evaluate-max-sequences-0",
        lambda fx, t: (
            ["evaluate", "--model", fx["mlm"], "--data", _write(t / "c.txt", "a b\n")]
            + ["--max_sequences", "0"]
        ),
        ("--max_sequences 0 must be at least 1",),
    ),
    (
        "evaluate-plot-is-a-directory",
        lambda fx, t: (
            ["evaluate", "--model", fx["clf"], "--data", fx["train"], "--plot"]
            + [_dir(t / "p.png")]
        ),
        ("p.png: is a directory",),
    ),
    # reranking
    (
        "evaluate-retriever-without-beir-files",
        lambda fx, t: [
            "evaluate",
            "--model",
            fx["clf"],
            "--retriever",
            fx["mlm"],
            "--data",
            fx["train"],
        ],
        ("--retriever reranks the first stage of a retrieval test set: give --queries",),
    ),
    (
        "evaluate-retriever-is-a-classifier",
        lambda fx, t: [
            *("evaluate", "--model", fx["clf"], "--retriever", fx["clf"]),
            *("--queries", _write(t / "q.jsonl", '{"_id": "q", "text": "a"}\n')),
            *("--corpus", _write(t / "c.jsonl", '{"_id": "d", "text": "b"}\n')),
            *("--qrels", _write(t / "r.tsv", "query-id\tcorpus-id\tscore\nq\td\t1\n")),
        ],
        ("is not a sentence-embedding model (BertForSequenceClassification)",),
    ),
    (
        "rerank-with-a-token-classifier",
        lambda fx, t: ["rerank", "--model", fx["tagger"], "--query", "who", "anna went home"],
        ("a BertForTokenClassification is no reranker",),
    ),
    (
        "rerank-without-candidates",
        lambda fx, t: ["rerank", "--model", fx["clf"], "--query", "who"],
        ("give candidate texts as arguments or --input FILE",),
    ),
    # token classification
    (
        "tag-with-a-sequence-classifier",
        lambda fx, t: ["tag", "--model", fx["clf"], "anna went home"],
        (
            "a text classifier (BertForSequenceClassification), not the kind of model this command runs; use bertforge classify",
            "--task token_classification",
        ),
    ),
    (
        "tag-conll-input-without-sentences",
        lambda fx, t: ["tag", "--model", fx["tagger"], "--input", _write(t / "x.conll", "\n\n")],
        ("x.conll: holds no sentence",),
    ),
    (
        "evaluate-tagger-on-an-unknown-tag",
        lambda fx, t: (
            ["evaluate", "--model", fx["tagger"], "--data"]
            + [_write(t / "d.conll", "anna B-PER\nin O\nrome B-LOC\n")]
        ),
        ("d.conll:3: tag 'B-LOC' is not among the model's tags (O, B-PER, I-PER)",),
    ),
    (
        "finetune-tags-not-iob",
        lambda fx, t: (
            ["finetune", "--model", fx["mlm"], "--train", _write(t / "n.conll", "anna PER\n")]
            + ["--output", t / "out", "--task", "token_classification", *FAST_FINETUNE]
        ),
        ("n.conll:1: tag 'PER' is not IOB; write O, B-TYPE or I-TYPE",),
    ),
    *[
        (
            f"finetune-embedding-{name}",
            lambda fx, t, f=file, c=content, o=options: (
                ["finetune", "--model", fx["mlm"], "--train", _write(t / f, c), "--output"]
                + [t / "out", "--task", "embedding", "--text_pair_column", "b", *o]
                + ["--text_column", "a", *FAST_FINETUNE]
            ),
            expected,
        )
        for name, file, content, options, expected in [
            ("empty-side", "p.csv", "a,b\nx,y\nz,\n", [], ("p.csv:3: empty text in column 'b'",)),
            (
                "score-is-text",
                "p.tsv",
                "a\tb\ts\nx\ty\t4\nz\tw\thigh\n",
                ["--label_column", "s"],
                ("p.tsv:3: column 's' holds 'high', not a number",),
            ),
            (
                "negative-missing",
                "p.jsonl",
                '{"a":"x","b":"y","n":"u"}\n{"a":"z","b":"w"}\n',
                ["--negative_column", "n"],
                ("p.jsonl:2: no 'n' in this row",),
            ),
        ]
    ],  # fmt: skip
    (
        "finetune-train-folder-no-dataset",
        lambda fx, t: [*_ft(fx, t), "--train", _write(t / "folder" / "notes.md", "x").parent],
        ("folder: not a data set folder (no state.json", "pass such a folder or the files"),
    ),
    (
        "finetune-train-dataset-state-lists-a-lost-file",
        lambda fx, t: [
            *_ft(fx, t),
            "--train",
            _write(t / "ds" / "state.json", '{"_data_files": [{"filename": "data.arrow"}]}').parent,
        ],
        ("ds: state.json lists data.arrow, which the folder lacks", "copy the whole folder"),
    ),
    # finetune options
    (
        "finetune-lr-0",
        lambda fx, t: _ft(fx, t, "--lr", "0"),
        ("--lr 0.0 must be positive, e.g. 1e-4",),
    ),
    (
        "finetune-output-is-a-file",
        lambda fx, t: _blocked(t / "out", _ft(fx, t)),
        ("out: a file is in the way",),
    ),
    *[
        (
            f"finetune{option}-{value}",
            lambda fx, t, o=option, v=value: _ft(fx, t, o, v),
            (f"{option} {value} must be at least",),
        )
        for option, value in [("--max_steps", "0"), ("--log_every", "0"), ("--patience", "-1")]
    ],
    (
        "finetune-epochs-negative-named-alone",
        lambda fx, t: _ft(fx, t, "--epochs", "-1"),
        ("--epochs -1.0 must be positive",),
    ),
    (
        "finetune-max-memory-1KB-not-0-MB",
        lambda fx, t: _ft(fx, t, "--max_memory", "1KB"),
        ("--max_memory 1 KB is below this run's estimated need",),
    ),
    # choices in the user's words: an optional Literal and a boolean, as --task's own message
    (
        "embed-pooling-not-a-choice",
        lambda fx, t: (
            ["embed", "--model", fx["mlm"], "--input", _write(t / "in.txt", "a film\n")]
            + ["--output", t / "o.npy", "--pooling", "foo"]
        ),
        ("bertforge embed: --pooling takes one of cls, mean, max, mean_sqrt_len, not 'foo';",),
    ),
    (
        "finetune-pooling-not-a-choice",
        lambda fx, t: _ft(fx, t, "--task", "embedding", "--pooling", "avg"),
        ("--pooling takes one of cls, mean, max, mean_sqrt_len, not 'avg'",),
    ),
    (
        "evaluate-truncation-not-a-choice",
        lambda fx, t: [
            "evaluate",
            "--model",
            fx["clf"],
            "--data",
            fx["train"],
            "--truncation",
            "middle",
        ],
        ("bertforge evaluate: --truncation takes one of head, head_tail, tail, not 'middle';",),
    ),
    (
        "finetune-compile-not-a-boolean",
        lambda fx, t: _ft(fx, t, "--compile", "maybe"),
        ("bertforge finetune: --compile takes true or false, not 'maybe';",),
    ),
    # small messages that misled
    (
        "tokenizer-input-is-a-folder",
        lambda fx, t: (
            ["tokenizer", "train", "--input", _dir(t / "texts"), "--vocab_size", "60"]
            + ["--output", t / "out"]
        ),
        ("texts: a folder, not a text file", "/texts/*.txt"),
    ),
    (
        "prepare-utf16-table",
        lambda fx, t: _prep(
            fx,
            t,
            "--text_column",
            "text",
            corpus=_write(t / "u.csv", "text\nhi\n".encode("utf-16")),
        ),
        ("u.csv:1: UTF-16 text", "iconv -f utf-16 -t utf-8"),
    ),
    # an option another task reads is refused naming that task, not ignored
    *[
        (
            f"finetune-{option.strip('-')}-of-another-task",
            lambda fx, t, o=option, v=value: _ft(fx, t, "--task", "classification", o, *v),
            (
                f"{option} {' '.join(value)} is an option of --task {task}, not of --task "
                "classification; drop it",
            ),
        )
        for option, value, task in [
            ("--loss", ["cosent"], "embedding"),
            ("--matryoshka_dims", ["64", "32"], "embedding"),
            ("--doc_stride", ["64"], "question_answering"),
            ("--label_all_tokens", ["true"], "token_classification"),
            ("--normalize_targets", ["false"], "regression"),
        ]
    ],  # fmt: skip
    # a bare number of a budget: three seconds to the parser, three minutes to the user
    (
        "finetune-max_time-bare-number",
        lambda fx, t: _ft(fx, t, "--max_time", "3"),
        ("--max_time 3: a bare number; give its unit: 3s, 3m or 3h (0 or none: no limit)",),
    ),
    (
        "pretrain-max_time-bare-number",
        lambda fx, t: [
            "pretrain",
            "--data",
            fx["data"],
            "--output",
            t / "run",
            *TINY_PRETRAIN,
            "--train.max_time",
            "3",
        ],  # fmt: skip
        ("--train.max_time 3: a bare number; give its unit: 3s, 3m or 3h",),
    ),
    (
        "recipe-budget-bare-number",
        lambda fx, t: ["recipe", "general", "--budget", "30", "--output", t / "r"],
        ("--budget 30: a bare number; give its unit: 30s, 30m or 30h",),
    ),
    # a test label the training file lacks: refused before any column is fine-tuned
    (
        "downstream-test-label-not-in-train",
        lambda fx, t: [
            "downstream",
            "--model",
            fx["mlm"],
            "--train",
            fx["train"],
            "--test",
            _write(t / "test.csv", "text,label\na good film .,pos\nso so .,neutral\n"),
            "--output",
            t / "out",
            *FAST_FINETUNE,
        ],  # fmt: skip
        ("test.csv:3 has label 'neutral'", "(its labels: 'neg', 'pos')", "train with this label"),
    ),
]


@pytest.mark.parametrize(("build", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gives_one_line_and_leaves_nothing(fx, tmp_path, capsys, build, expected):
    argv = [str(a) for a in build(fx, tmp_path)]
    before = _files(tmp_path)
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for part in expected:
        assert part in lines[0], lines[0]
    assert _files(tmp_path) == before  # no output, no temporary file or directory


# ---- --max_length 0 and a missing --model, in every command --------------------------------------


def test_max_length_zero_is_refused_by_every_command(pair_run, mlm_dir, tmp_path, capsys):
    out, train = str(pair_run["out"]), str(pair_run["root"] / "train.csv")
    text = tmp_path / "in.txt"
    text.write_text("the film\n")
    commands = {
        "classify": ["classify", "--model", out, "--input", train],
        "evaluate": ["evaluate", "--model", out, "--data", train],
        "evaluate-mlm": ["evaluate", "--model", str(mlm_dir), "--data", str(text)],
        "embed": [
            "embed",
            "--model",
            out,
            "--input",
            str(text),
            "--output",
            str(tmp_path / "v.npy"),
        ],
        "finetune": [
            *pair_run["argv"][:5],
            "--output",
            str(tmp_path / "ft"),
            "--progress",
            "false",
        ],
    }
    for name, argv in commands.items():
        code, _, err = run_cli([*argv, "--max_length", "0"], capsys)
        assert code == 2, name
        assert "--max_length 0: must be at least" in err, (name, err)


MODEL_COMMANDS = [
    ["embed", "--input", "x.txt", "--output", "v.npy"],
    ["embed", "--input", "x.txt", "--output", "v.npy", "--backend", "onnx"],
    ["classify", "some text"],
    ["classify", "some text", "--backend", "onnx"],
    ["fill-mask", "a [MASK] ."],
    ["tag", "some text"],
    ["tag", "--input", "x.txt", "--backend", "onnx"],
    ["evaluate", "--data", "x.txt"],
    ["finetune", "--train", "x.csv", "--output", "out"],
    ["export", "--format", "onnx", "--output", "out"],
]
"""Every command that loads a --model (in a directory holding x.txt and x.csv)."""


def _command_id(command: list[str]) -> str:
    return f"{command[0]}-onnx" if "onnx" in command[1:] else command[0]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=_command_id)
def test_one_message_for_a_missing_model_and_for_a_hub_id(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.txt").write_text("a text\n")
    TaskFiles.write_rows(tmp_path / "x.csv", [{"text": "a", "label": "b"}] * 4)
    code, _, err = run_cli([*command, "--model", "nope/"], capsys)
    assert code == 2 and "error: nope: no such model directory" in err, err
    # a Hub id of a model that is not installed (all-MiniLM-L6-v2 names the installed copy)
    code, _, err = run_cli([*command, "--model", "google/bert_uncased_L-2_H-128_A-2"], capsys)
    assert code == 2
    assert (
        "looks like a Hugging Face Hub id" in err
        and "a local directory is needed (no downloads)" in err
    )
    assert "--local-dir" in err


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=_command_id)
def test_a_missing_local_model_and_a_training_run_are_named_as_such(
    command, tiny_config, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.txt").write_text("a text\n")
    TaskFiles.write_rows(tmp_path / "x.csv", [{"text": "a", "label": "b"}] * 4)
    (tmp_path / "runs" / "pretrain").mkdir(parents=True)
    # a path under a local directory is a typo or a run not made yet, not a Hub id to download
    for model in ("runs/nosuchmodel", "./nosuchmodel"):
        code, _, err = run_cli([*command, "--model", model], capsys)
        assert code == 2 and f"error: {model}: no such model directory" in err, err
        assert "Hub" not in err and "huggingface-cli" not in err
    code, _, err = run_cli([*command, "--model", "runs/pretrian"], capsys)
    assert code == 2 and "no such model directory; did you mean runs/pretrain?" in err, err
    # a pretraining run keeps its model in model/: say so instead of "no config.json"
    tiny_config.save(tmp_path / "runs" / "pretrain" / "model")
    code, _, err = run_cli([*command, "--model", "runs/pretrain"], capsys)
    assert code == 2, err
    assert (
        "error: runs/pretrain: a training run, not a model directory; its model is "
        "runs/pretrain/model" in err
    )


# ---- bytes that are not UTF-8, in every command that reads text ---------------------------------


def test_bytes_that_are_not_utf8_get_one_message_everywhere(classifier, tmp_path, capsys):
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"text,second,label\na film,good one,1\nun caf\xe9,bad,0\n")
    expected = f"{latin}:3: not UTF-8 text (b'\\xe9,ba' at character 7); convert the file"
    for argv in (
        ["classify", "--model", str(classifier), "--input", str(latin)],
        ["evaluate", "--model", str(classifier), "--data", str(latin)],
        ["tokenizer", "train", "--input", str(latin), "--text_column", "text"]
        + ["--vocab_size", "100", "--output", str(tmp_path / "tok")],
        ["prepare", "--input", str(latin), "--text_column", "text", "--tokenizer"]
        + [str(classifier), "--output", str(tmp_path / "data")],
        ["finetune", "--model", str(classifier), "--train", str(latin)]
        + ["--output", str(tmp_path / "ft")],
    ):
        err = one_line_error(argv, capsys)
        assert expected in err and "--encoding_errors replace" in err, argv
    argv = ["classify", "--model", str(classifier), "--input", str(latin)]
    assert cli.main([*argv, "--encoding_errors", "replace", "--progress", "false"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.fixture(scope="module")
def heads(start, tmp_path_factory) -> dict[str, Path]:
    """A tagger, a question answerer and a classifier (untrained heads on the tiny start model)."""
    root = tmp_path_factory.mktemp("heads")
    tokenizer = Tokenizer.from_file(start)
    tagger = root / "tagger"
    BertForTokenClassification.from_pretrained(
        start, num_labels=3, id2label={0: "O", 1: "B-PER", 2: "I-PER"}
    ).save_pretrained(tagger, tokenizer=tokenizer)
    qa = root / "qa"
    BertForQuestionAnswering.from_pretrained(start).save_pretrained(qa, tokenizer=tokenizer)
    classifier = root / "classifier"
    BertForSequenceClassification.from_pretrained(
        start, num_labels=3, id2label={0: "a", 1: "b", 2: "c"}
    ).save_pretrained(classifier, tokenizer=tokenizer)
    return {"tagger": tagger, "qa": qa, "classifier": classifier}


def test_qa_and_tagging_readers_give_the_one_utf8_message(start, heads, tmp_path, capsys):
    # a PDF renamed doc.json: the second line is not UTF-8
    pdf = _write(tmp_path / "doc.json", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n")
    conll = _write(tmp_path / "ner.conll", b"Paris B-LOC\nest O\n\ncaf\xe9 O\n")
    lines = _write(tmp_path / "texts.txt", b"Paris is nice\nun caf\xe9 ici\n")
    for argv, line in (
        (["finetune", "--model", str(start), "--task", "question_answering"], pdf),
        (["finetune", "--model", str(start), "--task", "token_classification"], conll),
    ):
        err = one_line_error([*argv, "--train", str(line), "--output", str(tmp_path / "o")], capsys)
        number = 2 if line == pdf else 4
        assert f"{line}:{number}: not UTF-8 text" in err and "--encoding_errors replace" in err
    out = tmp_path / "p.json"
    err = one_line_error(["answer", "--model", str(heads["qa"]), "--input", str(pdf), "--output",
                          str(out)], capsys)  # fmt: skip
    assert f"{pdf}:2: not UTF-8 text" in err and "--encoding_errors replace" in err
    for path, number in ((lines, 2), (conll, 4)):
        err = one_line_error(["tag", "--model", str(heads["tagger"]), "--input", str(path)], capsys)
        assert f"{path}:{number}: not UTF-8 text" in err and "--encoding_errors replace" in err


def test_tag_encoding_errors_replace_reads_latin1(heads, tmp_path, capsys):
    lines = _write(tmp_path / "texts.txt", b"Paris is nice\nun caf\xe9 ici\n")
    conll = _write(tmp_path / "ner.conll", b"Paris O\n\ncaf\xe9 O\n")
    for path in (lines, conll):
        argv = ["tag", "--model", str(heads["tagger"]), "--input", str(path)]
        code, out, err = run_cli([*argv, "--encoding_errors", "replace"], capsys)
        assert code == 0, err
        texts = [json.loads(line)["text"] for line in out.splitlines()]
        assert texts[-1].startswith("un caf\ufffd") or texts[-1] == "caf\ufffd", texts


def test_qa_reader_opens_bz2_and_xz(tmp_path):
    import bz2
    import lzma

    from bertforge.data.qa import read_qa

    row = {"id": "1", "question": "Who?", "context": "Ada wrote.",
           "answers": {"text": ["Ada"], "answer_start": [0]}}  # fmt: skip
    text = (json.dumps(row) + "\n").encode()
    for name, pack in (("q.jsonl.bz2", bz2.compress), ("q.jsonl.xz", lzma.compress)):
        examples, _ = read_qa(_write(tmp_path / name, pack(text)))
        assert [e.answers for e in examples] == [["Ada"]]


def test_a_model_of_another_task_names_its_task_and_command(heads, capsys):
    err = one_line_error(["tag", "--model", str(heads["qa"]), "Paris"], capsys)
    assert "a question-answering model (BertForQuestionAnswering)" in err, err
    assert "bertforge answer" in err and "no classifier weights" not in err
    argv = ["answer", "--model", str(heads["tagger"]), "--question", "q", "--context", "c"]
    err = one_line_error(argv, capsys)
    assert "a token classifier (BertForTokenClassification)" in err and "bertforge tag" in err
    # a sentence classifier's head has the shape of a tagger's: refused by its task, not loaded
    err = one_line_error(["tag", "--model", str(heads["classifier"]), "Paris"], capsys)
    assert "a text classifier (BertForSequenceClassification)" in err and "classify" in err
