"""The service routes (/health, /info, /metrics), the explorer page at ``/`` with its static
files, and the API docs at ``/docs`` (Swagger UI from the ``swagger-ui-bundle`` package, no CDN;
without it, a plain list of the routes linking to ``/openapi.json``)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from bertforge.serve.limits import ApiError
from bertforge.serve.routes import ServerDep
from bertforge.serve.routes.tei import tei_info

router = APIRouter()
"""/health, /info and /metrics."""

pages = APIRouter(include_in_schema=False)
"""The page, its static files and /docs: not API routes, so not in the OpenAPI document."""

STATIC = resources.files("bertforge.serve") / "static"


@router.get(
    "/health",
    summary="200 once every model is loaded and warmed; 503 while loading (with the warm-up's "
    "progress once it runs) or shutting down",
)
async def health(server: ServerDep) -> JSONResponse:
    if server.draining:
        return JSONResponse({"status": "draining"}, 503)
    if not server.ready:
        body: dict[str, Any] = {"status": "loading"}
        if server.warming is not None:  # the models are loaded: how far the warm-up is
            body["warm_up"] = server.warming.describe()
        return JSONResponse(body, 503, {"Retry-After": "1"})
    return JSONResponse({"status": "ok"})


@router.get(
    "/info",
    summary="models, their configs and parameter counts, tokenizers, limits (and TEI's /info "
    "fields of the default model)",
)
async def info(server: ServerDep) -> dict[str, Any]:
    return {
        **tei_info(server, server.models[server.default]),
        "default_model": server.default,
        "models": [m.describe() for m in server.models.values()],
        "limits": server.config.limits(),
    }


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus text format")
async def metrics(request: Request, server: ServerDep) -> PlainTextResponse:
    text = server.metrics.render(
        server.batcher.queue_length, server.metrics.in_flight, server.ready
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@pages.get("/", response_class=HTMLResponse)
async def page() -> HTMLResponse:
    return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))


@pages.get("/static/{name}")
async def asset(name: str) -> Response:
    types = {"app.js": "text/javascript", "style.css": "text/css"}
    if name not in types:
        raise ApiError(404, f"no static file {name!r}", "not-found")
    return Response((STATIC / name).read_text(encoding="utf-8"), media_type=types[name])


@pages.get("/docs")
async def docs(request: Request) -> HTMLResponse:
    from fastapi.openapi.docs import get_swagger_ui_html

    if _swagger_ui_path() is None:
        # from the OpenAPI document: an app's routes may sit in included routers
        rows = "".join(
            f"<li><code>{', '.join(sorted(m.upper() for m in ops))} {path}</code> "
            f"{next(iter(ops.values())).get('summary') or ''}</li>"
            for path, ops in request.app.openapi()["paths"].items()
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


def _swagger_ui_path() -> str | None:
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    return swagger_ui_path


def mount_docs_assets(app: FastAPI) -> None:
    """Serve Swagger UI's files at ``/docs-assets`` (when ``swagger-ui-bundle`` is installed)."""
    from fastapi.staticfiles import StaticFiles

    path = _swagger_ui_path()
    if path is not None:
        app.mount("/docs-assets", StaticFiles(directory=path), name="docs-assets")


def declare_bearer(app: FastAPI) -> None:
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


__all__ = ["declare_bearer", "mount_docs_assets", "pages", "router"]
