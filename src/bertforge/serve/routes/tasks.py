"""``/tag`` (a token classifier's entities, as :func:`bertforge.inference.tagging.tag` gives
them) and ``/answer`` (a question-answering model's answers with the next-best spans, as
:func:`bertforge.inference.qa.answer` gives them): checked on the event loop, run through the
server's batcher like every inference route.

Both read long inputs in windows (a text cut at word boundaries, a context in overlapping
windows), so the model's positions do not bound them; ``--max_input_length`` does, on the whole
text or question + context, so one request costs what any other route's may.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from bertforge.data.qa import Span
from bertforge.inference.qa import answer as predict_answer
from bertforge.inference.tagging import tag as predict_tag
from bertforge.serve.limits import ApiError
from bertforge.serve.models import TASK_ROUTES, ServedModel
from bertforge.serve.routes import ServerDep
from bertforge.serve.server import Server


def _task_model(server: Server, name: str | None, route: str) -> ServedModel:
    """The served model a request names (404 if none), refused with a 422 naming the kind the
    route needs and the served models of that kind when it has no head for ``route``."""
    served = server.models.get(name or server.default)
    if served is not None and route not in served.routes:
        needed = next(kind for kind, r in TASK_ROUTES.items() if r == route)
        fitting = [n for n, m in server.models.items() if route in m.routes]
        article = "an" if served.kind[0] in "aeiou" else "a"
        raise ApiError(
            422,
            f"model {served.name!r} is {article} {served.kind} model: {route} needs a {needed} "
            f"model ({', '.join(fitting) or 'none'} served)",
            "model",
        )
    return server.model(name, route)


class TagRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"inputs": ["anna went to new york ."], "model": "ner"}]},
    )
    model: str | None = Field(None, description="served model name (default: the first one)")
    inputs: str | list[str] = Field(description="a text or a list of texts")
    aggregation: Literal["first", "simple"] = Field(
        "first",
        description="first: a tag per word, from its first piece (run_ner's convention); "
        "simple: a tag per WordPiece",
    )


class QAPair(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str
    context: str = Field(description="the text the answer is a span of")


class AnswerRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "inputs": [{"question": "where is good ?", "context": "a film good plot"}],
                    "top_k": 3,
                    "model": "qa",
                }
            ]
        },
    )
    model: str | None = Field(None, description="served model name (default: the first one)")
    inputs: QAPair | list[QAPair] = Field(
        description='a {"question", "context"} object or a list of them'
    )
    top_k: int | None = Field(
        None,
        description="spans per question: the answer and the next-best ones (default 3, or "
        "--max_top_k where lower)",
    )


router = APIRouter()


def _lengths(server: Server, served: ServedModel, items: list[Any], noun: str) -> list[int]:
    """Tokens of each text (or question + context) with its specials; one over
    ``--max_input_length`` is a 413 naming it."""
    backend = served.tokenizer.backend
    if noun == "text":
        lengths = [len(e.ids) + 2 for e in backend.encode_batch(items)]
    else:
        questions = backend.encode_batch([q for q, _ in items])
        contexts = backend.encode_batch([c for _, c in items])
        lengths = [len(q.ids) + len(c.ids) + 3 for q, c in zip(questions, contexts, strict=True)]
    limit = server.config.max_input_length
    for i, n in enumerate(lengths):
        if n > limit:
            raise ApiError(
                413,
                f"{noun} {i + 1} is {n} tokens long, more than --max_input_length={limit}; "
                "shorten it",
                "max-input-length",
            )
    return lengths


@router.post(
    "/tag",
    summary="entities of texts with character offsets (a token classifier)",
    description="As `bertforge tag` and `tag(model, tokenizer, texts)` give them: per text a "
    "list of `{entity, word, start, end, score}`, `text[start:end] == word`; a text longer "
    "than the model's window is tagged in windows cut at word boundaries.",
)
async def tag(body: TagRequest, server: ServerDep) -> JSONResponse:
    served = _task_model(server, body.model, "/tag")
    texts = server.texts(body.inputs)
    lengths = _lengths(server, served, texts, "text")

    def run(batch: list[str]) -> list[list[dict[str, Any]]]:
        options = {**served.options, "batch_size": len(batch)}
        return predict_tag(
            served.model, served.tokenizer, batch, aggregation=body.aggregation, **options
        )

    key = (served.name, "tag", body.aggregation)
    return JSONResponse(await server.run(key, texts, sum(lengths), run))


def _span(span: Span) -> dict[str, Any]:
    finite = math.isfinite(span.score)  # no candidate at all: an empty answer, no score
    return {
        "answer": span.text,
        "start": span.start,
        "end": span.end,
        "score": span.score if finite else None,
        "probability": span.probability,
    }


@router.post(
    "/answer",
    summary="answers to questions as spans of their contexts (a question-answering model)",
    description="As `bertforge answer` and `answer(model, tokenizer, questions, contexts, "
    "top_k=)` give them: per question `{answer, start, end, score, probability, "
    "alternatives}`, `context[start:end] == answer`, `score` the span's start + end logit, "
    "`probability` its softmax over the candidates, `alternatives` the next-best distinct "
    "spans (`top_k - 1` of them). A context longer than a window is read in overlapping "
    "windows.",
)
async def answer(body: AnswerRequest, server: ServerDep) -> JSONResponse:
    served = _task_model(server, body.model, "/answer")
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    pairs = server.texts([(p.question, p.context) for p in inputs])
    for i, (question, context) in enumerate(pairs):
        for name, value in (("question", question), ("context", context)):
            if not value.strip():
                raise ApiError(422, f"inputs {i + 1}: the {name} is empty; send a {name}")
    top_k = server.top_k(body.top_k, 3)
    lengths = _lengths(server, served, pairs, "question + context")

    def run(batch: list[tuple[str, str]]) -> list[dict[str, Any]]:
        options = {**served.options, "batch_size": len(batch)}
        questions, contexts = [q for q, _ in batch], [c for _, c in batch]
        spans = predict_answer(
            served.model, served.tokenizer, questions, contexts, top_k=top_k, **options
        )
        return [{**_span(s), "alternatives": [_span(a) for a in s.alternatives]} for s in spans]

    key = (served.name, "answer", top_k)
    return JSONResponse(await server.run(key, pairs, sum(lengths), run))


__all__ = ["AnswerRequest", "TagRequest", "router"]
