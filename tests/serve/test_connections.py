"""Connections that must send a request: a deadline for a request's head (``--header-timeout``), through a live
server and real sockets. uvicorn alone keeps a silent connection open for ever and counts it towards
``--limit-concurrency``: a handful of silent sockets made every honest request a 503."""

from __future__ import annotations

import socket
import time

import pytest

from tests.serve.conftest import save_served_model, start_server

pytest.importorskip("uvicorn")


def _closed_after(sock: socket.socket, trickle: bytes = b"", every: float = 0.1, within: float = 5.0) -> float:
    """Seconds until the server closed ``sock`` (sending ``trickle`` a byte at a time meanwhile); ``within`` if not."""
    sock.settimeout(every)
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < within:
        try:
            if sock.recv(1024) == b"":
                return time.monotonic() - start
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - start
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent:sent + 1])
            except OSError:
                return time.monotonic() - start
            sent += 1
    return within


def test_silent_and_trickling_connections_are_closed_and_free_their_place(tmp_path) -> None:
    gen = start_server(save_served_model(tmp_path), header_timeout=0.5, limit_concurrency=3)
    served = next(gen)
    try:
        silent = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(3)]
        assert served.request("GET", "/health")[0] == 503  # every place held (uvicorn's bound)
        assert all(_closed_after(s) < 2.0 for s in silent)  # closed at the deadline, not kept for ever
        trickle = socket.create_connection(("127.0.0.1", served.port))
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
        assert _closed_after(trickle, head, every=0.05) < 2.0  # a byte every 50 ms does not postpone it
        assert served.request("GET", "/health")[0] == 200  # the places are free again
        # a whole request in time is answered; the connection then has the deadline for its next head
        kept = served.raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        kept.settimeout(2)
        assert kept.recv(1024).startswith(b"HTTP/1.1 200")
        assert _closed_after(kept) < 2.0
    finally:
        gen.close()
