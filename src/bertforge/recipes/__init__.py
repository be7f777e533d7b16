"""Recipes: the seed experiments as one command each (``bertforge recipe NAME``), see
:mod:`bertforge.recipes.catalog`."""

from bertforge.recipes.catalog import RECIPES, REVIEW_SENTENCES, TAKES_PRETRAIN_OPTIONS
from bertforge.recipes.report import summary
from bertforge.recipes.runner import Recipe, default_data_root

__all__ = [
    "RECIPES",
    "REVIEW_SENTENCES",
    "TAKES_PRETRAIN_OPTIONS",
    "Recipe",
    "default_data_root",
    "summary",
]
