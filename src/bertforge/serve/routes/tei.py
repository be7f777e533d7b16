"""text-embeddings-inference's API (TEI 1.7's documented routes and bodies) where ours differ,
so that its clients work against this server unchanged: under ``/tei`` (``/tei/embed``,
``/tei/predict``, ``/tei/rerank``, ``/tei/tokenize``, ``/tei/info``, ``/tei/health``) for the
clients that append a route to a base URL, and ``POST /`` (as ``POST /tei``), which TEI answers
with the route of its model's kind: ``huggingface_hub.InferenceClient(base_url=URL)`` posts its
``feature_extraction`` and ``text_classification`` there. ``POST /rerank`` (TEI's shape, which
bertforge had no route of its own for) is here too.

TEI serves one model; these routes serve the one a request names, in the body (``"model"``) or
in the URL (``?model=NAME``: an ``InferenceClient`` sends nothing but its URL), else the first.
Where TEI's semantics differ from our routes', these follow TEI's: ``normalize`` defaults to
true, ``/tei/predict`` answers ``[{label, score}]`` sorted (a list of them per input of a batch,
and for a body with ``parameters``, the HF Inference API's, which ``text_classification``
sends) and reads ``["a", "b"]`` as one pair, ``/tei/tokenize`` gives special tokens no offsets.
Our ``/info`` carries TEI's fields too (``model_id``, ``model_type``, ``max_input_length``...),
of the default model, for the clients that read ``BASE/info``. The
schemas are this protocol's own; the forward passes are the server's (/embed's for texts).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Literal

import numpy as np
import orjson
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from bertforge.data.encoding import encode_examples
from bertforge.inference.predict import cut_dimensions, sequence_logits
from bertforge.inference.rerank import pair_scores, sigmoid
from bertforge.serve.limits import ApiError
from bertforge.serve.models import ServedModel
from bertforge.serve.routes import ServerDep
from bertforge.serve.routes.inference import id_vectors, text_vectors, tokens_of
from bertforge.serve.routes.openai import check_dimensions
from bertforge.serve.server import Server

router = APIRouter(tags=["text-embeddings-inference"])

ModelQuery = Query(None, description="served model name, for clients that send only a URL")
Direction = Literal["right", "Right", "left", "Left"]
MODEL_HELP = "served model name (default: ?model= in the URL, else the first one)"
TRUNCATE_HELP = "cut inputs longer than the limit instead of 413 (TEI's auto_truncate: false)"
DIRECTION_HELP = "which end a cut removes: right (keep the first tokens) or left (keep the last)"


class _TeiRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description=MODEL_HELP)
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    truncation_direction: Direction = Field("right", description=DIRECTION_HELP)


class TeiEmbedRequest(_TeiRequest):
    inputs: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]] = Field(
        description="a text, texts, or WordPiece ids without [CLS]/[SEP] (one list or a list)"
    )
    normalize: bool = Field(True, description="unit-length vectors (TEI's default: true)")
    prompt_name: str | None = Field(
        None, description="a key of the model's sentence-transformers prompts, prepended"
    )
    dimensions: int | None = Field(None, description="a Matryoshka cut, as /v1/embeddings'")


class TeiPredictParameters(BaseModel):
    """What ``InferenceClient.text_classification`` sends as ``parameters``."""

    model_config = ConfigDict(extra="forbid")
    top_k: int | None = Field(None, ge=1, description="the k best labels only")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = None


class TeiPredictRequest(_TeiRequest):
    inputs: str | list[str] | list[list[str]] = Field(
        description='a text, one pair ["a", "b"], or a batch [["a"], ["a", "b"], ...]'
    )
    raw_scores: bool = Field(False, description="the logits instead of probabilities")
    parameters: TeiPredictParameters | None = None


class RerankRequest(_TeiRequest):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"query": "what is a cat ?", "texts": ["a cat is an animal", "a car"]}]
        }
    )
    query: str
    texts: list[str] = Field(description="the candidates to rank for the query")
    raw_scores: bool = Field(
        False, description="a cross-encoder's raw score instead of its sigmoid"
    )
    return_text: bool = Field(False, description="each answer carries its text")


class TeiTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description=MODEL_HELP)
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


#: TEI's status for a route the model's type has not (``model is not a re-ranker model``: its
#: backend error, 424 Failed Dependency, error_type ``backend``)
WRONG_TYPE = 424


def _served(server: Server, body: BaseModel, query: str | None, route: str) -> ServedModel:
    return server.model(getattr(body, "model", None) or query, route, WRONG_TYPE)


def _cut(body: _TeiRequest, finetuned: str | None = None) -> str:
    """The truncation of a TEI body: ``left`` removes the beginning (keeps the ``tail``);
    ``right``, TEI's default, keeps the head, or cuts as fine-tuning did (``finetuned``)."""
    if body.truncation_direction.lower() == "left":
        return "tail"
    return finetuned or "head"


