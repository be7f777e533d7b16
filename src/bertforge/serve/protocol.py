"""uvicorn's HTTP/1.1 protocol with one more timeout: a connection must complete each request's
headers within the request timeout of connecting or of its previous answer. uvicorn's own
keep-alive timeout starts only after a first answer and stops at the next byte, so without
this a client that connects and sends nothing (or one byte a minute) would keep its connection
forever; the body and the answer are bounded by ``Limits``."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


def timed_protocol(header_timeout: float) -> type[H11Protocol]:
    """An ``H11Protocol`` class closing connections whose first request's headers do not arrive
    within ``header_timeout`` seconds."""

    class TimedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _waiting_since: Any = None

        def _expect_headers(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._waiting_since = self.cycle  # the next request replaces this cycle
            self._header_timer = self.loop.call_later(header_timeout, self._headers_overdue)

        def _headers_overdue(self) -> None:
            if self.cycle is self._waiting_since and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._expect_headers()

        def on_response_complete(self) -> None:
            self._expect_headers()  # first: a pipelined request may start a new cycle in there
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

    return TimedH11Protocol


__all__ = ["timed_protocol"]
