"""The command router: help, unknown commands, and one-line errors instead of tracebacks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import Terminal, one_line_error

import bertforge
from bertforge import cli
from bertforge.cli import COMMANDS, main
from bertforge.cli.options import parse_config
from bertforge.errors import BertforgeError
from bertforge.training.config import FinetuneConfig


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_the_command_lines_name_every_choice_the_code_has(capsys):
    from typing import get_args

    from bertforge.cli import command_help
    from bertforge.evaluation.benchmark import Suite
    from bertforge.recipes import RECIPES
    from bertforge.training.config import Objective, Task

    for command, choices in [
        ("finetune", get_args(Task)),
        ("benchmark", get_args(Suite)),
        ("pretrain", get_args(Objective)),
        ("recipe", list(RECIPES)),
    ]:
        line = command_help(command)
        assert all(choice in line for choice in choices), (command, line)
    assert "embedding" in command_help("finetune") and "general" in command_help("recipe")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(len(row) <= 100 for row in out.splitlines())  # wrapped, as docs/cli.md shows it
    # and the commands' own --help says the same
    described = _help_text(["benchmark"], capsys).split("options:")[0]
    assert all(f"{suite}:" in described for suite in get_args(Suite)), described
    assert "embedding: STS-B, XQuAD-en" in described
    described = _help_text(["pretrain"], capsys).split("options:")[0]
    assert all(objective in described for objective in get_args(Objective)), described


def test_a_new_choice_appears_in_the_help_without_editing_it(monkeypatch, capsys):
    from typing import Literal, get_args

    import bertforge.evaluation.benchmark as benchmark
    import bertforge.recipes.catalog as catalog
    import bertforge.training.config as config

    # each Literal type and the recipe catalogue grow by one: the help follows
    monkeypatch.setattr(config, "Task", Literal[(*get_args(config.Task), "ranking")])
    monkeypatch.setattr(config, "Objective", Literal[(*get_args(config.Objective), "span_mlm")])
    monkeypatch.setattr(benchmark, "Suite", Literal[(*get_args(benchmark.Suite), "mteb")])
    monkeypatch.setitem(catalog.RECIPES, "tiny-web", catalog.RECIPES["general"])
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())

    def line(command: str, following: str) -> str:  # a command's help, however it is wrapped
        return out.split(f" {command} ", 1)[1].split(f" {following} ", 1)[0]

    assert "span_mlm" in line("pretrain", "finetune") and "ranking" in line(
        "finetune", "downstream"
    )
    assert "mteb" in line("benchmark", "evaluate") and "tiny-web" in line("recipe", "serve")


def test_unknown_command_exits_2(capsys):
    assert main(["pretrian"]) == 2
    assert "unknown command 'pretrian'" in capsys.readouterr().err


def test_every_command_resolves_to_a_function():
    import importlib

    for module, function, _ in COMMANDS.values():
        assert callable(getattr(importlib.import_module(module), function))


def test_user_errors_are_one_line_without_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertforge.cli",
            "fill-mask",
            "--model",
            str(tmp_path / "missing"),
            "a [MASK] b",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing" in lines[0]


# ---- the one option system (bertforge.cli.options) --------------------------------------------
# every command but the router's own: its --help, --print_config and --config
OPTION_COMMANDS = [name for name in COMMANDS if name != "serve"]


def _argv(name: str) -> list[str]:
    return ["tokenizer", "train"] if name == "tokenizer" else [name]


def test_every_command_help_shows_docstrings_defaults_and_choices(capsys):
    import pytest

    for name in OPTION_COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            main([*_argv(name), "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "--config CONFIG" in out and "--print_config" in out, name
        assert "default:" in out and "type:" in out, name
        assert "-" not in "".join(a[2:] for a in out.split() if a.startswith("--")), name
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    # the field docstring, its default and the Literal's choices
    assert "Peak learning rate (AdamW). (type: float, default: 5e-05)" in out
    assert "--truncation {head,head_tail,tail}" in out and "--precision {auto,bf16,fp32}" in out
    # an optional Literal shows its choices as a Literal does, not --pooling POOLING
    assert "--pooling {cls,mean,max,mean_sqrt_len}" in out and "--metric {accuracy," in out
    for command, shown in [
        ("evaluate", "--truncation {head,head_tail,tail}"),
        ("embed", "--pooling {cls,mean,max,mean_sqrt_len}"),
        ("export", "--quantize {int8}"),
    ]:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert shown in capsys.readouterr().out, command


def test_an_optional_boolean_takes_null_as_its_help_says(capsys):
    argv = ["--model", "m", "--train", "t.csv", "--output", "o"]
    assert (
        parse_config(FinetuneConfig, [*argv, "--compile", "null"], prog="p", description="").compile
        is None
    )
    assert (
        parse_config(FinetuneConfig, [*argv, "--compile"], prog="p", description="").compile is True
    )


def test_config_file_and_print_config_round_trip(tmp_path, capsys):
    import pytest

    config = tmp_path / "ft.yaml"
    config.write_text("lr: 3.0e-05\ntruncation: head_tail\ntrain: [a.csv, b.csv]\n")
    argv = ["finetune", "--config", str(config), "--model", "m", "--output", "o", "--epochs", "2"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--print_config"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    assert "lr: 3.0e-05" in printed and "epochs: 2.0" in printed and "- b.csv" in printed
    assert "truncation: head_tail" in printed
    again = tmp_path / "again.yaml"
    again.write_text(printed)
    with pytest.raises(SystemExit):
        main(["finetune", "--config", str(again), "--print_config"])
    assert capsys.readouterr().out == printed


def test_lists_bare_flags_and_old_spellings(capsys):
    from bertforge.cli.options import normalize_argv, option_kinds
    from bertforge.cli.prepare import PrepareConfig

    kinds = option_kinds(PrepareConfig)
    argv = ["--input", "a.txt", "b.txt", "--overwrite", "--seed", "3"]
    assert normalize_argv(argv, kinds, "p") == [
        "--input",
        '["a.txt", "b.txt"]',
        "--overwrite",
        "true",
        "--seed",
        "3",
    ]
    assert capsys.readouterr().err == ""
    repeated = ["--input", "a.txt", "--seed", "3", "--input", "b.txt", "c.txt"]
    assert normalize_argv(repeated, kinds, "p") == [
        "--input",
        '["a.txt", "b.txt", "c.txt"]',
        "--seed",
        "3",
    ]
    old = ["--max-seq-length", "64", "--no-progress", "--validation-fraction=0.1"]
    assert normalize_argv(old, kinds, "bertforge prepare") == [
        "--max_seq_length",
        "64",
        "--progress",
        "false",
        "--validation_fraction=0.1",
    ]
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and "--max-seq-length -> --max_seq_length" in note[0]
    assert "--no-progress -> --progress false" in note[0] and "next release" in note[0]


def test_old_finetune_spelling_still_runs_with_one_note(tmp_path, capsys):
    """Finetune's 0.1 flags (``--batch-size``, ``--no-progress``) parse to the same config as the
    new spelling, with a single deprecation note."""
    from bertforge.cli.options import parse_config
    from bertforge.training.config import FinetuneConfig

    common = ["--model", "m", "--train", "a.csv", "b.csv", "--output", "o"]
    old = [*common, "--batch-size", "16", "--warmup-ratio", "0.2", "--no-progress", "--no-bucket"]
    new = [*common, "--batch_size", "16", "--warmup_ratio", "0.2", "--progress", "false"]
    new += ["--bucket", "false"]
    parse = lambda argv: parse_config(FinetuneConfig, argv, prog="ft", description="")  # noqa: E731
    assert parse(old) == parse(new)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: ft:") and "--warmup-ratio" in err[0]
    assert parse(old).train == ["a.csv", "b.csv"] and parse(old).progress is False


def test_a_value_the_config_refuses_is_one_line_naming_the_option(capsys):
    assert main(["finetune", "--model", "m", "--train", "a", "--output", "o", "--lr", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: bertforge finetune: --lr 0.0 must be positive, e.g. 1e-4; see " + (
        "bertforge finetune --help"
    )
    assert (
        main(["prepare", "--input", "x", "--tokenizer", "t", "--output", "o", "--mode", "z"]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: bertforge prepare: --mode takes one of nsp, packed, not 'z';")


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--train.max_steps", "five", "--train.max_steps takes an integer (or null), not 'five'"),
        ("--train.lr", "fast", "--train.lr takes a number, not 'fast'"),
        (
            "--train.precision",
            "fp16",
            "--train.precision takes one of auto, bf16, fp32, not 'fp16'",
        ),
    ],
)
def test_a_value_of_the_wrong_type_names_the_option_and_what_it_takes(option, value, says, capsys):
    assert main(["pretrain", "--data", "d", "--output", "o", option, value]) == 2
    err = capsys.readouterr().err
    assert err == f"error: bertforge pretrain: {says}; see bertforge pretrain --help\n"


def test_a_list_option_without_brackets_says_how_to_write_it(capsys):
    argv = ["pretrain", "--data", "d", "--output", "o", "--train.betas", "0.9,0.98"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: bertforge pretrain: --train.betas takes a list: write --train.betas "
        "'[0.9,0.98]', not 0.9,0.98; see bertforge pretrain --help"
    )
    argv[-1] = "[0.9,0.98]"  # the spelling the error gives is accepted
    from bertforge.cli.options import parse_config
    from bertforge.training.config import PretrainConfig

    cfg = parse_config(PretrainConfig, argv[1:], prog="p", description="")
    assert cfg.train.betas == (0.9, 0.98)


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
    err = one_line_error([*argv, "--output", "never-written"], capsys)
    assert expected in err, err
    assert not Path("never-written").exists()


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


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["finetune", "--max_time", "-1m"], "--max_time: duration '-1m' must be positive"),
        (["finetune", "--max_memory", "-1GB"], "--max_memory '-1GB' is not a memory size"),
        (["finetune", "--max_answer_length", "-3"], "--max_answer_length -3 must be at least 1"),
        (["pretrain", "--data", "d", "--train.max_time", "-1m"], "duration '-1m' must be positive"),
    ],
)
def test_a_negative_budget_is_refused_by_the_config_not_taken_for_an_option(argv, expected, capsys):
    base = ["--model", "m", "--train", "t.csv"] if argv[0] == "finetune" else []
    err = one_line_error([argv[0], *base, *argv[1:], "--output", "never-written"], capsys)
    assert expected in err and "expected one argument" not in err, err


def test_help_says_what_a_zero_budget_means(capsys):
    for command, option in (("finetune", "--max_time"), ("finetune", "--max_memory"),
                            ("pretrain", "--train.max_time"), ("pretrain", "--train.max_memory")):  # fmt: skip
        with pytest.raises(SystemExit):
            main([command, "--help"])
        entries = re.split(r"\n\s+(?=--)", capsys.readouterr().out)  # one per option
        entry = next(e for e in entries if e.startswith(option + " "))
        assert "0 or none: no limit" in " ".join(entry.split()), entry


def _help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_matches_what_the_tasks_do(capsys):
    out = _help_text(["finetune"], capsys)
    assert "token classification" in out.split("options:")[0]  # the description
    assert "question_answering: SQuAD .json or .jsonl" in out
    assert "split into windows at word boundaries" in out and "--doc_stride" in out
    top = (main(["--help"]), capsys.readouterr().out)[1]
    line = next(x for x in top.splitlines() if x.strip().startswith("benchmark"))
    assert "ner" in line and "qa" in line, line  # as --suite spells them
    assert "ner" in _help_text(["benchmark"], capsys).split("options:")[0]
    out = _help_text(["answer"], capsys)
    assert "--top_k" in out
    entries = re.split(r"\s(?=--)", out)
    batch = next(e for e in entries if e.startswith("--batch_size "))
    assert "Windows" in batch and "Texts" not in batch, batch


def test_plural_says_one_step_and_two_steps():
    from bertforge.progress import plural

    assert plural(1, "step") == "1 step" and plural(2, "step") == "2 steps"
    assert plural(1_000, "window") == "1,000 windows" and plural(0, "entity", "entities") == (
        "0 entities"
    )


# ---- progress bars and --version -----------------------------------------------------------------


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
        terminal = Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        assert cli.main(argv) == 0, name
        assert "100%" in terminal.text, (name, terminal.text)
        terminal = Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        assert cli.main([*argv, "--progress", "false"]) == 0, name
        assert "%|" not in terminal.text, (name, terminal.text)
    monkeypatch.undo()
    capsys.readouterr()
    # not a terminal (a log file, CI): no bar, but the file written is named with its size
    assert cli.main(commands["classify"]) == 0
    err = capsys.readouterr().err
    assert "%|" not in err and f"wrote 60 rows to {result}" in err


def test_version_flag(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bertforge {bertforge.__version__}"
