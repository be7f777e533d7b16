"""``bertforge verify DIR...``: check models, checkpoints, runs and prepared data against the
manifests bertforge wrote with them (:mod:`bertforge.verify`). Exit status 0 when nothing is
damaged, 1 when something is."""

from __future__ import annotations

import argparse

from bertforge.errors import ArgumentParser
from bertforge.verify import format_report, verify


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="bertforge verify",
        description="Check every file of a model, checkpoint, run or prepared data directory "
        "against the sizes and SHA-256 hashes recorded when it was written; name the newest "
        "checkpoint that verifies.",
    )
    p.add_argument("directories", nargs="+", metavar="DIR", help="directories to check")
    p.add_argument(
        "--sizes-only",
        action="store_true",
        help="compare sizes only (instant; hashing reads every byte, about 1 GB/s)",
    )
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    damaged = False
    for directory in args.directories:
        report = verify(directory, hashes=not args.sizes_only)
        print(format_report(report), flush=True)
        damaged = damaged or report.damaged
    return 1 if damaged else 0
