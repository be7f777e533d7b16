"""``bertforge serve``: an inference server (FastAPI + uvicorn) and a web page to explore what
a model learned.

* :mod:`~bertforge.serve.config`: :class:`ServeConfig`, the limits and where to listen;
* :mod:`~bertforge.serve.models`: the served models, loaded once;
* :mod:`~bertforge.serve.batcher`: dynamic batching on one inference thread;
* :mod:`~bertforge.serve.access`: request ids, the API key, readiness, the access log and the
  request metrics (the outermost ASGI middleware);
* :mod:`~bertforge.serve.limits`: payload, concurrency and time limits (ASGI middleware);
* :mod:`~bertforge.serve.schemas`: the JSON request bodies (pydantic models, the OpenAPI
  document);
* :mod:`~bertforge.serve.server`: :class:`Server`, the state behind the routes (models,
  batcher, the request checks, readiness);
* :mod:`~bertforge.serve.handlers`: every exception as one JSON error answer;
* :mod:`~bertforge.serve.routes`: one ``APIRouter`` per feature of top-level handlers taking
  the server as a dependency (``meta``: /health /info /metrics, the page in ``static/`` and
  /docs; ``inference``; ``explain``);
* :mod:`~bertforge.serve.app`: ``create_app`` assembles the server, middleware, handlers and
  routers;
* :mod:`~bertforge.serve.protocol`: uvicorn's HTTP/1.1 with a deadline for request headers.
* :mod:`~bertforge.serve.lifecycle`: uvicorn with TLS, the access log on stderr, and a SIGTERM
  that answers the requests in flight and exits 0.

The command line is ``bertforge.cli.serve``; attention maps, integrated gradients and the
attribution of a prediction (``attribute``) are library functions in
``bertforge.inference.explain``.

Needs the ``serve`` extra (``pip install 'bertforge[serve]'``); the rest of bertforge does not.
"""

from bertforge.serve.config import ServeConfig

__all__ = ["ServeConfig"]
