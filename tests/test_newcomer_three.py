"""What a newcomer trips on, round three (issue 43): each test below failed before its fix.

Silent wrong results first: a downstream column that learned nothing, input taken silently
(a CSV as a tokenizer's text, a batch larger than the data, empty texts, a UTF-8 BOM), then
messages that say the fix, output that names its columns, and the friction of classify/embed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import shutil
from pathlib import Path

import pytest
from conftest import FILLER, TaskFiles

from bertforge import cli
from bertforge.cli.options import parse_config
from bertforge.data.corpus import read_documents
from bertforge.data.shards import prepare
from bertforge.data.tables import read_texts
from bertforge.data.tasks import load_labelled
from bertforge.errors import BertforgeError
from bertforge.progress import ProgressBar
from bertforge.recipes.report import downstream_table as recipe_downstream_table
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import FinetuneConfig
from bertforge.training.downstream import downstream_table

write_rows = TaskFiles.write_rows


@pytest.fixture(scope="module")
def start(tmp_path_factory) -> Path:
    return TaskFiles.tiny_start_model(tmp_path_factory.mktemp("nc3"), kind="mlm")


def _error(argv: list[str], capsys) -> str:
    """The one-line error of a refused command."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _noise(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(n)) + " ."


FAST = ["--max_length", "16", "--batch_size", "8", "--num_threads", "1"]
FAST += ["--precision", "fp32", "--progress", "false", "--dropout", "0"]


# ---- silent wrong results ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def collapsed(start, tmp_path_factory) -> dict:
    """A downstream run where nothing can be learned: texts without signal, 80 % one class."""
    root = tmp_path_factory.mktemp("collapsed")
    rng = random.Random(1)
    rows = [{"text": _noise(rng), "label": "a" if i % 5 else "b"} for i in range(50)]
    write_rows(root / "train.csv", rows)
    write_rows(root / "test.csv", rows[:20])
    argv = ["downstream", "--model", str(start), "--train", str(root / "train.csv")]
    argv += ["--test", str(root / "test.csv"), "--output", str(root / "ds")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main([*argv, *FAST, "--max_steps", "2", "--lr", "1e-6"]) == 0
    return {"out": root / "ds", "table": out.getvalue(), "root": root}


def test_downstream_flags_a_column_that_does_not_beat_the_majority_baseline(collapsed):
    """No column can beat always guessing the majority class. The table and downstream.json
    must say so, and the headline difference is not a fair one."""
    table = collapsed["table"]
    result = json.loads((collapsed["out"] / "downstream.json").read_text())
    assert result["pretrained"]["beats_baseline"] is False
    assert result["random_init"]["beats_baseline"] is False
    assert result["majority_baseline"]["predicts"] == "a"
    assert result["majority_baseline"]["accuracy"] == pytest.approx(16 / 20)
    assert "beats majority baseline" in table and "NO" in table
    assert "NOT a fair comparison" in table and "--lr" in table and "--epochs" in table


def test_the_fair_case_has_no_warning(collapsed):
    result = json.loads((collapsed["out"] / "downstream.json").read_text())
    for name in ("pretrained", "random_init"):
        result[name]["beats_baseline"] = True
    table = downstream_table(result)
    assert "NOT a fair comparison" not in table and "NO" not in table
    result["pretrained"]["beats_baseline"] = False  # one column is enough to say it
    assert "NOT a fair comparison: pretrained did not beat" in downstream_table(result)


# ---- input taken silently ----------------------------------------------------------------------


def test_tokenizer_train_reads_the_text_column_of_a_table(tmp_path, capsys):
    rng = random.Random(2)
    rows = [{"label": "zqxlabel", "text": _noise(rng, 12)} for _ in range(200)]
    for fmt in ("csv", "jsonl"):
        table = tmp_path / f"labelled.{fmt}"
        write_rows(table, rows, fmt)
        out = tmp_path / f"tok-{fmt}"
        base = ["tokenizer", "train", "--input", str(table), "--vocab_size", "200"]
        err = _error([*base, "--output", str(out)], capsys)
        assert "--text_column" in err and "label" in err  # names the columns or keys
        assert cli.main([*base, "--output", str(out), "--text_column", "text"]) == 0
        vocab = (out / "vocab.txt").read_text().split()
        assert "movie" in vocab  # a filler word of the texts
        assert not {"zqxlabel", "label", '"', "{"} & set(vocab), fmt  # nothing but the texts


def test_finetune_refuses_a_batch_larger_than_the_training_set(start, tmp_path, capsys):
    rng = random.Random(3)
    write_rows(tmp_path / "t.csv", [{"text": _noise(rng), "label": i % 2} for i in range(20)])
    argv = ["finetune", "--model", str(start), "--train", str(tmp_path / "t.csv")]
    err = _error([*argv, "--output", str(tmp_path / "o"), "--batch_size", "1000000"], capsys)
    assert "--batch_size 1000000 is larger than the 18 training examples" in err
    assert not (tmp_path / "o").exists()


def test_empty_texts_and_labels_are_refused_naming_the_file_line(start, tmp_path, capsys):
    """Row numbers are the lines an editor shows, also after a text that spans lines."""
    rng = random.Random(4)
    rows = [{"text": _noise(rng), "label": i % 2} for i in range(20)]
    rows[0]["text"] = "a text\nover two lines"  # quoted: one row, lines 2-3
    rows[5]["text"] = "  "
    write_rows(tmp_path / "t.csv", rows)
    argv = ["finetune", "--model", str(start), "--train", str(tmp_path / "t.csv")]
    argv += ["--output", str(tmp_path / "o"), *FAST]
    err = _error(argv, capsys)
    assert f"{tmp_path / 't.csv'}:8: empty 'text' (1 such row in" in err  # row 6 is on line 8
    rows[5]["text"], rows[7]["label"] = "fine again", ""
    write_rows(tmp_path / "t.csv", rows)
    assert f"{tmp_path / 't.csv'}:10: empty 'label'" in _error(argv, capsys)


def test_a_utf8_bom_is_read_as_nothing_everywhere(tmp_path):
    rng = random.Random(5)
    rows = [{"label": i % 2, "text": _noise(rng)} for i in range(10)]
    write_rows(tmp_path / "plain.csv", rows)
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "plain.csv").read_bytes())
    data, _ = load_labelled(bom, text_column="text", label_column="label")
    assert data.labels.tolist() == [r["label"] for r in rows]  # not "no column 'label'"
    docs = list(read_documents(bom, text_column="label"))
    assert docs[0] == ["0"]
    text = tmp_path / "notes.txt"
    text.write_bytes("\ufeffHello there.\n".encode())
    assert read_texts(text)[0] == ["Hello there."]
    assert list(read_documents(text)) == [["Hello there."]]


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
        err = _error(argv, capsys)
        assert expected in err and "--encoding_errors replace" in err, argv
    argv = ["classify", "--model", str(classifier), "--input", str(latin)]
    assert cli.main([*argv, "--encoding_errors", "replace", "--progress", "false"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


# ---- messages that say the fix -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["finetune", "--learning_rate", "1e-3"],
            "unknown option --learning_rate; did you mean --lr?",
        ),
        (
            ["prepare", "--max_seq_len", "64"],
            "--max_seq_len (options are never abbreviated); did you mean --max_seq_length?",
        ),
        (["finetune", "--batch", "8"], "did you mean --batch_size?"),
        (
            ["finetune", "--train.max_time", "5m"],
            "no --train group of options here (--train.max_time is how another command nests it); use --max_time",
        ),
        (
            ["pretrain", "--max_time", "5m"],
            "unknown option --max_time; did you mean --train.max_time?",
        ),
        (["classify", "--bach_size", "8"], "did you mean --batch_size?"),
    ],
)
def test_unknown_options_name_the_one_meant(argv, expected, capsys):
    err = _error([*argv, "--output", "never-written"], capsys)
    assert expected in err, err
    assert not Path("never-written").exists()


