"""The routes, one ``APIRouter`` per feature, each a module of top-level handler functions that
receive the shared :class:`~bertforge.serve.server.Server` as a FastAPI dependency:

* :mod:`~bertforge.serve.routes.meta`: /health, /info, /metrics, the page at ``/`` and /docs;
* :mod:`~bertforge.serve.routes.inference`: /tokenize, /fill-mask, /predict, /embed, /similarity;
* :mod:`~bertforge.serve.routes.explain`: /attention and /attribute;
* :mod:`~bertforge.serve.routes.tasks`: /tag and /answer (token classifiers, question answering);
* :mod:`~bertforge.serve.routes.tei`: /rerank, and text-embeddings-inference's API for its
  clients (/tei/..., POST /);
* :mod:`~bertforge.serve.routes.openai`: OpenAI's /v1/embeddings and /v1/models.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import torch
from fastapi import Depends, Request

from bertforge.serve.models import ServedModel
from bertforge.serve.server import Server


async def get_server(request: Request) -> Server:
    """The application's server (``create_app`` sets ``app.state.server``). A coroutine, so
    FastAPI calls it on the event loop: a plain function would be sent to its thread pool on
    every request, whose threads (up to 40, coming and going with the load) each take a glibc
    heap of their own; under the soak's 32 clients those heaps grew for minutes after ready
    (``/proc/PID/smaps``: the threads' 64 MiB heaps +60 MiB from 30 s to 150 s of load)."""
    return request.app.state.server


ServerDep = Annotated[Server, Depends(get_server)]
"""A handler's ``server: ServerDep`` parameter receives the shared server."""


def rounded(array: np.ndarray, digits: int = 5) -> list[Any]:
    """``array`` as nested lists of floats rounded to ``digits``: short JSON."""
    return np.round(array.astype(np.float64), digits).tolist()


def device_of(served: ServedModel) -> torch.device:
    return next(served.model.parameters()).device


__all__ = ["ServerDep", "device_of", "get_server", "rounded"]
