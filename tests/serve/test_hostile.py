"""Hostile and careless clients of a live ``txl serve`` on 127.0.0.1: a client that leaves mid-completion, bodies that
are not JSON, log lines forged through the path, uvicorn's bounds, a port in use on the command line."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from tests.helpers import one_line_error
from tests.serve.conftest import read_status, save_served_model, start_server
from transformer_xl.serve.protocol import Limits

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.mark.parametrize("key", [None, "s3cret"])
def test_a_whole_completion_whose_client_went_away_frees_its_rows(tmp_path, key) -> None:
    """A non-streamed request that would decode for minutes; its client closes the socket after 0.3 s: the engine's
    rows are free within a second (behind Starlette's BaseHTTPMiddleware the route never heard of it)."""
    gen = start_server(save_served_model(tmp_path), api_key=key, limits=Limits(max_tokens=10 ** 6))
    served = next(gen)
    try:
        body = json.dumps({"prompt": "the", "max_tokens": 10 ** 6, "n": 8}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n" + (f"Authorization: Bearer {key}\r\n" if key else "") + "\r\n")
        before = served.engine.stats()["cancelled"]
        sock = served.raw(head.encode() + body)
        time.sleep(0.3)
        assert served.engine.stats()["running"] == 8  # decoding
        sock.close()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and served.engine.stats()["running"]:
            time.sleep(0.02)
        stats = served.engine.stats()
        assert stats["running"] == 0 and stats["cancelled"] == before + 1, stats
    finally:
        gen.close()


def test_bodies_that_are_not_json_text_get_400_invalid_json(served) -> None:
    """Through the real app: a deep nesting (RecursionError: a 500 with a traceback before), a body in another
    encoding than UTF-8 (UTF-16 was read as if it were JSON text), bytes that are no text; a byte order mark is
    tolerated."""
    deep = b"[" * 100_000
    utf16 = json.dumps({"prompt": "the", "max_tokens": 1}).encode("utf-16")
    for body in (deep, b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", utf16, b'{"prompt": "\xff\xfe"}',
                 b"\xc3"):
        status, _, doc = served.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        assert status == 400 and doc["error"]["code"] == "invalid_json", (body[:20], doc)
    ok = b"\xef\xbb\xbf" + json.dumps({"prompt": "the", "max_tokens": 1}).encode()
    assert served.request("POST", "/v1/completions", ok, {"Content-Type": "application/json"})[0] == 200
    status, doc = served.post("/v1/completions", {"prompt": "\ud800 the", "max_tokens": 1})  # a lone surrogate
    assert status == 400 and doc["error"]["param"] == "prompt"


def test_a_text_prompt_over_max_prompt_chars_is_refused(tmp_path) -> None:
    gen = start_server(save_served_model(tmp_path), limits=Limits(max_prompt_chars=100, max_stop_chars=4))
    served = next(gen)
    try:
        status, doc = served.post("/v1/completions", {"prompt": "the" + " " * 98, "max_tokens": 1})
        assert status == 400 and doc["error"]["param"] == "prompt", doc
        assert served.post("/v1/completions", {"prompt": "the" + " " * 97, "max_tokens": 1})[0] == 200
        status, doc = served.post("/v1/completions", {"prompt": "the", "max_tokens": 1, "stop": ["abcde"]})
        assert status == 400 and doc["error"]["param"] == "stop" and "--max-stop-chars" in doc["error"]["message"]
    finally:
        gen.close()


def test_a_path_cannot_forge_or_colour_a_log_line(served, caplog) -> None:
    own = set()
    with caplog.at_level(logging.INFO, logger="txl.serve"):
        for path in ("/v1/x%0a2024-01-01%20txl.serve%20POST%20/v1/completions%20200%201ms", "/v1/%1b[31mred%1b[0m",
                     "/v1/a%5cx0a"):
            sock = served.raw(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            assert read_status(sock, 10)[0] == 404
            own.add(path)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len([r for r in caplog.records if "/v1/" in r.getMessage()]) < 3:
            time.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records if r.name == "txl.serve" and "GET /v1/" in r.getMessage()]
    assert len(lines) == 3 and not any(c in "".join(lines) for c in "\n\r\x1b"), lines
    assert {ln.split(" ")[1] for ln in lines} == own


def test_uvicorns_bounds_keep_alive_and_concurrency(tmp_path) -> None:
    """An idle connection is closed after --timeout-keep-alive; with --limit-concurrency 3, a third open connection's
    request gets 503 (uvicorn counts the connection asking)."""
    gen = start_server(save_served_model(tmp_path), timeout_keep_alive=0.5, limit_concurrency=3)
    served = next(gen)
    try:
        ask = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        idle = served.raw(ask)
        start = time.monotonic()
        status, _ = read_status(idle, 5)  # the answer, then the connection closed by the server
        assert status == 200 and time.monotonic() - start < 2
        held = []
        for _ in range(2):
            held.append(served.raw(ask))
            assert held[-1].recv(12) == b"HTTP/1.1 200"  # answered, and kept open
        assert read_status(served.raw(ask), 5)[0] == 503
        for sock in held:
            sock.close()
    finally:
        gen.close()


def test_a_port_in_use_is_one_line_from_the_cli(tmp_path, capsys) -> None:
    from transformer_xl.cli import main
    from transformer_xl.serve.server import bind

    def engines() -> int:
        return len([t for t in threading.enumerate() if t.name == "txl-serve-engine"])

    model_dir = save_served_model(tmp_path)
    before = engines()
    busy = bind("127.0.0.1", 0)
    port = busy.getsockname()[1]
    try:
        assert main(["serve", str(model_dir), "--port", str(port)]) != 0
    finally:
        busy.close()
    err = one_line_error(capsys, "txl serve: error: ")
    assert f"cannot listen on 127.0.0.1:{port}: " in err and "in use" in err
    assert engines() == before  # refused before the engine started


def test_every_limit_and_bound_is_a_flag_with_its_default_in_help(capsys) -> None:
    from transformer_xl.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--max-body-bytes", "4194304"), ("--max-prompt-chars", "262144"),
                          ("--max-stop-chars", "256"), ("--max-choices", "16"), ("--max-tokens", "2048"),
                          ("--max-prompt-tokens", "8192"), ("--body-timeout", "30"), ("--timeout-keep-alive", "5"),
                          ("--limit-concurrency", "512"), ("--timeout-graceful-shutdown", "10")):
        assert flag in text and f"(default: {default}" in text.split(flag, 2)[-1].split("--")[0], flag
    for flag in ("--allowed-host", "--api-key"):
        assert flag in text
    fields = set(Limits.__dataclass_fields__)
    assert all(f"--{name.replace('_', '-')}" in text for name in fields), fields


def test_large_bodies_are_parsed_in_a_worker_thread_and_small_ones_at_once(served, monkeypatch) -> None:
    """Parsing and checking megabytes of JSON (a million token ids) would hold every other request and stream: a
    body over SMALL_BODY is parsed off the event loop."""
    import threading as threading_module

    from transformer_xl.serve import app as app_module

    threads: list[str] = []
    real = app_module.parse_completion

    def spy(doc, limits):
        threads.append(threading_module.current_thread().name)
        return real(doc, limits)

    monkeypatch.setattr(app_module, "parse_completion", spy)
    small = {"prompt": "the", "max_tokens": 1}
    assert served.post("/v1/completions", small)[0] == 200
    assert served.post("/v1/completions", {**small, "pad": "x" * (app_module.SMALL_BODY + 1)})[0] == 200
    loop_thread, worker = threads
    assert worker != loop_thread


def test_an_event_stream_cancels_its_job_even_when_it_never_started() -> None:
    """A streamed response that fails before its first event (its client gone as the head is sent) still closes its
    events, whose closing ends the job."""
    import asyncio

    from transformer_xl.serve.app import EventStream

    closed: list[bool] = []

    class Events:
        def __aiter__(self):
            return self

        async def __anext__(self):
            return "data: x\n\n"

        async def aclose(self) -> None:
            closed.append(True)

    async def receive() -> dict:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        raise OSError("the client went away")

    async def run() -> None:
        stream = EventStream(Events(), media_type="text/event-stream")
        with pytest.raises(Exception):  # noqa: B017 (Starlette turns the OSError into its ClientDisconnect)
            await stream({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)

    asyncio.run(run())
    assert closed == [True]
