"""``bertforge verify DIR...``: check models, checkpoints, runs, downstream outputs and prepared
data against the manifests bertforge wrote with them (:mod:`bertforge.verify`). Exit status 0 when
nothing is damaged, 1 when something is."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertforge.cli.options import parse_config
from bertforge.errors import BertforgeError
from bertforge.verify import format_report, verify_all


@dataclass(kw_only=True)
class VerifyConfig:
    """Options of ``bertforge verify``."""

    directories: list[str] = field(default_factory=list)
    """Model, checkpoint, run, downstream output or prepared data directories to check."""
    sizes_only: bool = False
    """Compare sizes only (instant; hashing reads every byte, about 1 GB/s)."""

    def __post_init__(self) -> None:
        if not self.directories:
            raise BertforgeError("give at least one directory to check")


def main(argv: list[str]) -> int:
    """``bertforge verify runs/mini``: one line per directory, then the checkpoint to resume from."""
    cfg = parse_config(
        VerifyConfig,
        argv,
        prog="bertforge verify",
        description="Check every file of a model, checkpoint, run, downstream output (each of "
        "its runs) or prepared data directory against the sizes and SHA-256 hashes recorded "
        "when it was written; name the newest checkpoint that verifies.",
        positional=("directories", "directories to check"),
    )
    damaged = False
    for directory in cfg.directories:
        for report in verify_all(directory, hashes=not cfg.sizes_only):
            print(format_report(report), flush=True)
            damaged = damaged or report.damaged
    return 1 if damaged else 0
