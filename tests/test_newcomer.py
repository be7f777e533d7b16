"""What a first-time user trips on (issue 17): each test below failed before its fix.

Silent wrong results first: the pooling a sentence-transformers model declares, typos in
labelled data, a model that learned nothing, API and CLI defaults, pair models, fill-mask
around [UNK], one rule for --max_length 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FILLER, TaskFiles

import bertforge
from bertforge import cli
from bertforge.data import tasks
from bertforge.data.corpus import read_documents
from bertforge.errors import BertforgeError
from bertforge.evaluation import plots
from bertforge.evaluation.mlm import comparison_table, evaluate_mlm
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)
from bertforge.progress import MetricsLogger, read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory) -> Path:
    return tiny_start_model(tmp_path_factory.mktemp("newcomer"), kind="mlm")


tiny_start_model, write_rows = TaskFiles.tiny_start_model, TaskFiles.write_rows


def _filler(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(n)) + " ."


@pytest.fixture(scope="module")
def pair_run(mlm_dir, tmp_path_factory) -> dict:
    """A real (tiny) fine-tune of a *pair* task whose labels are 3 and 4 only (like the first
    400 AG News rows), 80 % label 4, texts without signal, --max_length 12: the model cannot
    beat the majority baseline and must say so."""
    root = tmp_path_factory.mktemp("pair_run")
    rng = random.Random(0)
    rows = [
        {"title": _filler(rng), "body": _filler(rng, 20), "label": 4 if i % 5 else 3}
        for i in range(60)
    ]
    write_rows(root / "train.csv", rows)
    out = root / "model"
    argv = [
        *("finetune", "--model", str(mlm_dir), "--train", str(root / "train.csv")),
        *("--output", str(out), "--text_column", "title", "--text_pair_column", "body"),
        *("--max_length", "12", "--batch_size", "8", "--max_steps", "3"),
        *("--precision", "fp32", "--validation_fraction", "0.25"),
    ]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return {"root": root, "out": out, "argv": argv, "rows": rows, "err": err.getvalue()}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- embed: the pooling the model declares ------------------------------------------------------


def test_embed_uses_the_pooling_and_normalisation_a_sentence_transformers_model_declares(
    minilm_dir, mlm_dir, tmp_path, capsys
):
    texts = ["A man is eating food.", "The new movie is awesome.", "hi"]
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n")
    model, tok = BertModel.from_pretrained(minilm_dir), Tokenizer.from_file(minilm_dir)
    mean = bertforge.embed(model, tok, texts, pooling="mean", normalize=True)
    cls = bertforge.embed(model, tok, texts, pooling="cls", normalize=True)
    # the Python API defaults to what 1_Pooling/config.json and modules.json declare
    np.testing.assert_allclose(bertforge.embed(model, tok, texts), mean, atol=1e-6)

    out = tmp_path / "v.npy"
    # fp32 like the API: `auto` is bf16 on a CPU with AVX512-BF16/AMX, ~1e-3 from fp32
    base = ["embed", "--model", str(minilm_dir), "--input", str(inputs), "--output", str(out)]
    base += ["--precision", "fp32"]
    code, _, err = _run(base, capsys)
    assert code == 0
    np.testing.assert_allclose(np.load(out), mean, atol=1e-6)
    assert "mean pooling (declared in 1_Pooling/config.json)" in err
    assert "normalized (2_Normalize in modules.json)" in err

    code, _, err = _run([*base, "--pooling", "cls"], capsys)
    assert code == 0 and "cls pooling (--pooling)" in err
    np.testing.assert_allclose(np.load(out), cls, atol=1e-6)
    code, _, err = _run([*base, "--pooling", "cls", "--normalize", "false"], capsys)
    assert code == 0 and "not normalized (--normalize false)" in err
    assert not np.allclose(np.linalg.norm(np.load(out), axis=1), 1.0)

    # a model that declares nothing keeps the documented default (cls, not normalized)
    code, _, err = _run(
        ["embed", "--model", str(mlm_dir), "--input", str(inputs), "--output", str(out)], capsys
    )
    assert code == 0 and "cls pooling (the default: the model declares none" in err


# ---- labelled data: typos -------------------------------------------------------------------------


def _labelled(tmp_path: Path, extra: list[dict]) -> Path:
    rows = [{"text": f"text {i}", "label": 1 + i % 4} for i in range(40)]
    rows[11:11] = extra
    path = tmp_path / "train.csv"
    write_rows(path, rows)
    return path


def test_a_label_typo_is_reported_with_its_count_and_rows_unless_accepted(tmp_path):
    path = _labelled(tmp_path, [{"text": "a typo", "label": "x"}])
    columns = dict(text_column="text", label_column="label")
    with pytest.raises(BertforgeError) as err:
        tasks.load_labelled(path, **columns)
    message = str(err.value)
    assert "'x' (1 row: line 13)" in message and "--allow_rare_labels" in message
    data, id2label = tasks.load_labelled(path, **columns, allow_rare_labels=True)
    assert list(id2label.values()) == ["1", "2", "3", "4", "x"] and len(data) == 41


def test_ragged_rows_and_broken_quoting_name_the_file_and_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\ngood film,1\nbad film\nok,2\n")
    with pytest.raises(BertforgeError, match=r"ragged.csv:3: 1 field where the header has 2"):
        tasks.load_labelled(path, text_column="text", label_column="label")
    path.write_text("text,label\ngood film,1\nbad film,2,3\nok,2\n")
    with pytest.raises(BertforgeError, match=r"ragged.csv:3: 3 fields where the header has 2"):
        tasks.load_labelled(path, text_column="text", label_column="label")
    path = tmp_path / "quote.csv"
    path.write_text('text,label\ngood film,1\n"bad film,2\nok,2\nfine,1\n')
    with pytest.raises(BertforgeError, match=r"quote.csv:3: a quoted field opened here"):
        tasks.load_labelled(path, text_column="text", label_column="label")
    path = tmp_path / "missing.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n')
    with pytest.raises(BertforgeError, match=r"missing.jsonl:2: no 'label'"):
        tasks.load_labelled(path, text_column="text", label_column="label")


# ---- a model that learned nothing -------------------------------------------------------------


def test_finetune_prints_the_baseline_and_warns_when_the_model_does_not_beat_it(pair_run, capsys):
    err = pair_run["err"]
    # the training split holds 2 classes, labelled 3 and 4: 1 and 2 are probably missing
    assert "warning: the training data holds 2 classes (3, 4)" in err
    # every validation line carries the baseline: always the training split's majority class
    assert "baseline 0.8000" in err.split("step 3: val")[1].splitlines()[0]
    assert "warning: accuracy" in err and "does not beat the baseline 0.8000" in err
    assert "always '4', the most frequent class of the training split" in err
    # 3 steps with --log_every 10: the last step is still logged, so curves.png has points
    assert [r["step"] for r in read_metrics(pair_run["out"]) if r["split"] == "train"] == [3]
    result = json.loads((pair_run["out"] / "eval_results.json").read_text())
    assert result["baseline"]["predicts"] == "4"
    assert result["baseline"]["definition"] == "the most frequent class of the training split"


def test_evaluate_uses_the_same_baseline_definition_as_finetune(pair_run, tmp_path, capsys):
    # an evaluation file whose own majority (3) differs from the training majority (4)
    rows = [{"title": "the film", "body": "a story", "label": 3 if i % 4 else 4} for i in range(8)]
    write_rows(tmp_path / "eval.csv", rows)
    capsys.readouterr()
    code, out, err = _run(
        ["evaluate", "--model", str(pair_run["out"]), "--data", str(tmp_path / "eval.csv")], capsys
    )
    assert code == 0, err
    assert "baseline (always '4', the most frequent class of the training split)" in out


# ---- API and CLI agree ----------------------------------------------------------------------------


def test_classify_api_and_cli_use_the_saved_max_length_and_demand_pairs(pair_run, tmp_path, capsys):
    out = pair_run["out"]
    model, tok = BertForSequenceClassification.from_pretrained(out), Tokenizer.from_file(out)
    title, body = "the movie was a film with some actors", "and a plot about people " * 5
    api = bertforge.classify(model, tok, [title], [body])[0]
    assert api == bertforge.classify(model, tok, [title], [body], max_length=12)[0]
    assert api != bertforge.classify(model, tok, [title], [body], max_length=64)[0]
    table = tmp_path / "in.csv"
    write_rows(table, [{"title": title, "body": body}])
    # fp32 like the API (`auto` is bf16 on a CPU with AVX512-BF16/AMX)
    argv = ["classify", "--model", str(out), "--input", str(table), "--precision", "fp32"]
    code, printed, err = _run(argv, capsys)
    assert code == 0, err
    assert json.loads(printed)["scores"] == pytest.approx(api["scores"], abs=1e-6)

    # positional texts (no pair) on a pair model: say what it expects
    with pytest.raises(BertforgeError, match="fine-tuned on text pairs"):
        bertforge.classify(model, tok, [title])
    code, _, err = _run(["classify", "--model", str(out), title], capsys)
    assert code == 2 and "fine-tuned on text pairs ('title' + 'body')" in err
    text = tmp_path / "in.txt"
    text.write_text(title + "\n")
    code, _, err = _run(["classify", "--model", str(out), "--input", str(text)], capsys)
    assert code == 2 and "--text_pair_column" not in err
    assert "a .csv, .tsv or .jsonl file with columns 'title' and 'body'" in err


# ---- fill-mask keeps the text around the prediction -------------------------------------------


def test_fill_mask_fills_the_input_text_and_keeps_unknown_words(mlm_dir):
    model, tok = BertForMaskedLM.from_pretrained(mlm_dir), Tokenizer.from_file(mlm_dir)
    text = "The [MASK] was in 1990 ."
    assert tok.unk_id in tok.backend.encode(text).ids  # 1990 is not in the tiny vocabulary
    result = bertforge.fill_mask(model, tok, [text, "a [MASK] [MASK]  story"])
    top = result[0]["masks"][0][0]["token"].removeprefix("##")
    assert result[0]["filled"] == f"The {top} was in 1990 ."
    first, second = (m[0]["token"].removeprefix("##") for m in result[1]["masks"])
    assert result[1]["filled"] == f"a {first} {second}  story"


def test_wikitext_unk_becomes_one_unk_token(tmp_path, mlm_dir):

    wiki = tmp_path / "wiki.valid.tokens"
    wiki.write_text(" = Title = \n\n The <unk> was in 1990 and <unk> @-@ like . \n")
    docs = list(read_documents(wiki))
    assert docs == [["The [UNK] was in 1990 and [UNK]-like ."]]
    tok = Tokenizer.from_file(mlm_dir)
    ids = tok.backend.encode(docs[0][0], add_special_tokens=False).ids
    assert ids.count(tok.unk_id) >= 2 and "unk" not in tok.decode(ids)


# ---- one rule for --max_length 0 ------------------------------------------------------------------


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
        code, _, err = _run([*argv, "--max_length", "0"], capsys)
        assert code == 2, name
        assert "--max_length 0: must be at least" in err, (name, err)


# ---- silence and clutter ------------------------------------------------------------------------


class _Terminal:
    """A stand-in for a terminal on stderr: what a progress bar draws lands in ``text``."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    @property
    def text(self) -> str:
        return "".join(self.parts)


