"""Who asks, and what became of it: the outermost ASGI middleware of the server.

Every request gets an id (the client's ``X-Request-Id`` when it sends a sane one, a new one
otherwise), echoed in the answer's ``X-Request-Id``; the API key is checked (401 without it);
the routes that need the models answer 503 while they load; and every answer is counted for
/metrics and written as one access-log line (method, route, status, milliseconds, request id).
It runs before :class:`~bertforge.serve.limits.Limits`, so a client without the key can
neither hold a slot nor make the server read its body.

The key is compared in constant time and never written anywhere: the log names the route,
never the headers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

from bertforge.serve.config import ServeConfig
from bertforge.serve.limits import error_answer, route_label
from bertforge.serve.metrics import Metrics


class ServerState(Protocol):
    """What this middleware reads of the server (``serve.server.Server`` has it): declared here so
    that this module, below the app, never imports it."""

    config: ServeConfig
    metrics: Metrics
    ready: bool
    draining: bool


Scope = dict[str, Any]
Message = dict[str, Any]

LOGGER = logging.getLogger("bertforge.serve.access")

#: answered without the key: the server's health, and the page and the API docs, which hold
#: no model and no answer (a browser opening them cannot send a header; the page then asks
#: for the key and sends it with every request)
PUBLIC = ("/health", "/tei/health", "/", "/docs", "/openapi.json")
PUBLIC_PREFIXES = ("/static/", "/docs-assets/")
#: answered while the models load, besides the public pages (the rest answer 503)
WITHOUT_MODELS = ("/metrics",)

_SANE_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")


def is_public(path: str) -> bool:
    return path in PUBLIC or path.startswith(PUBLIC_PREFIXES)


def bearer_matches(authorization: bytes | None, key: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <key>``. The token and the key are
    compared as SHA-256 digests with :func:`hmac.compare_digest`, so the time taken tells
    nothing of the key, its length included."""
    if authorization is None:
        return False
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    given = hashlib.sha256(token.strip()).digest()
    return hmac.compare_digest(given, hashlib.sha256(key.encode("utf-8")).digest())


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-Id`` when it is 1-128 characters of letters, digits and
    ``._:@/+=-`` (so a log line cannot be forged through it), else a new random one."""
    for name, value in headers:
        if name == b"x-request-id" and _SANE_ID.fullmatch(value):
            return value.decode("ascii")
    return uuid.uuid4().hex


def access_line(log_format: str, method: str, route: str, status: int, ms: float, rid: str) -> str:
    """One access-log line: ``text`` for people, ``json`` (one object) for log collectors."""
    when = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if log_format == "json":
        record = {
            "time": when,
            "method": method,
            "route": route,
            "status": status,
            "ms": round(ms, 2),
            "request_id": rid,
        }
        return json.dumps(record, separators=(",", ":"))
    return f"{when} {method} {route} {status} {ms:.1f}ms id={rid}"


class Access:
    """ASGI middleware: request id, key, readiness, metrics and the access log."""

    def __init__(self, app: Any, server: ServerState) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        server, config = self.server, self.server.config
        rid = request_id(scope["headers"])
        path = scope["path"]
        status = [0]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [*message.get("headers", ()), (b"x-request-id", rid.encode())]
                message = {**message, "headers": headers}
            await send(message)

        async def refuse(code: int, message: str, kind: str, headers: list) -> None:
            code, answer = error_answer(path, code, message, kind)
            body = json.dumps(answer).encode()
            await send_with_id(
                {
                    "type": "http.response.start",
                    "status": code,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *headers,
                    ],
                }
            )
            await send_with_id({"type": "http.response.body", "body": body})

        # the page and the docs are public to read; a POST to / is TEI's inference route
        public = scope["method"] in ("GET", "HEAD") and is_public(path)
        try:
            if config.api_key is not None and not public:
                authorization = next(
                    (v for k, v in scope["headers"] if k == b"authorization"), None
                )
                if not bearer_matches(authorization, config.api_key):
                    said = "a wrong key" if authorization else "no key"
                    await refuse(
                        401,
                        f"this server needs an API key and the request sent {said}: send the "
                        "header 'Authorization: Bearer KEY'",
                        "unauthorized",
                        [(b"www-authenticate", b"Bearer")],
                    )
                    return
            if not server.ready and not public and path not in WITHOUT_MODELS:
                await refuse(
                    503,
                    "the models are still loading; retry shortly (GET /health answers 200 "
                    "once they are ready)",
                    "loading",
                    [(b"retry-after", b"1")],
                )
                return
            try:
                await self.app(scope, receive, send_with_id)
            except asyncio.CancelledError:
                if not (server.draining and status[0] == 0):
                    raise
                # uvicorn cancels what is still running at --shutdown_timeout; say so, in the
                # JSON every other error has (uvicorn would answer a bare 500)
                await refuse(
                    503,
                    f"the server is shutting down and this request did not finish within "
                    f"--shutdown_timeout={config.shutdown_timeout:g} s; send it again",
                    "shutting-down",
                    [(b"connection", b"close")],
                )
        finally:
            seconds = time.perf_counter() - start
            route = route_label(path)
            answered = status[0] or 500  # nothing sent: the application failed
            server.metrics.request(route, answered, seconds)
            if config.access_log:
                LOGGER.info(
                    access_line(
                        config.log_format, scope["method"], route, answered, seconds * 1e3, rid
                    )
                )


__all__ = ["Access", "access_line", "bearer_matches", "is_public", "request_id"]
