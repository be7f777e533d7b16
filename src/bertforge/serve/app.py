"""The HTTP application, assembled: the server (:mod:`~bertforge.serve.server`), the middleware
(:class:`~bertforge.serve.access.Access` outermost, then
:class:`~bertforge.serve.limits.Limits`), the error handlers (:mod:`~bertforge.serve.handlers`)
and the routers (:mod:`~bertforge.serve.routes`): JSON routes named after
text-embeddings-inference where one exists, TEI's own API and OpenAI's embeddings API for their
clients, the explorer page at ``/`` and OpenAPI docs at ``/docs``, all served from this
package.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from bertforge.serve.access import Access
from bertforge.serve.config import ServeConfig
from bertforge.serve.handlers import EXCEPTION_HANDLERS
from bertforge.serve.limits import Limits
from bertforge.serve.models import ServedModel
from bertforge.serve.routes import explain, inference, meta, openai, tasks, tei
from bertforge.serve.server import LoadModels, Server


def create_app(
    config: ServeConfig,
    models: dict[str, ServedModel] | LoadModels,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The FastAPI application serving ``models`` under ``config``'s limits. ``models`` may be a
    function loading them: it runs on a thread when the application starts, and /health
    answers 503 until it is done and each model is warmed up (:mod:`~bertforge.serve.warmup`),
    200 after."""
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
            # a model still loading is inside torch: exiting under it aborts the process
            # (status 134); once loaded, the stop above makes the thread return at once
            loading.join()

    app = FastAPI(
        title="bertforge serve",
        summary="BERT inference (fill-mask, classification, embeddings) and its explanations",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.server = server
    app.add_middleware(Limits, config=server.config, metrics=server.metrics)
    app.add_middleware(Access, server=server)  # added last: runs first
    if config.api_key is not None:
        meta.declare_bearer(app)
    routers = (meta.router, inference.router, explain.router, tasks.router, tei.router)
    for router in (*routers, openai.router, meta.pages):
        app.include_router(router)
    meta.mount_docs_assets(app)
    return app


__all__ = ["Server", "create_app"]
