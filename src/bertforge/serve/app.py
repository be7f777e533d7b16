"""The HTTP application: JSON routes named after text-embeddings-inference where one exists,
the explorer page at ``/`` and OpenAPI docs at ``/docs``, all served from this package.

Every request is checked on the event loop (model, route, sizes, [MASK]) before it reaches
the inference thread, so a bad one costs microseconds and an answer that names what is wrong;
the inference itself goes through the :class:`~bertforge.serve.batcher.Batcher`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import numpy as np
import orjson
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertforge.data.encoding import encode_examples
from bertforge.errors import BertforgeError
from bertforge.inference.explain import attention_maps, integrated_gradients
from bertforge.inference.predict import PoolingMode
from bertforge.inference.predict import classify as predict_classify
from bertforge.inference.predict import embed as predict_embed
from bertforge.inference.predict import fill_mask as predict_fill_mask
from bertforge.io import pause_point
from bertforge.runtime import release_free_memory
from bertforge.serve.access import Access
from bertforge.serve.batcher import Batcher, BatchStats, RunBatch
from bertforge.serve.config import ServeConfig
from bertforge.serve.limits import ApiError, Limits, error_body
from bertforge.serve.metrics import Metrics
from bertforge.serve.models import ServedModel
from bertforge.serve.routes_tasks import router as tasks_router

Texts = str | list[str]
Pair = tuple[str, str]
"""``[text, text_pair]`` in JSON: the two segments of one example, ``[CLS] a [SEP] b [SEP]``."""


# ---- request bodies ----------------------------------------------------------------------------
class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="served model name (default: the first one)")


class TokenizeRequest(_Request):
    inputs: Texts


class FillMaskRequest(_Request):
    inputs: Texts = Field(description="texts holding one or more [MASK] tokens")
    top_k: int = Field(5, description="candidates per [MASK]")


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
            raise PydanticCustomError("inputs", _inputs_problem(value)) from None


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


# ---- helpers -----------------------------------------------------------------------------------
def _as_list(inputs: Texts | list[Pair]) -> list[Any]:
    return [inputs] if isinstance(inputs, str) else list(inputs)


def _inputs_problem(value: Any) -> str:
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


def _round(array: np.ndarray, digits: int = 5) -> list[Any]:
    return np.round(array.astype(np.float64), digits).tolist()


TRIM_SECONDS = 10.0
"""How often the server hands free memory back to the kernel (:func:`release_free_memory`)."""

LoadModels = Callable[[], dict[str, ServedModel]]
"""Loads the served models (name -> model), called once on a thread of its own."""


class Server:
    """The state behind the routes: models, limits, batcher, metrics, readiness."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.models: dict[str, ServedModel] = {}
        self.default = ""
        self.metrics = Metrics()
        self.batcher: Batcher | None = None
        self.ready = False
        """Every model is loaded and has run one forward pass: /health answers 200."""
        self.load_error: BaseException | None = None
        self.draining = False
        """Shutting down: /health answers 503 while the requests in flight are answered."""
        self._stopped = threading.Event()

    def load(self, load: LoadModels, on_failure: Callable[[BaseException], None] | None) -> None:
        """Load the models, run each once (so the first request pays no first-call costs),
        then serve them; a failure goes to ``on_failure`` and the server stays unready."""
        try:
            models = load()
            if not models:
                raise BertforgeError("bertforge serve: give at least one --model DIR")
            for served in models.values():
                served.warm()
            pause_point("serve-ready")  # lets a test see /health while loading
            self.models, self.default = models, next(iter(models))
            self.ready = True
        except BaseException as err:  # noqa: BLE001 - reported; the command then exits
            self.load_error = err
            if on_failure is not None:
                on_failure(err)

    def begin_draining(self) -> None:
        """A signal asked the server to stop: /health answers 503 from now on."""
        self.draining = True

    def start(self) -> None:
        self.batcher = Batcher(
            self.config.max_batch_tokens,
            self._on_batch,
            self.config.batch_wait_ms / 1000,
            self.config.workers,
        )
        self._stopped.clear()
        threading.Thread(target=self._trim, name="bertforge-trim", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self.batcher is not None:
            self.batcher.close()

    def _trim(self) -> None:
        # found by benchmarks/soak_serve.py: under 32 clients for 10 minutes the server's RSS
        # grew by 65% without it, by 12% with it (docs/reliability.md)
        while not self._stopped.wait(TRIM_SECONDS):
            release_free_memory()

    def _on_batch(self, s: BatchStats) -> None:
        self.metrics.batch(s.requests, s.items, s.tokens, s.wait_seconds, s.run_seconds)

    # ---- checks ----
    def model(self, name: str | None, route: str) -> ServedModel:
        name = name or self.default
        served = self.models.get(name)
        if served is None:
            raise ApiError(
                404, f"model {name!r} is not served; served: {', '.join(self.models)}", "model"
            )
        if route not in served.routes:
            need = {"/fill-mask": "masked-lm", "/predict": "classifier", "/attribute": "classifier"}
            needed = need.get(route, "PyTorch")  # /attention of an ONNX Runtime model
            raise ApiError(
                422,
                f"model {name!r} is {_a(served.kind)} model: {route} needs {_a(needed)} model"
                f" ({', '.join(n for n, m in self.models.items() if route in m.routes) or 'none'}"
                " served)",
                "model",
            )
        return served

    def texts(self, inputs: Texts | list[Pair]) -> list[Any]:
        """The request's texts (or ``(text, text_pair)`` pairs) as a list, checked: not empty,
        valid Unicode, at most --max_client_batch_size of them."""
        texts = _as_list(inputs)
        if not texts:
            raise ApiError(422, "inputs is empty; send a text or a list of texts")
        noun = "pair" if isinstance(texts[0], tuple) else "text"
        for i, item in enumerate(texts):
            for text in item if isinstance(item, tuple) else (item,):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as err:  # JSON may escape a lone surrogate: "\ud800"
                    raise ApiError(
                        422,
                        f"{noun} {i + 1} is not valid Unicode ({err.reason} at character "
                        f"{err.start}); send UTF-8 text",
                    ) from err
        limit = self.config.max_client_batch_size
        if len(texts) > limit:
            raise ApiError(
                413,
                f"{len(texts)} {noun}s in one request exceed --max_client_batch_size={limit}; "
                "split the request",
                "max-client-batch-size",
            )
        return texts

    def check_pairing(self, served: ServedModel, paired: bool, route: str) -> None:
        """A model fine-tuned on text pairs takes pairs only, one fine-tuned on single texts
        takes texts only (one ``bertforge finetune`` did not write takes either)."""
        columns = served.pair_columns
        if columns and not paired:
            a, b = columns
            fix = (
                f'send "inputs": [["<{a}>", "<{b}>"], ...] (a list of two texts is two texts, '
                "not one pair)"
                if route == "/predict"
                else f'{route} explains one pair: send "inputs": ["<{a}>", "<{b}>"]'
            )
            raise ApiError(
                422, f"model {served.name!r} was fine-tuned on text pairs ({a!r} + {b!r}): {fix}"
            )
        if paired and served.inputs == "texts":
            column = served.finetuned.get("text_column") or "text"
            one = '"<text>"' if route == "/attribute" else '"<text>" or ["<text>", ...]'
            raise ApiError(
                422,
                f"model {served.name!r} was fine-tuned on single texts ({column!r}), not pairs: "
                f'send "inputs": {one}',
            )

    def length_limit(self, served: ServedModel) -> tuple[int, str]:
        if served.max_length < self.config.max_input_length:
            return served.max_length, f"model {served.name!r}'s max_position_embeddings"
        return self.config.max_input_length, "--max_input_length"

    def lengths(self, served: ServedModel, texts: Sequence[Any], truncate: bool) -> list[int]:
        """Token counts (with [CLS] and [SEP], for a ``(text, text_pair)`` pair of both and
        three specials); a text or pair over the limit is a 413 naming it."""
        limit, name = self.length_limit(served)
        paired = bool(texts) and isinstance(texts[0], tuple)
        lengths = _token_counts(served, texts)
        for i, n in enumerate(lengths):
            if n > limit and not truncate:
                raise ApiError(
                    413,
                    f"{'pair' if paired else 'text'} {i + 1} is {n} tokens long, more than "
                    f"{name}={limit}; shorten it"
                    + ("" if name.startswith("model") else " or send truncate: true"),
                    "max-input-length",
                )
        return [min(n, limit) for n in lengths]

    # ---- inference ----
    async def run(self, key: Hashable, items: list[Any], tokens: int, fn: RunBatch) -> list[Any]:
        assert self.batcher is not None
        future = self.batcher.submit(key, items, tokens, fn)
        try:
            return await asyncio.wrap_future(future)
        except BertforgeError as err:
            raise ApiError(422, str(err)) from err


def _tokens(served: ServedModel, text: str) -> list[dict[str, Any]]:
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


def _token_counts(served: ServedModel, items: Sequence[Any]) -> list[int]:
    """Tokens each text takes with [CLS] and [SEP], or each ``(text, text_pair)`` pair with
    both texts and its three specials, uncut."""
    backend = served.tokenizer.backend
    if items and isinstance(items[0], tuple):
        firsts = backend.encode_batch([a for a, _ in items])
        seconds = backend.encode_batch([b for _, b in items])
        return [len(a.ids) + len(b.ids) + 3 for a, b in zip(firsts, seconds, strict=True)]
    return [len(e.ids) + 2 for e in backend.encode_batch(list(items))]


def _cut_ids(
    served: ServedModel, inputs: str | Pair, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(T,) ids of ``[CLS] text [SEP]`` cut to ``max_tokens``, None for token types, and the
    tokens the whole text takes; for a pair ``[CLS] a [SEP] b [SEP]`` (the longer text cut
    first, as fine-tuning cuts a pair, each text keeping its first tokens) and its (T,) token
    types, 1 from ``b`` on."""
    tok = served.tokenizer
    if isinstance(inputs, str):
        ids = tok.backend.encode(inputs).ids
        full = len(ids) + 2
        ids = [tok.cls_id, *ids[: max_tokens - 2], tok.sep_id]
        return torch.tensor(ids, dtype=torch.long), None, full
    a, b = inputs
    ((pair_ids, len_a),) = encode_examples(tok, [a], [b], max_length=max_tokens)
    ids = torch.tensor(pair_ids, dtype=torch.long)
    types = (torch.arange(len(ids)) >= len_a).long()  # (T,) 0 on [CLS] a [SEP], 1 on b [SEP]
    return ids, types, _token_counts(served, [(a, b)])[0]


def _segments(types: torch.Tensor | None) -> dict[str, list[int]]:
    """An answer's ``token_type_ids`` (which text of a pair each token is of), none for a text."""
    return {} if types is None else {"token_type_ids": types.tolist()}


def create_app(
    config: ServeConfig,
    models: dict[str, ServedModel] | LoadModels,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The FastAPI application serving ``models`` under ``config``'s limits. ``models`` may be a
    function loading them: it runs on a thread when the application starts, and /health
    answers 503 until it is done and each model has run once, 200 after."""
    server = Server(config)
    load = models if callable(models) else lambda: models

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.start()
        loading = threading.Thread(
            target=server.load, args=(load, on_load_failure), name="bertforge-load", daemon=True
        )
        loading.start()
        try:
            yield
        finally:
            server.draining = True
            server.stop()

    app = FastAPI(
        title="bertforge serve",
        summary="BERT inference (fill-mask, classification, embeddings) and its explanations",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = server
    app.add_middleware(Limits, config=server.config, metrics=server.metrics)
    app.add_middleware(Access, server=server)  # added last: runs first
    if config.api_key is not None:
        _declare_bearer(app)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(error_body(err.message, err.kind), err.status, err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 400 and err.__cause__ is not None:
            # FastAPI's "There was an error parsing the body": say why, as for malformed JSON
            return JSONResponse(error_body(_unreadable_body(err.__cause__), "validation"), 422)
        message = f"{request.method} {request.url.path}: {err.detail}"
        if err.status_code == 404:
            message += "; see /docs for the routes"
        return JSONResponse(error_body(message, "http"), err.status_code, err.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, err: Exception) -> JSONResponse:
        # a bug, not the client's fault: say so in one line; the server keeps serving
        return JSONResponse(
            error_body(f"internal error: {type(err).__name__}: {err}", "server"), 500
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(_validation_message(err), "validation"), 422)

    # ---- service routes ----
    @app.get(
        "/health",
        summary="200 once every model is loaded and warmed; 503 while loading or shutting down",
    )
    async def health() -> JSONResponse:
        if server.draining:
            return JSONResponse({"status": "draining"}, 503)
        if not server.ready:
            return JSONResponse({"status": "loading"}, 503, {"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    @app.get("/info", summary="models, their configs and parameter counts, tokenizers, limits")
    async def info() -> dict[str, Any]:
        return {
            "default_model": server.default,
            "models": [m.describe() for m in server.models.values()],
            "limits": config.limits(),
        }

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus text format")
    async def metrics(request: Request) -> PlainTextResponse:
        text = server.metrics.render(
            server.batcher.queue_length, server.metrics.in_flight, server.ready
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # ---- inference routes ----
    @app.post("/tokenize", summary="WordPieces with ids and character offsets")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        served = server.model(body.model, "/tokenize")
        texts = server.texts(body.inputs)  # a body within the payload limit tokenizes in ms
        return JSONResponse([_tokens(served, t) for t in texts])

    @app.post("/fill-mask", summary="top-k candidates for every [MASK]")
    async def fill_mask(body: FillMaskRequest) -> JSONResponse:
        served = server.model(body.model, "/fill-mask")
        texts = server.texts(body.inputs)
        if not 1 <= body.top_k <= config.max_top_k:
            raise ApiError(422, f"top_k={body.top_k} must be between 1 and {config.max_top_k}")
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
            return predict_fill_mask(served.model, served.tokenizer, batch, body.top_k, **options)

        key = (served.name, "fill-mask", body.top_k)
        results = await server.run(key, texts, sum(lengths), run)
        return JSONResponse(results)

    @app.post(
        "/predict",
        summary="labels with scores (or the value of a regressor), of texts or text pairs",
        description="A model fine-tuned on text pairs (`bertforge finetune --text_pair_column`; "
        '/info says `"inputs": "pairs"`) takes `{"inputs": [["<text>", "<text_pair>"], ...]}`, '
        "as `classify(model, tokenizer, texts, pairs)` does in Python; any other takes a text "
        "or a list of texts.",
    )
    async def predict(body: PredictRequest) -> JSONResponse:
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
            texts, pairs = (
                ([a for a, _ in batch], [b for _, b in batch]) if paired else (batch, None)
            )
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

    async def _vectors(
        served: ServedModel,
        texts: list[str],
        pooling: str | None,
        normalize: bool | None,
        truncate: bool,
    ) -> np.ndarray:
        # unset means what the model declares, as `bertforge embed` and embed() do
        declared, declared_norm = served.declared_pooling
        pooling = pooling or declared or "cls"
        normalize = declared_norm if normalize is None else normalize
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
                **options,
            )
            return list(vectors)

        key = (served.name, "embed", pooling, normalize)
        return np.stack(await server.run(key, texts, sum(lengths), run))

    @app.post("/embed", summary="one vector per text")
    async def embed(body: EmbedRequest) -> Response:
        served = server.model(body.model, "/embed")
        texts = server.texts(body.inputs)
        vectors = await _vectors(served, texts, body.pooling, body.normalize, body.truncate)
        # orjson writes float32 arrays directly, in float32's shortest form: ~20x faster than
        # json over Python floats and half the bytes, on the event loop of every request
        payload = orjson.dumps(np.ascontiguousarray(vectors), option=orjson.OPT_SERIALIZE_NUMPY)
        return Response(payload, media_type="application/json")

    @app.post("/similarity", summary="cosine similarity matrix of the texts' vectors")
    async def similarity(body: SimilarityRequest) -> JSONResponse:
        served = server.model(body.model, "/similarity")
        texts = server.texts(body.inputs)
        if len(texts) < 2:
            raise ApiError(422, "inputs needs at least 2 texts to compare")
        vectors = await _vectors(served, texts, body.pooling, True, body.truncate)
        return JSONResponse({"similarity": _round(vectors @ vectors.T)})

    def _explained_ids(
        served: ServedModel, inputs: str | Pair, max_tokens: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """Ids, token types (None for one text) and whether cut, of what /attention and
        /attribute explain."""
        paired = not isinstance(inputs, str)
        server.texts([inputs] if paired else inputs)  # valid Unicode
        limit = min(config.max_attention_tokens, served.max_length)
        least = 4 if paired else 2  # [CLS] a [SEP] b [SEP] keeps a token of a text
        if max_tokens is not None and not least <= max_tokens <= limit:
            raise ApiError(
                422,
                f"max_tokens={max_tokens} must be between {least} and {limit}"
                + (" for a pair" if paired else ""),
            )
        ids, types, n = _cut_ids(served, inputs, max_tokens or limit)
        if max_tokens is None and n > limit:
            raise ApiError(
                413,
                f"the {'pair' if paired else 'text'} is {n} tokens long, more than "
                f"--max_attention_tokens={limit} (attention grows with the square of the "
                "length); shorten it or send max_tokens",
                "max-attention-tokens",
            )
        return ids, types, n > len(ids)

    @app.post(
        "/attention",
        summary="tokens and attention probabilities per layer and head, of a text or a pair",
    )
    async def attention(body: AttentionRequest) -> Response:
        served = server.model(body.model, "/attention")
        ids, types, cut = _explained_ids(served, body.inputs, body.max_tokens)

        def run(batch: list[torch.Tensor]) -> list[bytes]:
            device = _device(served)
            on_device = None if types is None else types.to(device)
            maps = attention_maps(served.encoder, batch[0].to(device), on_device)  # (L, nh, T, T)
            tok = served.tokenizer
            answer = {
                "model": served.name,
                "tokens": [tok.id_to_token(int(i)) for i in batch[0]],
                **_segments(types),
                "truncated": cut,
                "layers": int(maps.shape[0]),
                "heads": int(maps.shape[1]),
                "attentions": _round(maps.cpu().numpy(), 4),
            }
            return [json.dumps(answer).encode()]

        key = object()  # never batched: one (L, nh, T, T) answer each
        (payload,) = await server.run(key, [ids], len(ids) ** 2, run)
        return Response(payload, media_type="application/json")

    @app.post(
        "/attribute",
        summary="integrated-gradients attribution of a classifier's output, of a text or a pair",
        description='A pair, `{"inputs": ["<text>", "<text_pair>"]}`, is explained over the '
        "tokens of both texts, `[CLS] a [SEP] b [SEP]`, and the answer's `token_type_ids` "
        "say which text each token is of (1: the second).",
    )
    async def attribute(body: AttributeRequest) -> JSONResponse:
        served = server.model(body.model, "/attribute")
        paired = not isinstance(body.inputs, str)
        server.check_pairing(served, paired, "/attribute")
        if not 1 <= body.steps <= config.max_attribution_steps:
            raise ApiError(
                422,
                f"steps={body.steps} must be between 1 and "
                f"--max_attribution_steps={config.max_attribution_steps}",
                "max-attribution-steps",
            )
        ids, types, cut = _explained_ids(served, body.inputs, body.max_tokens)
        labels = served.labels()
        regression = served.model.config.is_regression
        target = None
        if body.target is not None:
            if regression:
                raise ApiError(422, f"model {served.name!r} is a regressor: it has no target label")
            if body.target not in labels:
                raise ApiError(422, f"target {body.target!r} is not a label; labels: {labels}")
            target = labels.index(body.target)
        steps = body.steps
        chunk = max(1, config.max_batch_tokens // len(ids))

        def run(batch: list[torch.Tensor]) -> list[dict[str, Any]]:
            x = batch[0].to(_device(served))
            x_types = None if types is None else types.to(x.device)
            tok = served.tokenizer
            with torch.inference_mode():
                type_batch = None if x_types is None else x_types[None]  # (1, T)
                logits = served.model(x[None], token_type_ids=type_batch).logits[0].float()
            answer: dict[str, Any] = {"model": served.name, "truncated": cut}
            if regression:
                answer["value"] = float(logits[0])
                index = 0
            else:
                probs = torch.softmax(logits, -1)
                answer["label"] = labels[int(probs.argmax())]
                answer["scores"] = {n: float(p) for n, p in zip(labels, probs, strict=True)}
                index = int(probs.argmax()) if target is None else target
                answer["target"] = labels[index]
            special = torch.tensor(np.isin(x.cpu().numpy(), tok.special_ids)).to(x.device)
            # [CLS] [PAD] ... [PAD] [SEP] (a pair: [CLS] [PAD] ... [SEP] [PAD] ... [SEP])
            baseline = torch.where(special, x, tok.pad_id)
            result = integrated_gradients(
                served.model, x, baseline, index, steps, chunk, token_type_ids=x_types
            )
            answer.update(
                tokens=[tok.id_to_token(int(i)) for i in x],
                **_segments(types),
                attributions=result.attributions.cpu().tolist(),
                steps=steps,
                output=result.output,
                baseline_output=result.baseline_output,
                delta=result.delta,
                baseline="[CLS] [PAD]... [SEP]" + (" [PAD]... [SEP]" if paired else ""),
            )
            return [answer]

        key = object()  # never batched: its steps are the batch
        (answer,) = await server.run(key, [ids], len(ids) * steps, run)
        return JSONResponse(answer)

    app.include_router(tasks_router)  # /tag, /answer

    # ---- the page and the docs ----
    static = resources.files("bertforge.serve") / "static"

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse((static / "index.html").read_text(encoding="utf-8"))

    @app.get("/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        types = {"app.js": "text/javascript", "style.css": "text/css"}
        if name not in types:
            raise ApiError(404, f"no static file {name!r}", "not-found")
        return Response((static / name).read_text(encoding="utf-8"), media_type=types[name])

    _add_docs(app)
    return app


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a classifier", "an encoder"."""
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _device(served: ServedModel) -> torch.device:
    return next(served.model.parameters()).device


SEND_JSON = 'send a UTF-8 JSON object such as {"inputs": "a text"} (fields per route: /docs)'


def _unreadable_body(cause: BaseException) -> str:
    """Why a body could not be parsed as JSON at all, and what to send instead."""
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return f"the body is not UTF-8 (byte 0x{byte} at position {cause.start}); {SEND_JSON}"
    if isinstance(cause, RecursionError):
        return f"the body's JSON is nested too deeply to parse; {SEND_JSON}"
    return f"the body could not be parsed as JSON ({type(cause).__name__}); {SEND_JSON}"


def _validation_message(err: RequestValidationError) -> str:
    """One line from pydantic's error list: where, what, and for JSON what was received."""
    parts = []
    for e in err.errors()[:3]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            parts.append(
                f"malformed JSON at character {e['loc'][-1]}: {ctx.get('error', '')}; {SEND_JSON}"
            )
        elif e.get("type") == "missing":
            parts.append(f"{where}: required field missing")
        elif e.get("type") == "extra_forbidden":
            parts.append(f"{where}: unknown field")
        else:
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = len(err.errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _declare_bearer(app: FastAPI) -> None:
    """Say in the OpenAPI document that every route takes ``Authorization: Bearer KEY``, so
    /docs shows an Authorize button and its "Try it out" sends the key."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain()
            schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes["bearer"] = {"type": "http", "scheme": "bearer"}
            schema["security"] = [{"bearer": []}]
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the ``swagger-ui-bundle`` package (no CDN); without it, a
    plain list of the routes linking to ``/openapi.json``."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        swagger_ui_path = None

    if swagger_ui_path is not None:
        app.mount("/docs-assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        if swagger_ui_path is None:
            rows = "".join(
                f"<li><code>{', '.join(sorted(r.methods))} {r.path}</code> {r.summary or ''}</li>"
                for r in app.routes
                if getattr(r, "include_in_schema", False) and hasattr(r, "methods")
            )
            return HTMLResponse(
                f"<h1>bertforge serve</h1><p><a href='/openapi.json'>openapi.json</a></p>"
                f"<ul>{rows}</ul>"
            )
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="bertforge serve: API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon-32x32.png",
        )


__all__ = ["create_app", "Server"]