def test_long_commands_draw_a_progress_bar_on_a_terminal_unless_told_not_to(
    pair_run, mlm_dir, tmp_path, monkeypatch, capsys
):
    out, train = str(pair_run["out"]), str(pair_run["root"] / "train.csv")
    text = tmp_path / "in.txt"
    text.write_text("the film was good .\na story about people .\n" * 20)
    result = tmp_path / "rows.jsonl"
    commands = {
        "classify": ["classify", "--model", out, "--input", train, "--output", str(result)],
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
        "fill-mask": ["fill-mask", "--model", str(mlm_dir), "a [MASK] ."],
    }
    for name, argv in commands.items():
        terminal = _Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        assert cli.main(argv) == 0, name
        assert "100%" in terminal.text, (name, terminal.text)
        terminal = _Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        assert cli.main([*argv, "--progress", "false"]) == 0, name
        assert "%|" not in terminal.text, (name, terminal.text)
    monkeypatch.undo()
    capsys.readouterr()
    # not a terminal (a log file, CI): no bar, but the file written is named with its size
    assert cli.main(commands["classify"]) == 0
    err = capsys.readouterr().err
    assert "%|" not in err and f"wrote 60 rows to {result}" in err


def test_a_finished_finetune_drops_its_checkpoint_and_prints_sizes(pair_run, capsys):
    out, err = pair_run["out"], pair_run["err"]
    assert not list(out.glob("checkpoint-*"))
    assert "removed the finished run's resumable checkpoint" in err
    assert "--keep_final_checkpoint" in err
    assert f"{out}: " in err and " MB" in err  # the output's size on disk
    code, _, err = _run(
        [*pair_run["argv"], "--output", str(out.parent / "kept"), "--keep_final_checkpoint"], capsys
    )
    assert code == 0 and len(list((out.parent / "kept").glob("checkpoint-*"))) == 1