def test_a_downstream_output_given_as_a_model_names_its_models(collapsed, capsys):
    out = collapsed["out"]
    err = _error(["classify", "--model", str(out), "some text"], capsys)
    assert f"{out}: not a model directory, but it holds 3: pretrained, random_init, " in err
    assert f"give one of them, e.g. {out / 'pretrained'}" in err


# ---- output that confuses ----------------------------------------------------------------------


def test_max_time_zero_or_none_unsets_the_budget():
    for value in ("0", "none", "null", "0m"):
        cfg = parse_config(
            FinetuneConfig,
            ["--model", "m", "--train", "t.csv", "--output", "o", "--max_time", value],
            prog="bertforge finetune",
            description="",
        )
        assert cfg.max_time is None, value
    with pytest.raises(BertforgeError, match="--max_time: duration '-5m'"):
        FinetuneConfig(model="m", train=["t.csv"], output="o", max_time="-5m")


def test_the_progress_line_shows_the_mlm_loss_beside_the_total(capsys):
    bar = ProgressBar(10, enabled=True, log_interval=0)
    bar.update(step=10, elapsed=1.0, loss=11.9, lr=1e-4, tokens_per_s=100, mlm_loss=5.8)
    bar.close()
    assert "loss 11.9000 (MLM 5.8000)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def pretrain_data(tmp_path_factory, shakespeare_file) -> Path:
    root = tmp_path_factory.mktemp("nc3-pretrain")
    text = root / "text.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    prepare([str(text)], Tokenizer.train(text, vocab_size=200), root / "data",
            max_seq_length=32, mode="nsp", progress=False)  # fmt: skip
    return root / "data"


