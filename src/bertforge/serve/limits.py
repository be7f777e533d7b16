"""The limits every request passes before any route sees it: payload size (413), requests in
flight (429), and a deadline from the first byte to the answer (408 while the body is still
arriving, 503 after), so a slow or stalled client cannot hold a slot. (Each answer is counted
for /metrics by :class:`~bertforge.serve.access.Access`, which runs before this.)

Written as a plain ASGI middleware: it reads the body itself (bounded in bytes and time) and
hands the application a replay of it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bertforge.serve.config import ServeConfig
from bertforge.serve.metrics import Metrics

Scope = dict[str, Any]
Message = dict[str, Any]

#: routes counted under their own name in /metrics; anything else is "other", so random paths
#: (a fuzzer, a scanner) cannot grow the metrics without bound
ROUTES = (
    "/",
    "/health",
    "/info",
    "/metrics",
    "/tokenize",
    "/fill-mask",
    "/predict",
    "/embed",
    "/similarity",
    "/attention",
    "/attribute",
    "/tag",
    "/answer",
    "/rerank",
    "/docs",
    "/openapi.json",
    "/v1/embeddings",
    "/v1/models",
    "/tei",
    "/tei/embed",
    "/tei/predict",
    "/tei/rerank",
    "/tei/tokenize",
    "/tei/info",
    "/tei/health",
)
PREFIXES = ("/static/", "/docs-assets/", "/v1/models/")


class ApiError(Exception):
    """An answer other than 200, raised by a route: status, one-line message, error type, and
    the request field at fault (``param``, which OpenAI's error shape names)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "validation",
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers
        self.param = param


def error_body(message: str, kind: str) -> dict[str, str]:
    """The JSON of every error answer (the shape text-embeddings-inference uses)."""
    return {"error": message, "error_type": kind}


OPENAI_PREFIX = "/v1/"
"""Paths answered in OpenAI's shapes (:mod:`~bertforge.serve.routes.openai`), errors included."""

#: OpenAI's ``code`` for the kinds of error it has one for (null for a plain bad request, as
#: OpenAI's; the other kinds keep ours)
OPENAI_CODES: dict[str, str | None] = {
    "unauthorized": "invalid_api_key",
    "max-input-length": "context_length_exceeded",
    "max-concurrent-requests": "rate_limit_exceeded",
    "validation": None,
    "http": None,
}


def openai_error(
    status: int, message: str, kind: str, param: str | None = None
) -> tuple[int, dict[str, dict[str, str | None]]]:
    """``(status, body)`` of an error in OpenAI's shape, ``{"error": {"message", "type",
    "param", "code"}}``, with the statuses its API answers (and its client turns into
    exceptions): what the client sent wrong is a 400 ``invalid_request_error`` (where we answer
    413 or 422: ``openai.BadRequestError``), 401/404/429 stay, a failure of ours is a
    ``server_error``."""
    if status in (413, 422):
        status = 400
    if status == 429:
        kind_said = "rate_limit_error"
    elif status >= 500:
        kind_said = "server_error"
    else:
        kind_said = "invalid_request_error"
    if kind == "model" and status == 404:
        code: str | None = "model_not_found"
    else:
        code = OPENAI_CODES.get(kind, kind)
    return status, {"error": {"message": message, "type": kind_said, "param": param, "code": code}}


def error_answer(
    path: str, status: int, message: str, kind: str, param: str | None = None
) -> tuple[int, dict[str, object]]:
    """``(status, body)`` of an error answer to ``path``: OpenAI's shape under /v1/, ours
    (text-embeddings-inference's) everywhere else."""
    if path.startswith(OPENAI_PREFIX):
        return openai_error(status, message, kind, param)
    return status, dict(error_body(message, kind))


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    for prefix in PREFIXES:
        if path.startswith(prefix):
            return prefix.rstrip("/")
    return "other"


class _TooLarge(Exception):
    pass


class Limits:
    """ASGI middleware enforcing the server's request limits (``config``) and counting each
    answer and the requests in flight in ``metrics``."""

    def __init__(self, app: Any, config: ServeConfig, metrics: Metrics) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.config
        start = time.perf_counter()
        deadline = start + config.request_timeout
        status = [0]

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        async def refuse(code: int, message: str, kind: str, **headers: str) -> None:
            code, answer = error_answer(scope["path"], code, message, kind)
            body = json.dumps(answer).encode()
            await send_counted(
                {
                    "type": "http.response.start",
                    "status": code,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *((k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()),
                    ],
                }
            )
            await send_counted({"type": "http.response.body", "body": body})

        counted = False
        try:
            if scope["method"] == "POST":
                if self.metrics.in_flight >= config.max_concurrent_requests:
                    await refuse(
                        429,
                        f"too many requests in flight: --max_concurrent_requests="
                        f"{config.max_concurrent_requests}; retry shortly",
                        "max-concurrent-requests",
                        retry_after="1",
                    )
                    return
                self.metrics.in_flight += 1
                counted = True
                # every POST route takes JSON: read the body as JSON whatever the client declared
                # (curl -d says form-urlencoded)
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
            declared = _content_length(scope)
            if declared is not None and declared > config.max_payload_bytes:
                await refuse(413, _too_large(declared, config.max_payload_bytes), "payload-size")
                return
            try:
                body = await asyncio.wait_for(
                    _read_body(receive, config.max_payload_bytes), deadline - time.perf_counter()
                )
            except _TooLarge:
                await refuse(413, _too_large(None, config.max_payload_bytes), "payload-size")
                return
            except TimeoutError:
                await refuse(
                    408,
                    f"the request body did not arrive within --request_timeout="
                    f"{config.request_timeout:g} s",
                    "request-timeout",
                )
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # waits for the disconnect

            try:
                await asyncio.wait_for(
                    self.app(scope, replay, send_counted), deadline - time.perf_counter()
                )
            except TimeoutError:
                if status[0] == 0:
                    await refuse(
                        503,
                        f"no answer within --request_timeout={config.request_timeout:g} s "
                        "(the server is overloaded or the request is too big)",
                        "request-timeout",
                    )
                # else the answer had started: the connection closes mid-answer
        finally:
            if counted:
                self.metrics.in_flight -= 1


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else "the request body"
    return f"{what} exceed --max_payload_bytes={limit}; send fewer or shorter texts"


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


__all__ = [
    "OPENAI_PREFIX",
    "ApiError",
    "Limits",
    "error_answer",
    "error_body",
    "openai_error",
    "route_label",
]