def test_version_flag(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bertforge {bertforge.__version__}"


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
    write_rows(tmp_path / "x.csv", [{"text": "a", "label": "b"}] * 4)
    code, _, err = _run([*command, "--model", "nope/"], capsys)
    assert code == 2 and "error: nope: no such model directory" in err, err
    code, _, err = _run([*command, "--model", "sentence-transformers/all-MiniLM-L6-v2"], capsys)
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
    write_rows(tmp_path / "x.csv", [{"text": "a", "label": "b"}] * 4)
    (tmp_path / "runs" / "pretrain").mkdir(parents=True)
    # a path under a local directory is a typo or a run not made yet, not a Hub id to download
    for model in ("runs/nosuchmodel", "./nosuchmodel"):
        code, _, err = _run([*command, "--model", model], capsys)
        assert code == 2 and f"error: {model}: no such model directory" in err, err
        assert "Hub" not in err and "huggingface-cli" not in err
    code, _, err = _run([*command, "--model", "runs/pretrian"], capsys)
    assert code == 2 and "no such model directory; did you mean runs/pretrain?" in err, err
    # a pretraining run keeps its model in model/: say so instead of "no config.json"
    tiny_config.save(tmp_path / "runs" / "pretrain" / "model")
    code, _, err = _run([*command, "--model", "runs/pretrain"], capsys)
    assert code == 2, err
    assert (
        "error: runs/pretrain: a training run, not a model directory; its model is "
        "runs/pretrain/model" in err
    )


def test_evaluate_accepts_the_encoding_errors_it_suggests(mlm_dir, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the film was good .\nthe \xff story about people .\n" * 4)
    code, _, err = _run(["evaluate", "--model", str(mlm_dir), "--data", str(bad)], capsys)
    assert code == 2 and "--encoding_errors replace" in err
    code, _, err = _run(
        ["evaluate", "--model", str(mlm_dir), "--data", str(bad), "--encoding_errors", "replace"],
        capsys,
    )
    assert code == 0, err


def test_prepare_errors_and_small_validation_splits(mlm_dir, tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    base = ["prepare", "--tokenizer", str(mlm_dir)]
    assert cli.main([*base, "--input", str(empty), "--output", str(tmp_path / "d0")]) == 2
    monkeypatch.undo()
    assert "prepare: 0 docs" not in terminal.text and terminal.text.count("error:") == 1
    # packed mode, 1 % of 60 documents: a validation split of one document
    rng = random.Random(0)
    docs = "\n\n".join(" ".join(_filler(rng) for _ in range(3)) for _ in range(60))
    (tmp_path / "c.txt").write_text(docs + "\n")
    argv = [*base, "--input", str(tmp_path / "c.txt"), "--mode", "packed", "--progress", "false"]
    code, out, _ = _run([*argv, "--output", str(tmp_path / "d1"), "--max_seq_length", "16"], capsys)
    assert code == 0
    assert "warning: the validation split holds 1 document of 60" in out
    assert "--validation_fraction 0.09" in out  # about 5 documents


def test_nsp_accuracy_without_notnext_pairs_says_so():

    row = {"loss": 2.0, "perplexity": 7.4, "accuracy": 0.1, "top5_accuracy": 0.3}
    table = comparison_table(
        {
            "random init": {**row, "nsp_accuracy": None, "nsp_note": "no NotNext pairs"},
            "this model": {**row, "nsp_accuracy": None, "nsp_note": "no NotNext pairs"},
        }
    )
    nsp = next(line for line in table.splitlines() if line.startswith("NSP accuracy"))
    assert "n/a" in nsp and "no NotNext pairs" in nsp and "%" not in nsp


def test_evaluate_mlm_reports_no_notnext_pairs(mlm_dir):

    torch_model = BertForPreTraining.from_pretrained(mlm_dir)
    tok = Tokenizer.from_file(mlm_dir)
    ids = tok.encode_batch(["the film was good", "a story about people"], padding=True)

    batch = {k: torch.tensor(v) for k, v in ids.items()}
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1] = batch["input_ids"][:, 1]
    batch["labels"] = labels
    batch["next_sentence_label"] = torch.zeros(2, dtype=torch.long)  # IsNext only
    result = evaluate_mlm(torch_model, [batch], torch.device("cpu"))
    assert result["nsp_accuracy"] is None and result["nsp_note"] == "no NotNext pairs"


def test_curves_plot_like_with_like_and_draw_points_for_short_runs(tmp_path):

    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log(step, "train", loss=9.0 + step, mlm_loss=8.0, nsp_loss=1.0 + step, lr=1e-4)
    logger.log(3, "val", loss=8.5, accuracy=0.1, nsp_accuracy=0.5)
    logger.close()
    drawn = {}
    real_save = plots._save

    def spy(fig, output):
        drawn.update({ax.get_title(): ax for ax in fig.axes})
        return real_save(fig, output)

    plots._save = spy
    try:
        plots.plot_training_curves(tmp_path, tmp_path / "curves.png")
    finally:
        plots._save = real_save
    mlm = drawn["masked-LM loss"]
    labels = {line.get_label(): line for line in mlm.lines}
    # the train line is the MLM part, not MLM + NSP, on the axis of the validation MLM loss
    assert list(labels["train"].get_ydata()) == [8.0, 8.0, 8.0]
    assert labels["train"].get_marker() not in (None, "None", "")  # 3 points: drawn as points
    nsp = drawn["NSP loss"]
    assert list(nsp.lines[0].get_ydata()) == [2.0, 3.0, 4.0]
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_pyproject_licence_is_an_spdx_string(tmp_path):

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "pyproject.toml", tmp_path)
    shutil.copy(root / "README.md", tmp_path)
    (tmp_path / "src" / "bertforge").mkdir(parents=True)
    (tmp_path / "src" / "bertforge" / "__init__.py").write_text("")
    code = (
        "import tempfile; from setuptools import build_meta; "
        "build_meta.prepare_metadata_for_build_wheel(tempfile.mkdtemp())"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "Deprecat" not in run.stderr and "License" not in run.stderr, run.stderr
