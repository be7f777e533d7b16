"""``bertforge recipe NAME [--smoke] [--data DIR] [--output DIR]``: run one of the recipes of
:mod:`bertforge.recipes.catalog` (the commands it runs are printed as it goes)."""

from __future__ import annotations

import sys
from pathlib import Path

from bertforge.errors import ArgumentParser
from bertforge.io import atomic_write_text
from bertforge.recipes import RECIPES, Recipe, default_data_root, summary


def main(argv: list[str]) -> int:
    parser = ArgumentParser(
        prog="bertforge recipe",
        description="Run a recipe: a chain of bertforge commands on the shared data sets, "
        "ending in a results table. Steps whose output exists are skipped (rerun to continue).",
        epilog="recipes: " + "; ".join(f"{name}: {help_}" for name, (_, help_) in RECIPES.items()),
    )
    parser.add_argument("name", choices=sorted(RECIPES), metavar="NAME", help=", ".join(RECIPES))
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny model on a slice, a few steps (< 1 minute)"
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        help="folder holding imdb/, ag_news/, wikitext2/, ... "
        "(default $BERTFORGE_SHARED_DATA or ../shared/data beside the repository)",
    )
    parser.add_argument("--output", metavar="DIR", help="default runs/recipes/NAME[-smoke]")
    parser.add_argument(
        "--budget", metavar="TIME", help="pretraining time, e.g. 30m (each recipe has a default)"
    )
    parser.add_argument(
        "--init", metavar="DIR", help="the published model (default all-MiniLM-L6-v2)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="N",
        help="fine-tuning seeds (default 0 1; --smoke: 0)",
    )
    args = parser.parse_args(argv)
    output = Path(args.output or f"runs/recipes/{args.name}{'-smoke' if args.smoke else ''}")
    recipe = Recipe(
        name=args.name,
        output=output,
        data=Path(args.data) if args.data else default_data_root(),
        smoke=args.smoke,
        init=Path(args.init) if args.init else None,
        budget=args.budget,
        seeds=tuple(args.seeds or ([0] if args.smoke else [0, 1])),
    )
    output.mkdir(parents=True, exist_ok=True)
    RECIPES[args.name][0](recipe)
    path = recipe.save()
    text = summary(recipe.results)
    atomic_write_text(output / "results.md", text)
    print(text)
    print(f"results: {path}", file=sys.stderr)
    return 0
