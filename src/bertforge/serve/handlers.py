"""How every failure becomes an answer: one JSON error body (``limits.error_body``; OpenAI's
shape under /v1/, ``limits.error_answer``) with a message that names what is wrong and how to
fix it, for the routes' own errors (``ApiError``), Starlette's (unknown route, wrong method,
unreadable body), pydantic's validation errors and a bug (500, the server keeps serving)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertforge.serve.limits import ApiError, error_answer

SEND_JSON = 'send a UTF-8 JSON object such as {"inputs": "a text"} (fields per route: /docs)'


def _answer(
    request: Request,
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    status, body = error_answer(request.url.path, status, message, kind, param)
    return JSONResponse(body, status, headers)


async def api_error(request: Request, err: ApiError) -> JSONResponse:
    return _answer(request, err.status, err.message, err.kind, err.param, err.headers)


async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    if err.status_code == 400 and err.__cause__ is not None:
        # FastAPI's "There was an error parsing the body": say why, as for malformed JSON
        return _answer(request, 422, unreadable_body(err.__cause__), "validation")
    message = f"{request.method} {request.url.path}: {err.detail}"
    if err.status_code == 404:
        message += "; see /docs for the routes"
    return _answer(request, err.status_code, message, "http", headers=err.headers)


async def crash(request: Request, err: Exception) -> JSONResponse:
    # a bug, not the client's fault: say so in one line; the server keeps serving
    return _answer(request, 500, f"internal error: {type(err).__name__}: {err}", "server")


async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    return _answer(request, 422, validation_message(err), "validation", invalid_field(err))


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Any], Awaitable[JSONResponse]]] = {
    ApiError: api_error,
    StarletteHTTPException: http_error,
    Exception: crash,
    RequestValidationError: invalid,
}
"""Exception class -> handler, as ``FastAPI(exception_handlers=...)`` takes them."""


def unreadable_body(cause: BaseException) -> str:
    """Why a body could not be parsed as JSON at all, and what to send instead."""
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return f"the body is not UTF-8 (byte 0x{byte} at position {cause.start}); {SEND_JSON}"
    if isinstance(cause, RecursionError):
        return f"the body's JSON is nested too deeply to parse; {SEND_JSON}"
    return f"the body could not be parsed as JSON ({type(cause).__name__}); {SEND_JSON}"


def invalid_field(err: RequestValidationError) -> str | None:
    """The body field of pydantic's first error (``input``, ``dimensions``), None for the body
    as a whole."""
    errors = err.errors()
    loc = [str(x) for x in (errors[0].get("loc", ()) if errors else ()) if x != "body"]
    return loc[0] if loc and not loc[0].isdigit() else None


def validation_message(err: RequestValidationError) -> str:
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


__all__ = ["EXCEPTION_HANDLERS", "invalid_field", "unreadable_body", "validation_message"]