def test_a_from_scratch_table_names_its_columns_and_a_rerun_says_finished(
    pretrain_data, tmp_path, capsys
):
    argv = ["pretrain", "--data", str(pretrain_data), "--output", str(tmp_path / "run")]
    argv += ["--model.preset", "tiny", "--model.hidden_size", "32", "--model.num_hidden_layers"]
    argv += ["1", "--model.num_attention_heads", "2", "--model.intermediate_size", "64"]
    argv += ["--train.max_steps", "2", "--train.batch_size", "8", "--train.eval_examples", "16"]
    argv += ["--train.precision", "fp32", "--train.progress", "false", "--train.num_threads", "1"]
    argv += ["--train.fresh_head", "warm"]  # a start of its own: the table has three columns
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    header = next(line for line in err.splitlines() if "BERT random init" in line)
    assert header.split() == [
        "BERT",
        "random",
        "init",
        "step",
        "0",
        "(own",
        "init)",
        "trained",
        "(2",
        "steps)",
    ]
    assert "step 0 (own init): this run before its first step; BERT random init:" in err
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'run'} holds a finished run (2 steps, its budget reached)" in err
    assert "resuming" not in err


# ---- friction ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(start, tmp_path_factory) -> Path:
    """A (tiny, briefly) fine-tuned pair classifier whose start declares mean pooling as
    all-MiniLM-L6-v2 does."""
    root = tmp_path_factory.mktemp("nc3-clf")
    shutil.copytree(start, root / "start")
    TaskFiles.declare_mean_pooling(root / "start", 32)
    rng = random.Random(6)
    rows = [
        {
            "text": _noise(rng),
            "second": ("good " if i % 2 else "bad ") + _noise(rng),
            "label": i % 2,
        }
        for i in range(40)
    ]
    write_rows(root / "train.csv", rows)
    argv = ["finetune", "--model", str(root / "start"), "--train", str(root / "train.csv")]
    argv += ["--output", str(root / "model"), "--text_pair_column", "second", *FAST]
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main([*argv, "--max_steps", "2"]) == 0
    return root / "model"


def test_classify_takes_a_text_pair_on_the_command_line(classifier, tmp_path, capsys):
    argv = ["classify", "--model", str(classifier), "--progress", "false"]
    assert cli.main([*argv, "first text", "--text_pair", "good second text"]) == 0
    given = json.loads(capsys.readouterr().out)
    write_rows(tmp_path / "p.csv", [{"text": "first text", "second": "good second text"}])
    assert cli.main([*argv, "--input", str(tmp_path / "p.csv")]) == 0
    assert json.loads(capsys.readouterr().out) == given  # the same pair, the same answer
    err = _error([*argv, "one", "two", "--text_pair", "only one"], capsys)
    assert "2 text(s) but 1 --text_pair value(s)" in err
    assert "--text_pair SECOND" in _error([*argv, "no pair"], capsys)
    single = tmp_path / "single"
    shutil.copytree(classifier, single)
    settings = json.loads((single / "finetune_config.json").read_text())
    (single / "finetune_config.json").write_text(json.dumps(settings | {"text_pair_column": None}))
    argv = ["classify", "--model", str(single), "a", "--text_pair", "b"]
    assert "fine-tuned on single texts, not pairs; drop --text_pair" in _error(argv, capsys)


def test_a_fine_tuned_model_keeps_its_starts_pooling_for_embed(classifier, tmp_path, capsys):
    assert (classifier / "1_Pooling" / "config.json").is_file()
    (tmp_path / "s.txt").write_text("a film\n", encoding="utf-8")
    argv = ["embed", "--model", str(classifier), "--input", str(tmp_path / "s.txt")]
    assert cli.main([*argv, "--output", str(tmp_path / "v.npy"), "--progress", "false"]) == 0
    assert "mean pooling (declared in" in capsys.readouterr().err


def test_evaluate_of_an_mlm_prints_the_word_count_guesser(start, tmp_path, capsys):
    text = tmp_path / "held_out.txt"
    rng = random.Random(7)
    text.write_text("\n".join(_noise(rng, 10) for _ in range(60)) + "\n", encoding="utf-8")
    assert TaskFiles.evaluate_cli(start, text, tmp_path / "r.json", "--progress", "false") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["random", "init", "word", "counts", "this", "model"]
    assert "word counts: a guesser without context" in out
    guess = json.loads((tmp_path / "r.json").read_text())["frequency_guesser"]
    assert 0 < guess["loss"] < math.log(len(FILLER)) + 0.5 and guess["tokens"] > 0


def test_a_recipe_report_marks_a_seed_that_did_not_beat_the_baseline():
    seeds = {"0": {"accuracy": 0.2612, "beats_baseline": False}, "1": {"accuracy": 0.56}}
    table = recipe_downstream_table(
        {"agnews": {"random_init": {"seeds": seeds, "mean": {"accuracy": 0.4106}}}}
    )
    assert "| 0.2612*, 0.5600 |" in table
    assert "* did not beat the majority baseline" in table and "--lr" in table
