"""The command router: help, unknown commands, and one-line errors instead of tracebacks."""

from __future__ import annotations

import subprocess
import sys

from bertforge.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


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
