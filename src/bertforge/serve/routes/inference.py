"""The inference routes: /tokenize, /fill-mask, /predict, /embed and /similarity. Each checks
its request on the event loop (model, route, sizes, [MASK]) and runs the model through the
server's batcher, where requests with the same key share one forward pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from bertforge.inference.predict import classify as predict_classify
from bertforge.inference.predict import embed as predict_embed
from bertforge.inference.predict import embed_ids as predict_embed_ids
from bertforge.inference.predict import fill_mask as predict_fill_mask
from bertforge.serve.limits import ApiError
from bertforge.serve.models import ServedModel
from bertforge.serve.routes import ServerDep, rounded
from bertforge.serve.schemas import (
    EmbedRequest,
    FillMaskRequest,
    PredictRequest,
    SimilarityRequest,
    TokenizeRequest,
)
from bertforge.serve.server import Server

router = APIRouter()


@router.post("/tokenize", summary="WordPieces with ids and character offsets")
async def tokenize(body: TokenizeRequest, server: ServerDep) -> JSONResponse:
    served = server.model(body.model, "/tokenize")
    texts = server.texts(body.inputs)  # a body within the payload limit tokenizes in ms
    return JSONResponse([tokens_of(served, t) for t in texts])


@router.post("/fill-mask", summary="top-k candidates for every [MASK]")
async def fill_mask(body: FillMaskRequest, server: ServerDep) -> JSONResponse:
    served = server.model(body.model, "/fill-mask")
    texts = server.texts(body.inputs)
    top_k = server.top_k(body.top_k, 5)
    lengths = server.lengths(served, texts, truncate=False)
    mask_id = served.tokenizer.mask_id
    for i, enc in enumerate(served.tokenizer.backend.encode_batch(texts)):
        if mask_id not in enc.ids:
            raise ApiError(
                422,
                f"text {i + 1} has no [MASK] token: {texts[i][:60]!r}; write [MASK] where a "
                "word should be predicted",
                "no-mask",
            )

    def run(batch: list[str]) -> list[dict[str, Any]]:
        options = {**served.options, "batch_size": len(batch)}
        return predict_fill_mask(served.model, served.tokenizer, batch, top_k, **options)

    key = (served.name, "fill-mask", top_k)
    results = await server.run(key, texts, sum(lengths), run)
    return JSONResponse(results)


@router.post(
    "/predict",
    summary="labels with scores (or the value of a regressor), of texts or text pairs",
    description="A model fine-tuned on text pairs (`bertforge finetune --text_pair_column`; "
    '/info says `"inputs": "pairs"`) takes `{"inputs": [["<text>", "<text_pair>"], ...]}`, '
    "as `classify(model, tokenizer, texts, pairs)` does in Python; any other takes a text "
    "or a list of texts.",
)
async def predict(body: PredictRequest, server: ServerDep) -> JSONResponse:
    served = server.model(body.model, "/predict")
    items = server.texts(body.inputs)
    paired = isinstance(items[0], tuple)
    server.check_pairing(served, paired, "/predict")
    lengths = server.lengths(served, items, body.truncate)
    # texts are cut as fine-tuning cut them (its max_length and truncation, as `bertforge
    # classify` does), within the server's own limit; an ONNX model has no directory for
    # classify() to read them from, so they are passed
    limit = server.length_limit(served)[0]
    max_length = min(limit, served.finetuned.get("max_length") or limit)
    truncation = served.finetuned.get("truncation")

    def run(batch: list[Any]) -> list[dict[str, Any]]:
        options = {**served.options, "batch_size": len(batch)}
        texts, pairs = ([a for a, _ in batch], [b for _, b in batch]) if paired else (batch, None)
        return predict_classify(
            served.model,
            served.tokenizer,
            texts,
            pairs,
            max_length=max_length,
            truncation=truncation,
            **options,
        )

    key = (served.name, "predict", paired)  # texts and pairs never share a forward pass
    results = await server.run(key, items, sum(lengths), run)
    return JSONResponse(results)


async def text_vectors(
    server: Server,
    served: ServedModel,
    texts: list[str],
    pooling: str | None,
    normalize: bool | None,
    truncate: bool,
    *,
    lengths: list[int] | None = None,
    truncation: str = "head",
) -> np.ndarray:
    """(N, H) vectors of ``texts`` through the batcher (the forward passes of /embed, which the
    other protocols' embedding routes share); ``lengths``: their token counts, when the caller
    has checked them already; a cut text keeps its first tokens (``truncation="tail"``: its
    last, TEI's ``truncation_direction: left``)."""
    # unset means what the model declares, as `bertforge embed` and embed() do
    declared, declared_norm = served.declared_pooling
    pooling = pooling or declared or "cls"
    normalize = declared_norm if normalize is None else normalize
    if lengths is None:
        lengths = server.lengths(served, texts, truncate)
    max_length = server.length_limit(served)[0]

    def run(batch: list[str]) -> list[np.ndarray]:
        options = {**served.options, "batch_size": len(batch)}
        vectors = predict_embed(
            served.encoder,
            served.tokenizer,
            batch,
            pooling,
            max_length=max_length,
            normalize=normalize,
            truncation=truncation,
            **options,
        )
        return list(vectors)

    key = (served.name, "embed", pooling, normalize, truncation)  # one cut per forward pass
    return np.stack(await server.run(key, texts, sum(lengths), run))


async def id_vectors(
    server: Server, served: ServedModel, ids: list[list[int]], normalize: bool | None
) -> np.ndarray:
    """(N, H) vectors of texts given as WordPiece ids (without [CLS] and [SEP], which are added),
    checked against the vocabulary and the length limit, through the batcher; the model's
    declared pooling."""
    tok = served.tokenizer
    for i, row in enumerate(ids):
        wrong = next((t for t in row if not 0 <= t < tok.vocab_size), None)
        if wrong is not None:
            raise ApiError(
                422,
                f"input {i + 1}: token id {wrong} is not in the model's vocabulary (0 to "
                f"{tok.vocab_size - 1}); send ids as /tokenize gives them",
                param="input",
            )
    limit, name = server.length_limit(served)
    for i, row in enumerate(ids):
        if len(row) + 2 > limit:
            raise ApiError(
                413,
                f"input {i + 1} is {len(row) + 2} tokens long with [CLS] and [SEP], more than "
                f"{name}={limit}; shorten it",
                "max-input-length",
                param="input",
            )
    declared, declared_norm = served.declared_pooling
    pooling = declared or "cls"
    normalize = declared_norm if normalize is None else normalize
    full = [[tok.cls_id, *row, tok.sep_id] for row in ids]

    def run(batch: list[list[int]]) -> list[np.ndarray]:
        options = {**served.options, "batch_size": len(batch)}
        vectors = predict_embed_ids(
            served.encoder, tok, batch, pooling, normalize=normalize, **options
        )
        return list(vectors)

    key = (served.name, "embed-ids", pooling, normalize)
    return np.stack(await server.run(key, full, sum(len(r) for r in full), run))


@router.post("/embed", summary="one vector per text")
async def embed(body: EmbedRequest, server: ServerDep) -> Response:
    served = server.model(body.model, "/embed")
    texts = server.texts(body.inputs)
    vectors = await text_vectors(server, served, texts, body.pooling, body.normalize, body.truncate)
    # orjson writes float32 arrays directly, in float32's shortest form: ~20x faster than
    # json over Python floats and half the bytes, on the event loop of every request
    payload = orjson.dumps(np.ascontiguousarray(vectors), option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(payload, media_type="application/json")


@router.post("/similarity", summary="cosine similarity matrix of the texts' vectors")
async def similarity(body: SimilarityRequest, server: ServerDep) -> JSONResponse:
    served = server.model(body.model, "/similarity")
    texts = server.texts(body.inputs)
    if len(texts) < 2:
        raise ApiError(422, "inputs needs at least 2 texts to compare")
    vectors = await text_vectors(server, served, texts, body.pooling, True, body.truncate)
    return JSONResponse({"similarity": rounded(vectors @ vectors.T)})


def tokens_of(served: ServedModel, text: str) -> list[dict[str, Any]]:
    """WordPieces of ``text`` with ids and character offsets, [CLS] and [SEP] included."""
    tok = served.tokenizer
    enc = tok.backend.encode(text)
    pieces = [{"id": tok.cls_id, "text": "[CLS]", "special": True, "start": 0, "stop": 0}]
    for i, piece, (start, stop) in zip(enc.ids, enc.tokens, enc.offsets, strict=True):
        special = i in tok.special_ids
        pieces.append({"id": i, "text": piece, "special": special, "start": start, "stop": stop})
    end = len(text)
    pieces.append({"id": tok.sep_id, "text": "[SEP]", "special": True, "start": end, "stop": end})
    return pieces
