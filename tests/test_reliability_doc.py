"""docs/reliability.md cannot go stale: its table is the one reliability_table.py renders from
the counts the tests use, it lists every test of the reliability files, and every test it
names exists.
After changing a test or a count: ``python tests/support/reliability_table.py --write``."""

from __future__ import annotations

import ast
from pathlib import Path

from support.reliability_table import BEGIN, DOC, END, ROWS, render

HERE = Path(__file__).resolve().parent
FILES = ("test_faults.py", "test_integrity.py", "test_hostile_input.py")


def _tests(name: str) -> set[str]:
    path = HERE / name
    if not path.is_file():
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        f"{name}::{node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def test_the_table_in_the_doc_is_the_generated_one():
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert table == render(), "run: python tests/support/reliability_table.py --write"


def test_the_table_lists_every_reliability_test_and_only_those():
    listed = {row.test.split("[")[0] for row in ROWS}
    ours = set().union(*(_tests(name) for name in FILES))
    assert ours - listed == set(), "tests missing from reliability_table.ROWS"
    elsewhere = {test.split("::")[0] for test in listed - ours}  # rows citing older tests
    existing = ours.union(*(_tests(name) for name in elsewhere))
    assert listed - existing == set(), "rows naming tests that do not exist"
