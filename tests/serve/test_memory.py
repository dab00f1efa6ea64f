"""The server process's heap: glibc's mmap threshold pinned, free pages handed back, and the request log's idle
clean-up that calls it a second after the last request (``/health`` polls do not keep a server busy)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import platform

import pytest

from transformer_xl.serve import memory
from transformer_xl.serve.app import RequestLog

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_on_glibc_the_threshold_is_set_and_free_pages_can_be_released() -> None:
    assert memory.fix_mmap_threshold() is True
    big = ctypes.create_string_buffer(64 * 2 ** 20)  # allocated, touched, freed
    del big
    assert isinstance(memory.release_free_memory(), bool)


def test_without_glibc_both_say_false(monkeypatch) -> None:
    monkeypatch.setattr(memory, "_LIBC", False)
    assert memory.fix_mmap_threshold() is False and memory.release_free_memory() is False


async def _answer(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _serve(log: RequestLog, paths: list[str], wait: float) -> None:
    """``paths`` asked one after another, ``wait`` seconds apart, in one event loop."""

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    async def run() -> None:
        for path in paths:
            await log({"type": "http", "method": "GET", "path": path}, receive, send)
            await asyncio.sleep(wait)

    asyncio.run(run())


def test_the_heap_is_cleaned_once_a_second_after_the_last_request_and_health_polls_do_not_delay_it(
        monkeypatch) -> None:
    released: list[bool] = []
    monkeypatch.setattr("transformer_xl.serve.app.release_free_memory", lambda: released.append(True) or True)
    log = RequestLog(_answer)
    log.IDLE_S, log.EVERY_S = 0.05, 0.05
    _serve(log, ["/v1/models", "/v1/models"], 0.01)  # requests closer than IDLE_S: no clean-up between them
    assert log.cleanups == 0
    _serve(log, ["/v1/models", "/health", "/health", "/health"], 0.03)  # polls every 30 ms do not postpone it
    assert log.cleanups == 1 and released == [True]
    _serve(log, ["/health"], 0.1)  # a poll alone is no request to clean up after
    assert log.cleanups == 1


def test_clean_ups_are_at_least_every_s_apart(monkeypatch) -> None:
    """A client asking about once a second would otherwise cost a full collection per request."""
    monkeypatch.setattr("transformer_xl.serve.app._collect", lambda: None)  # a collection of this test process
    log = RequestLog(_answer)  # would take long enough to upset the timings below
    log.IDLE_S, log.EVERY_S = 0.02, 1.0
    _serve(log, ["/v1/models", "/v1/models", "/v1/models"], 0.06)  # idle 60 ms after each: one clean-up, not three
    assert log.cleanups == 1
    _serve(log, ["/v1/models"], 1.2)  # the next one waits out EVERY_S, then comes
    assert log.cleanups == 2
