"""Running the ``bertforge`` command in the test's process, and a stand-in terminal."""

from __future__ import annotations

from bertforge import cli


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``bertforge ARGV`` in this process: ``(exit status, stdout, stderr)`` (``capsys``: the
    pytest fixture whose capture is read, and so emptied)."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(argv: list[str], capsys) -> str:
    """The one-line error of a refused command: ``bertforge ARGV`` exits 2 and writes exactly one
    line, ``error: ...``, to stderr (returned)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


class Terminal:
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


__all__ = ["Terminal", "one_line_error", "run_cli"]
