"""Connections that must send a request: uvicorn's HTTP/1.1 protocol (h11) with a deadline for a request's head.

uvicorn starts no timer when a connection opens (its keep-alive timeout begins after a first response, and any byte
that arrives stops it), and it counts every open socket towards ``--limit-concurrency``: a few hundred sockets that
send nothing, or a header byte now and then, would hold every place and leave each honest request a 503.
:func:`header_deadline_protocol` gives uvicorn a protocol that closes a connection which has not sent a whole
request line and headers within ``--header-timeout`` seconds of opening (or of its previous response); the body
then has ``--body-timeout`` (:class:`transformer_xl.serve.guard.BodyGuard`).

A refusal sent before the request's body is read (413, 408, 415) ends the connection, and uvicorn closed it at once.
A client that writes its whole body before it reads the answer (Python's ``urllib``) was then still writing: the
kernel answered its bytes with a reset, and the client saw a broken pipe, its answer lost. The protocol here closes
such a connection as nginx does (its *lingering close*): it sends the answer and its end (a FIN), then reads and
drops what the client still sends, for at most :data:`LINGER_BYTES` bytes and :data:`LINGER_SECONDS` seconds, and
closes when the client has sent all (or stops, or goes).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LINGER_BYTES", "LINGER_SECONDS", "header_deadline_protocol"]

#: The most bytes read and dropped after a refusal sent before the request's body was read.
LINGER_BYTES = 64 << 20
#: The most seconds a connection stays open for them.
LINGER_SECONDS = 5.0


class LingeringTransport:
    """The connection's transport as uvicorn sees it: ``close()`` while the request's body is still coming starts
    the protocol's lingering close (module docstring); everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if not self._protocol.linger():
            self._transport.close()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


def header_deadline_protocol(seconds: float) -> type:
    """uvicorn's ``H11Protocol`` closing a connection whose request head is not in within ``seconds``, and one
    answered before its body was read with a lingering close (module docstring)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):  # type: ignore[misc]
        header_timeout = float(seconds)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.raw_transport = transport
            self.transport = LingeringTransport(transport, self)  # what each request's cycle is given
            self._deadline: Any = None
            self.lingering = False
            self._linger_left = LINGER_BYTES
            self._arm()

        def linger(self) -> bool:
            """Start a lingering close if the client is still sending the request's body; whether it started."""
            if self.lingering or self.raw_transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
                return False
            self.lingering = True
            self._disarm()
            self._deadline = self.loop.call_later(LINGER_SECONDS, self.raw_transport.close)
            if self.raw_transport.can_write_eof():
                self.raw_transport.write_eof()  # the answer is whole: no more bytes from this side
            self.raw_transport.resume_reading()  # uvicorn pauses reading while a body waits to be read
            return True

        def data_received(self, data: bytes) -> None:
            if not self.lingering:
                return super().data_received(data)
            self._linger_left -= len(data)  # dropped
            if self._linger_left < 0:
                self.raw_transport.close()
            return None

        def eof_received(self) -> bool | None:
            if self.lingering:  # the client has sent all it will
                self.raw_transport.close()
                return None
            return super().eof_received()

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