def _prompted(served: ServedModel, texts: list[str], prompt_name: str | None) -> list[str]:
    if prompt_name is None:
        return texts
    prompt = served.prompts.get(prompt_name)
    if prompt is None:
        names = ", ".join(served.prompts) or "none"
        raise ApiError(
            422,
            f"model {served.name!r} has no prompt {prompt_name!r} (its prompts: {names}, from "
            "config_sentence_transformers.json)",
        )
    return [prompt + t for t in texts]


# ---- /embed -------------------------------------------------------------------------------------
async def tei_embed(server: Server, body: TeiEmbedRequest, model: str | None) -> Response:
    served = _served(server, body, model, "/embed")
    truncate = bool(body.truncate)  # None: TEI's auto_truncate false
    cut = check_dimensions(served, body.dimensions)
    inputs = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    if inputs and isinstance(inputs[0], int):
        inputs = [inputs]
    if inputs and not isinstance(inputs[0], str):
        server.check_batch_size(len(inputs))
        vectors = await id_vectors(server, served, inputs, body.normalize)
    else:
        texts = _prompted(served, server.texts(inputs), body.prompt_name)
        vectors = await text_vectors(
            server, served, texts, None, body.normalize, truncate, truncation=_cut(body)
        )
    if cut is not None:
        vectors = cut_dimensions(vectors, cut, body.normalize)
    payload = orjson.dumps(np.ascontiguousarray(vectors), option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(payload, media_type="application/json")


@router.post("/tei/embed", summary="TEI's /embed: one vector per input, unit length by default")
async def embed(body: TeiEmbedRequest, server: ServerDep, model: str | None = ModelQuery):
    return await tei_embed(server, body, model)


# ---- /predict -----------------------------------------------------------------------------------
def label_scores(logits: np.ndarray, function: str) -> np.ndarray:
    """(N, C) logits -> (N, C) scores: ``softmax`` over each row, ``sigmoid`` of each logit, or
    ``none`` (the logits)."""
    logits = logits.astype(np.float64)
    if function == "softmax":
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)
    if function == "sigmoid":
        return sigmoid(logits)
    return logits


def _predict_inputs(inputs: str | list[str] | list[list[str]]) -> tuple[list[Any], bool]:
    """TEI's reading of /predict's ``inputs``: (items, one input): a text or a pair alone, or a
    batch of ``[text]`` and ``[text, text_pair]`` lists."""
    if isinstance(inputs, str):
        return [inputs], True
    if inputs and all(isinstance(x, str) for x in inputs):
        if len(inputs) > 2:
            raise ApiError(
                422,
                f"inputs is a list of {len(inputs)} texts: TEI reads a list of one or two "
                'texts as one input (a text or a pair); send a batch as [["a"], ["b"], ...]',
            )
        return [inputs[0] if len(inputs) == 1 else (inputs[0], inputs[1])], True
    items: list[Any] = []
    for i, item in enumerate(inputs):
        if not isinstance(item, list) or len(item) not in (1, 2):
            raise ApiError(
                422, f"inputs {i + 1} is not [text] or [text, text_pair]; send a list of them"
            )
        items.append(item[0] if len(item) == 1 else (item[0], item[1]))
    return items, False


def pair_logits(server: Server, served: ServedModel, paired: bool, truncation: str) -> Any:
    """The batch function of a classifier over texts or ``(text, text_pair)`` pairs: each
    item's logits, the texts cut to fine-tuning's max_length (as /predict does), as
    ``truncation`` says."""
    limit = server.length_limit(served)[0]
    max_length = min(limit, served.finetuned.get("max_length") or limit)
    tok = served.tokenizer

    def run(batch: list[Any]) -> list[np.ndarray]:
        texts, pairs = ([a for a, _ in batch], [b for _, b in batch]) if paired else (batch, None)
        encoded = encode_examples(tok, texts, pairs, max_length=max_length, truncation=truncation)
        options = {**served.options, "batch_size": len(batch)}
        return list(sequence_logits(served.model, encoded, tok.pad_id, **options))

    return run


