"""Connections that must send a request: uvicorn's HTTP/1.1 protocol (h11) with a deadline for a request's head.

uvicorn starts no timer when a connection opens (its keep-alive timeout begins after a first response, and any byte
that arrives stops it), and it counts every open socket towards ``--limit-concurrency``: a few hundred sockets that
send nothing, or a header byte now and then, would hold every place and leave each honest request a 503.
:func:`header_deadline_protocol` gives uvicorn a protocol that closes a connection which has not sent a whole
request line and headers within ``--header-timeout`` seconds of opening (or of its previous response); the body
then has ``--body-timeout`` (:class:`transformer_xl.serve.guard.BodyGuard`).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["header_deadline_protocol"]


def header_deadline_protocol(seconds: float) -> type:
    """uvicorn's ``H11Protocol`` closing a connection whose request head is not in within ``seconds``."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):  # type: ignore[misc]
        header_timeout = float(seconds)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline: Any = None
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(self.header_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if self.cycle is None or self.cycle.response_complete:  # still waiting for a request's head
                self.timeout_keep_alive_handler()  # uvicorn's own way to close an idle connection

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:  # a head arrived: the body's turn
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's head

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline
