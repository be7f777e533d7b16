"""``bertforge recipe NAME [--smoke] [--data DIR] [--output DIR]``: run one of the recipes of
:mod:`bertforge.recipes.catalog` (the commands it runs are printed as it goes)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertforge.cli import main as cli_main
from bertforge.cli.options import parse_config
from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text
from bertforge.progress import parse_budget
from bertforge.recipes import (
    RECIPES,
    TAKES_PRETRAIN_OPTIONS,
    Recipe,
    default_data_root,
    summary,
)
from bertforge.training.config import check_at_least

DESCRIPTION = (
    "Run a recipe: a chain of bertforge commands on the shared data sets, ending in a results "
    "table (OUTPUT/results.md, results.json). Steps whose output exists are skipped, so a rerun "
    "continues. Options after -- go to the recipe's pretraining step (e.g. -- --train.lr 1e-3). "
    "Recipes: " + "; ".join(f"{name}: {help_}" for name, (_, help_) in RECIPES.items())
)


@dataclass(kw_only=True)
class RecipeOptions:
    """Options of ``bertforge recipe``."""

    name: list[str] = field(default_factory=list)
    """The recipe (one bare word)."""
    smoke: bool = False
    """A tiny model on a slice of the data, a few steps (the test suite runs it)."""
    data: str | None = None
    """Folder holding imdb/, ag_news/, wikitext2/, ... (default $BERTFORGE_SHARED_DATA or
    ../shared/data beside the repository)."""
    output: str | None = None
    """Output directory (default runs/recipes/NAME, or NAME-smoke)."""
    budget: str | None = None
    """Pretraining time such as 30m (default: the recipe's own)."""
    init: str | None = None
    """The published model to start from (default all-MiniLM-L6-v2)."""
    seeds: list[int] | None = None
    """Fine-tuning seeds (default 0 1; with --smoke 0)."""
    num_threads: int | None = None
    """torch CPU threads of every pretrain, finetune, downstream, evaluate and fill-mask command
    the recipe runs (default: torch's, one per core; 1 on a machine other jobs share)."""

    def __post_init__(self) -> None:
        if len(self.name) != 1 or self.name[0] not in RECIPES:
            given = " ".join(self.name)
            raise BertforgeError(
                f"{given!r} is not one recipe; name one of {', '.join(RECIPES)}"
                if given
                else f"name one recipe of {', '.join(RECIPES)}"
            )
        check_at_least(self, lambda name: f"--{name}", num_threads=1)
        parse_budget(self.budget, "--budget")


def main(argv: list[str]) -> int:
    """``bertforge recipe NAME [--smoke] [--data DIR] [--output DIR] [--budget 30m]
    [--num_threads 1] [-- PRETRAIN OPTIONS]``; with no argument at all, the list of recipes."""
    if not argv:
        print("recipes (run one with: bertforge recipe NAME; options: bertforge recipe --help):")
        for name, (_, help_) in RECIPES.items():
            print(f"  {name:<18} {help_}")
        return 0
    pretrain_args: list[str] = []
    if "--" in argv:  # what follows goes to the recipe's pretraining step
        cut = argv.index("--")
        argv, pretrain_args = argv[:cut], argv[cut + 1 :]
    cfg = parse_config(
        RecipeOptions,
        argv,
        prog="bertforge recipe",
        description=DESCRIPTION,
        positional=("name", "the recipe: " + ", ".join(RECIPES)),
    )
    name = cfg.name[0]
    if pretrain_args and name not in TAKES_PRETRAIN_OPTIONS:
        raise BertforgeError(
            f"recipe {name} takes no pretraining options after --; only "
            f"{', '.join(sorted(TAKES_PRETRAIN_OPTIONS))} does"
        )
    output = Path(cfg.output or f"runs/recipes/{name}{'-smoke' if cfg.smoke else ''}")
    recipe = Recipe(
        name=name,
        output=output,
        data=Path(cfg.data) if cfg.data else default_data_root(),
        command=cli_main,
        smoke=cfg.smoke,
        init=Path(cfg.init) if cfg.init else None,
        budget=cfg.budget,
        seeds=tuple(cfg.seeds or ([0] if cfg.smoke else [0, 1])),
        num_threads=cfg.num_threads,
        pretrain_args=tuple(pretrain_args),
    )
    if cfg.num_threads is not None:  # the recipe's own work between the commands too
        torch.set_num_threads(cfg.num_threads)
    output.mkdir(parents=True, exist_ok=True)
    RECIPES[name][0](recipe)
    path = recipe.save()
    text = summary(recipe.results)
    atomic_write_text(output / "results.md", text)
    print(text)
    print(f"results: {path}", file=sys.stderr)
    return 0