async def tei_predict(server: Server, body: TeiPredictRequest, model: str | None) -> Response:
    served = _served(server, body, model, "/predict")
    truncate = bool(body.truncate)  # None: TEI's auto_truncate false
    items, single = _predict_inputs(body.inputs)
    items = server.texts(items)
    paired = isinstance(items[0], tuple)
    if any(isinstance(x, tuple) != paired for x in items):
        raise ApiError(422, "inputs mixes texts and pairs; one request holds one or the other")
    server.check_pairing(served, paired, "/predict")
    lengths = server.lengths(served, items, truncate)
    cut = _cut(body, served.finetuned.get("truncation"))
    key = (served.name, "logits", paired, cut)
    logits = np.stack(
        await server.run(key, items, sum(lengths), pair_logits(server, served, paired, cut))
    )
    config = served.model.config
    parameters = body.parameters or TeiPredictParameters()
    if body.raw_scores:
        function = "none"
    elif parameters.function_to_apply is not None:
        function = parameters.function_to_apply
    else:  # a regressor's value as it is; one logit: its sigmoid, as TEI
        function = (
            "none" if config.is_regression else "sigmoid" if logits.shape[1] == 1 else "softmax"
        )
    labels = served.labels() if not config.is_regression else ["value"]
    answers = []
    for row in label_scores(logits, function):
        ranked = sorted(zip(labels, row, strict=True), key=lambda x: -x[1])[: parameters.top_k]
        answers.append([{"label": label, "score": float(score)} for label, score in ranked])
    # a body with "parameters" is the HF Inference API's (InferenceClient.text_classification
    # sends one): it answers a list per input, one text included
    return JSONResponse(answers[0] if single and body.parameters is None else answers)


@router.post(
    "/tei/predict",
    summary="TEI's /predict: [{label, score}] best first (a list per input of a batch)",
)
async def predict(body: TeiPredictRequest, server: ServerDep, model: str | None = ModelQuery):
    return await tei_predict(server, body, model)


