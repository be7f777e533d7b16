"""The JSON request bodies of the routes, as pydantic models: the OpenAPI document at /docs is
generated from them, and an unknown field is a 422."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from bertforge.inference.predict import PoolingMode

Texts = str | list[str]
Pair = tuple[str, str]
"""``[text, text_pair]`` in JSON: the two segments of one example, ``[CLS] a [SEP] b [SEP]``."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="served model name (default: the first one)")


class TokenizeRequest(_Request):
    inputs: Texts


class FillMaskRequest(_Request):
    inputs: Texts = Field(description="texts holding one or more [MASK] tokens")
    top_k: int | None = Field(
        None, description="candidates per [MASK] (default 5, or --max_top_k where lower)"
    )


class PredictRequest(_Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"inputs": ["a good film", "a dull plot"]},
                {"inputs": [["A man is eating.", "Someone eats."]], "model": "nli"},
            ]
        }
    )
    inputs: Texts | list[Pair] = Field(
        description="a text or a list of texts; for a model fine-tuned on text pairs (/info: "
        '"inputs": "pairs"), a list of [text, text_pair] pairs, e.g. [["premise", "hypothesis"]]'
    )
    truncate: bool = Field(False, description="cut texts longer than the limit instead of 413")

    @field_validator("inputs", mode="wrap")
    @classmethod
    def _texts_or_pairs(cls, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:  # pydantic's answer lists every union member: say it in one
            raise PydanticCustomError("inputs", inputs_problem(value)) from None


POOLING_HELP = (
    "unset: the pooling the model's directory declares (sentence-transformers' "
    "1_Pooling/config.json), else cls"
)


class EmbedRequest(_Request):
    inputs: Texts
    pooling: PoolingMode | None = Field(None, description=POOLING_HELP)
    normalize: bool | None = Field(
        None, description="unset: as the model declares (2_Normalize in modules.json), else false"
    )
    truncate: bool = False


class SimilarityRequest(_Request):
    inputs: list[str] = Field(description="texts to compare with each other (at least 2)")
    pooling: PoolingMode | None = Field(None, description=POOLING_HELP)
    truncate: bool = False


EXPLAINED_HELP = (
    "one text, or one [text, text_pair] pair: [CLS] text [SEP] text_pair [SEP], the second "
    'segment with token type 1 (a classifier fine-tuned on pairs, /info "inputs": "pairs", '
    "takes a pair only)"
)


class AttentionRequest(_Request):
    inputs: str | Pair = Field(description=EXPLAINED_HELP)
    max_tokens: int | None = Field(
        None,
        description="cut the text to this many tokens (at most the server's limit; a pair: "
        "the longer text first)",
    )


class AttributeRequest(_Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"inputs": "a good film", "steps": 32},
                {"inputs": ["A man is eating.", "Someone eats."], "model": "nli"},
            ]
        }
    )
    inputs: str | Pair = Field(description=EXPLAINED_HELP)
    steps: int = Field(32, description="points on the integration path")
    target: str | None = Field(None, description="label to explain (default: the predicted one)")
    max_tokens: int | None = None


def inputs_problem(value: Any) -> str:
    """What is wrong with /predict's ``inputs`` when it is none of text, texts, pairs."""
    shapes = "send a text, a list of texts, or a list of [text, text_pair] pairs"
    if not isinstance(value, list):
        return f"{shapes}, not {type(value).__name__}"
    for i, item in enumerate(value):
        if isinstance(item, list) and (len(item) != 2 or not all(isinstance(t, str) for t in item)):
            return f"item {i + 1} is not a pair of two texts [text, text_pair]; {shapes}"
        if not isinstance(item, str | list):
            return f"item {i + 1} is {type(item).__name__}, not a text; {shapes}"
    return f"texts and pairs are mixed; {shapes}"


__all__ = [
    "AttentionRequest",
    "AttributeRequest",
    "EmbedRequest",
    "FillMaskRequest",
    "Pair",
    "PredictRequest",
    "SimilarityRequest",
    "Texts",
    "TokenizeRequest",
    "inputs_problem",
]
