"""OpenAI's embeddings API: ``POST /v1/embeddings``, ``GET /v1/models`` and ``GET
/v1/models/{model}``, in OpenAI's request and answer shapes, and under /v1/ its error shape
(``{"error": {"message", "type", "param", "code"}}``) and statuses
(:func:`~bertforge.serve.limits.error_answer`), so that the clients written for it (the
``openai`` package, LangChain's ``OpenAIEmbeddings``, LlamaIndex's ``OpenAIEmbedding``) work
against ``http://HOST:PORT/v1`` unchanged. The API key is their Bearer token.

The schemas are this protocol's own; the work is the server's: texts go through the forward
passes of /embed (same batcher, budget, limits and metrics, and batches shared with /embed's
requests), token-id inputs through the same batcher under a key of their own.
"""

from __future__ import annotations

import base64
import os
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from bertforge.inference.predict import cut_dimensions, trained_dimensions
from bertforge.serve.limits import ApiError
from bertforge.serve.models import ServedModel
from bertforge.serve.routes import ServerDep
from bertforge.serve.routes.inference import id_vectors, text_vectors
from bertforge.serve.server import Server

router = APIRouter(prefix="/v1", tags=["OpenAI"])

EmbeddingInput = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
INPUT_SHAPES = "send a text, a list of texts, a list of token ids or a list of token-id lists"


class EmbeddingsRequest(BaseModel):
    """OpenAI's ``POST /v1/embeddings`` body."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"input": ["a cat", "a dog"], "model": "minilm", "dimensions": 128}]
        },
    )
    input: EmbeddingInput = Field(
        description="a text, a list of texts, or WordPiece ids without [CLS] and [SEP] (a list "
        "of ids, or a list of such lists) as /tokenize gives them; the server adds the specials"
    )
    model: str = Field(description="a served model's name (GET /v1/models lists them)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector as its little-endian float32 bytes"
    )
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="a Matryoshka cut: the vectors' first dimensions (rescaled to unit length "
        "when the model's are), for a size `finetune --matryoshka_dims` trained, or the "
        "model's width",
    )
    user: str | None = Field(None, description="accepted and ignored")

    @field_validator("input", mode="wrap")
    @classmethod
    def _one_shape(cls, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValueError:  # pydantic lists every member of the union: say it in one line
            got = type(value).__name__ if not isinstance(value, list) else "a mixed list"
            raise PydanticCustomError("input", f"{INPUT_SHAPES}, not {got}") from None


def check_dimensions(served: ServedModel, dimensions: int | None) -> int | None:
    """``dimensions`` when the model answers vectors of that size (its width or a Matryoshka
    cut it was trained for), else a 422 naming the sizes it has; None for the full vector."""
    width = int(served.model.config.hidden_size)
    if dimensions is None or dimensions == width:
        return None
    sizes = trained_dimensions(served.finetuned, width)
    if dimensions in sizes:
        return dimensions
    if dimensions > width:
        said = f"is more than model {served.name!r}'s width, {width}"
    elif len(sizes) == 1:
        said = (
            f"is a cut model {served.name!r} was not trained for (finetune --matryoshka_dims "
            f"trains them); send {width} or leave dimensions unset"
        )
    else:
        cuts = ", ".join(map(str, sizes))
        said = f"is none of the sizes model {served.name!r} was trained for: {cuts}"
    raise ApiError(422, f"dimensions={dimensions} {said}", param="dimensions")


async def embedding_vectors(
    server: Server, served: ServedModel, inputs: Any, dimensions: int | None
) -> tuple[np.ndarray, int]:
    """(N, size) vectors of OpenAI's ``input`` (texts or token ids) and the tokens they took."""
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs:
        raise ApiError(422, f"input is empty; {INPUT_SHAPES}", param="input")
    if isinstance(inputs[0], int):
        inputs = [inputs]  # one text as token ids
    cut = check_dimensions(served, dimensions)
    server.check_batch_size(len(inputs), "input")
    if isinstance(inputs[0], str):
        texts = server.texts(inputs)
        lengths = server.lengths(served, texts, False, field="input")
        vectors = await text_vectors(server, served, texts, None, None, False, lengths=lengths)
        tokens = sum(lengths)
    else:
        vectors = await id_vectors(server, served, inputs, None)
        tokens = sum(len(row) + 2 for row in inputs)
    if cut is not None:
        vectors = cut_dimensions(vectors, cut, served.declared_pooling[1])
    return vectors, tokens


@router.post(
    "/embeddings",
    summary="OpenAI's embeddings: one vector per input, with the tokens used",
    description="As `client.embeddings.create(model=NAME, input=...)` of the `openai` package "
    "sends it (base URL `http://HOST:PORT/v1`). Texts share /embed's forward passes; the "
    "vectors are /embed's, pooled and normalised as the model declares.",
)
async def embeddings(body: EmbeddingsRequest, server: ServerDep) -> Response:
    served = server.model(body.model, "/embed")
    vectors, tokens = await embedding_vectors(server, served, body.input, body.dimensions)
    if body.encoding_format == "base64":
        rows: list[Any] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        rows = list(np.ascontiguousarray(vectors, dtype=np.float32))
    answer = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
        "model": served.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    # orjson writes the float32 rows directly, as /embed does
    return Response(
        orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )


def model_card(served: ServedModel) -> dict[str, Any]:
    """One served model as OpenAI's ``Model`` object."""
    try:
        created = int(os.stat(served.directory).st_mtime)
    except OSError:
        created = 0
    return {"id": served.name, "object": "model", "created": created, "owned_by": "bertforge"}


@router.get("/models", summary="OpenAI's model list: the served models")
async def models(server: ServerDep) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(m) for m in server.models.values()]}


@router.get("/models/{model}", summary="OpenAI's model object of one served model")
async def model(model: str, server: ServerDep) -> dict[str, Any]:
    served = server.models.get(model)
    if served is None:
        raise ApiError(
            404,
            f"model {model!r} is not served; served: {', '.join(server.models)}",
            "model",
            param="model",
        )
    return model_card(served)


__all__ = ["EmbeddingsRequest", "check_dimensions", "embedding_vectors", "router"]