# ---- /rerank ------------------------------------------------------------------------------------
def cosines(query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """(H,) and (N, H) -> (N,) cosine of each vector with the query's."""
    query = query.astype(np.float64)
    vectors = vectors.astype(np.float64)
    norms = np.maximum(np.linalg.norm(vectors, axis=1) * np.linalg.norm(query), 1e-12)
    return vectors @ query / norms


def ranked(scores: np.ndarray, texts: list[str] | None) -> list[dict[str, Any]]:
    """``[{index, score[, text]}]`` best first, ties in input order."""
    order = np.argsort(-scores, kind="stable")
    out = []
    for i in order:
        item: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
        if texts is not None:
            item["text"] = texts[i]
        out.append(item)
    return out


async def tei_rerank(server: Server, body: RerankRequest, model: str | None) -> JSONResponse:
    served = server.model(body.model or model, "/embed")  # 404 for a model not served
    if served.reranks is None:
        fitting = ", ".join(n for n, m in server.models.items() if m.reranks) or "none"
        raise ApiError(
            WRONG_TYPE,
            f"model {served.name!r} ({served.kind}, {served.model.config.num_labels} outputs) "
            "ranks nothing: /rerank needs a cross-encoder (a classifier of one output or two "
            f"classes) or an embedding model ({fitting} served)",
            "backend",
        )
    truncate = bool(body.truncate)  # None: TEI's auto_truncate false
    texts = server.texts(body.texts)
    (query,) = server.texts([body.query])
    if served.reranks == "embedding":
        vectors = await text_vectors(
            server, served, [query, *texts], None, None, truncate, truncation=_cut(body)
        )
        scores = cosines(vectors[0], vectors[1:])
    else:
        pairs = [(query, t) for t in texts]
        lengths = server.lengths(served, pairs, truncate)
        cut = _cut(body, served.finetuned.get("truncation"))
        key = (served.name, "logits", True, cut)
        run = pair_logits(server, served, True, cut)
        raw = pair_scores(np.stack(await server.run(key, pairs, sum(lengths), run)))
        scores = raw if body.raw_scores else sigmoid(raw)
    return JSONResponse(ranked(scores, texts if body.return_text else None))


@router.post(
    "/rerank",
    summary="texts ranked for a query: [{index, score}] best first (TEI's /rerank)",
    description="A cross-encoder (a classifier of one output or two classes, such as `bertforge "
    "finetune --text_pair_column` writes) scores each (query, text) pair: the sigmoid of its "
    "output or of the second class's log-odds (`raw_scores`: that score itself); an "
    "embedding model (an encoder or masked LM) scores the cosine of the two vectors.",
)
async def rerank(body: RerankRequest, server: ServerDep, model: str | None = ModelQuery):
    return await tei_rerank(server, body, model)


router.add_api_route("/tei/rerank", rerank, methods=["POST"], summary="TEI's /rerank (as /rerank)")


# ---- /tokenize, /info, /health ------------------------------------------------------------------
@router.post("/tei/tokenize", summary="TEI's /tokenize: [[{id, text, special, start, stop}]]")
async def tokenize(
    body: TeiTokenizeRequest, server: ServerDep, model: str | None = ModelQuery
) -> JSONResponse:
    served = _served(server, body, model, "/tokenize")
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    texts = _prompted(served, server.texts(inputs), body.prompt_name)
    answers = []
    for text in texts:
        tokens = []
        for t in tokens_of(served, text):
            if t["special"] and not body.add_special_tokens:
                continue
            if t["special"]:  # TEI: a special token has no place in the text
                tokens.append({**t, "start": None, "stop": None})
            else:
                tokens.append({**t, "text": text[t["start"] : t["stop"]]})
        answers.append(tokens)
    return JSONResponse(answers)


def model_type(served: ServedModel) -> dict[str, Any]:
    """TEI's ``model_type`` of a served model: a classifier (a reranker when it has one output),
    else an embedding model with its pooling."""
    if served.kind == "classifier":
        labels = served.labels() if not served.model.config.is_regression else ["LABEL_0"]
        id2label = {str(i): label for i, label in enumerate(labels)}
        kind = "reranker" if len(labels) == 1 else "classifier"
        return {kind: {"id2label": id2label, "label2id": {v: int(k) for k, v in id2label.items()}}}
    return {"embedding": {"pooling": served.declared_pooling[0] or "cls"}}


@router.get("/tei/info", summary="TEI's /info: the model and the limits a TEI client reads")
async def info(server: ServerDep, model: str | None = ModelQuery) -> dict[str, Any]:
    return tei_info(server, server.model(model, "/tokenize"))


def tei_info(server: Server, served: ServedModel) -> dict[str, Any]:
    """TEI's ``/info`` fields of ``served`` (our /info carries them too, of the default model)."""
    config = server.config
    dtype = "bfloat16" if served.options.get("precision") == "bf16" else "float32"
    return {
        "model_id": served.name,
        "model_sha": None,
        "model_dtype": dtype,
        "model_type": model_type(served),
        "max_concurrent_requests": config.max_concurrent_requests,
        "max_input_length": server.length_limit(served)[0],
        "max_batch_tokens": config.max_batch_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": config.max_client_batch_size,
        "auto_truncate": False,
        "tokenization_workers": 1,
        "version": _version(),
        "sha": None,
        "docker_label": None,
    }


def _version() -> str:
    try:
        return metadata.version("bertforge")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


@router.get("/tei/health", summary="TEI's /health: 200 once ready, 503 before")
async def health(server: ServerDep) -> JSONResponse:
    if server.ready and not server.draining:
        return JSONResponse({})
    return JSONResponse({"error": "unhealthy", "error_type": "unhealthy"}, 503)


# ---- POST / and /tei: the route of the model's kind -----------------------------------------------
def _parsed(schema: type[BaseModel], data: Any) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as err:  # answered as any body FastAPI validates
        raise RequestValidationError(err.errors()) from None


async def dispatch(request: Request, server: ServerDep, model: str | None = ModelQuery):
    """TEI's ``POST /``: rerank a body with a ``query``; else predict with a classifier,
    embed with any other model."""
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError as err:
        raise ApiError(422, f"the body is not JSON ({err}); send a JSON object") from None
    if not isinstance(data, dict):
        raise ApiError(422, 'send a JSON object such as {"inputs": "a text"}')
    if "query" in data:
        return await tei_rerank(server, _parsed(RerankRequest, data), model)
    named = data.get("model")
    served = server.model(named if isinstance(named, str) else model, "/tokenize")
    if served.kind == "classifier":
        return await tei_predict(server, _parsed(TeiPredictRequest, data), model)
    return await tei_embed(server, _parsed(TeiEmbedRequest, data), model)


for path in ("/", "/tei"):
    router.add_api_route(
        path,
        dispatch,
        methods=["POST"],
        summary="TEI's POST /: /rerank for a body with a query, else /predict (a classifier) "
        "or /embed (any other model)",
        openapi_extra={"requestBody": {"content": {"application/json": {"schema": {}}}}},
    )


__all__ = [
    "RerankRequest",
    "TeiEmbedRequest",
    "TeiPredictRequest",
    "TeiTokenizeRequest",
    "cosines",
    "label_scores",
    "ranked",
    "router",
    "tei_info",
]
