"""The HTTP API through the official ``openai`` client (and plain HTTP for what the client refuses to send),
against a server started on 127.0.0.1 once for this module."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.serve.conftest import start_server
from transformer_xl.cli import main

openai = pytest.importorskip("openai")


def _txl_generate(capsys, model_dir, prompt: str, n: int) -> dict:
    assert main(["generate", str(model_dir), "--prompt", prompt, "--max-new-tokens", str(n), "--greedy",
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)["samples"][0]


def _post(url: str, body: bytes | None, headers: dict | None = None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_and_health(served) -> None:
    assert [m.id for m in served.client().models.list().data] == ["tiny"]
    with urllib.request.urlopen(served.url.removesuffix("/v1") + "/health", timeout=30) as resp:
        health = json.loads(resp.read())
    cfg = served.model.config
    assert health["status"] == "ok" and health["model"] == "tiny"
    assert health["session_bytes"] == (cfg.n_layer + 1) * cfg.mem_len * cfg.d_model * 4


@pytest.mark.parametrize("prompt", ["the cat sat on", "a red dog ran up and then it was very"])
def test_greedy_output_and_logprobs_equal_txl_generate(served, capsys, prompt) -> None:
    ref = _txl_generate(capsys, served.model_dir, prompt, 12)
    out = served.client().completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=1)
    choice = out.choices[0]
    assert choice.text == ref["text"] and choice.logprobs.tokens == ref["tokens"]
    assert choice.logprobs.token_logprobs == pytest.approx(ref["log_probs"], rel=1e-5, abs=1e-6)
    assert out.usage.prompt_tokens == len(prompt.split()) and out.usage.completion_tokens == 12
    assert choice.finish_reason == "length"


def test_streamed_text_equals_the_whole_response(served) -> None:
    client = served.client()
    for kw in ({"temperature": 0}, {"temperature": 1.0, "top_p": 0.9, "seed": 7}):
        whole = client.completions.create(model="tiny", prompt="the dog", max_tokens=15, **kw)
        chunks = list(client.completions.create(model="tiny", prompt="the dog", max_tokens=15, stream=True,
                                                stream_options={"include_usage": True}, **kw))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 15
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_sampling_options_seed_n_echo_stop(served) -> None:
    client = served.client()
    a = client.completions.create(model="tiny", prompt="one two", max_tokens=10, seed=3, n=3,
                                  extra_body={"top_k": 5})
    b = client.completions.create(model="tiny", prompt="one two", max_tokens=10, seed=3, n=3,
                                  extra_body={"top_k": 5})
    assert [c.text for c in a.choices] == [c.text for c in b.choices] and len(a.choices) == 3
    assert a.usage.completion_tokens == 30
    two = client.completions.create(model="tiny", prompt=["the cat", "a dog"], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in two.choices] == [0, 1, 2, 3] and two.choices[0].text == two.choices[1].text
    echo = client.completions.create(model="tiny", prompt="the cat", max_tokens=3, temperature=0, echo=True,
                                     logprobs=0)
    plain = client.completions.create(model="tiny", prompt="the cat", max_tokens=3, temperature=0)
    assert echo.choices[0].text == "the cat" + plain.choices[0].text
    assert echo.choices[0].logprobs.tokens[:2] == ["the", "cat"] and echo.choices[0].logprobs.token_logprobs[0] is None
    word = plain.choices[0].text.split()[1]
    stopped = client.completions.create(model="tiny", prompt="the cat", max_tokens=3, temperature=0, stop=[word])
    assert stopped.choices[0].finish_reason == "stop" and word not in stopped.choices[0].text


def test_bad_requests_get_4xx_and_the_server_stays_up(served) -> None:
    client = served.client()
    url = served.url + "/completions"
    cases = [
        (b"{not json", 400, "invalid_json"),
        (b'["a list"]', 400, "invalid_body"),
        (b'{"model": "tiny"}', 400, "missing_field"),
        (b'{"prompt": 3}', 400, "invalid_type"),
        (b'{"prompt": "x", "max_tokens": "many"}', 400, "invalid_type"),
        (b'{"prompt": "x", "max_tokens": -1}', 400, "invalid_value"),
        (b'{"prompt": "x", "max_tokens": 100000}', 400, "invalid_value"),
        (b'{"prompt": "x", "temperature": 5}', 400, "invalid_value"),
        (b'{"prompt": [1, 2, 999]}', 400, "invalid_value"),
        (b'{"prompt": "x", "n": 2, "session": "s"}', 400, None),
        (b'{"prompt": "x", "model": "gpt-4"}', 404, "model_not_found"),
        (b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', 400, "invalid_value"),
        (json.dumps({"prompt": "the " * 9000}).encode(), 400, "context_length_exceeded"),
    ]
    for body, status, code in cases:
        got, doc = _post(url, body)
        assert got == status, (body[:40], doc)
        assert set(doc["error"]) == {"message", "type", "param", "code"} and doc["error"]["code"] == code
    got, doc = _post(served.url + "/nowhere", b"{}")
    assert got == 404 and doc["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", max_tokens=-5)
    assert client.completions.create(model="tiny", prompt="the", max_tokens=2).usage.completion_tokens == 2


def test_an_api_key_is_required_when_set(tmp_path) -> None:
    from tests.serve.conftest import save_served_model

    gen = start_server(save_served_model(tmp_path), api_key="s3cret")
    served = next(gen)
    try:
        with pytest.raises(openai.AuthenticationError):
            served.client(api_key="wrong").models.list()
        assert served.client(api_key="s3cret").completions.create(model="tiny", prompt="a", max_tokens=1).choices
        with urllib.request.urlopen(served.url.removesuffix("/v1") + "/health", timeout=30) as resp:
            assert resp.status == 200  # health stays open
    finally:
        gen.close()


def test_a_session_continues_as_the_concatenated_text(served) -> None:
    client = served.client()
    first = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=6, temperature=0,
                                      extra_body={"session": "s1"})
    second = client.completions.create(model="tiny", prompt="\non a red mat", max_tokens=8, temperature=0,
                                       logprobs=0, extra_body={"session": "s1"})
    whole = client.completions.create(model="tiny", prompt="the cat sat" + first.choices[0].text + "\non a red mat",
                                      max_tokens=8, temperature=0, logprobs=0)
    assert second.choices[0].text == whole.choices[0].text
    assert second.choices[0].logprobs.token_logprobs == pytest.approx(whole.choices[0].logprobs.token_logprobs,
                                                                      rel=1e-4, abs=1e-5)
    assert second.usage.prompt_tokens == 5  # only the new text is read
    status, doc = _post(served.url + "/sessions/s1", b"", method="DELETE")
    assert status == 200 and doc["deleted"] is True
    assert _post(served.url + "/sessions/s1", b"", method="DELETE")[0] == 404
    fresh = client.completions.create(model="tiny", prompt="\non a red mat", max_tokens=8, temperature=0,
                                      extra_body={"session": "s1"})
    assert fresh.choices[0].text == client.completions.create(model="tiny", prompt="\non a red mat", max_tokens=8,
                                                              temperature=0).choices[0].text


def test_32_concurrent_streaming_clients_get_their_own_outputs(served) -> None:
    from tests.helpers import WORDS

    prompts = [" ".join(WORDS[i % len(WORDS):][:1 + i % 7]) for i in range(32)]
    client = served.client()
    expected = [client.completions.create(model="tiny", prompt=p, max_tokens=10 + i % 5, temperature=0)
                .choices[0].text for i, p in enumerate(prompts)]
    got: list = [None] * 32
    barrier = threading.Barrier(32)

    def one(i: int) -> None:
        own = served.client()
        barrier.wait()
        stream = own.completions.create(model="tiny", prompt=prompts[i], max_tokens=10 + i % 5, temperature=0,
                                        stream=True)
        got[i] = "".join(c.choices[0].text for c in stream if c.choices)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == expected
    stats = served.engine.stats()
    assert stats["running"] == 0 and stats["peak_batch"] > 1  # their steps were read together


def test_the_playground_page_is_served(served) -> None:
    with urllib.request.urlopen(served.url.removesuffix("/v1") + "/", timeout=30) as resp:
        page = resp.read().decode()
    assert resp.headers["content-type"].startswith("text/html") and "/v1/completions" in page


def test_a_client_that_goes_away_mid_stream_frees_its_row(served) -> None:
    before = served.engine.stats()["cancelled"]
    stream = served.client().completions.create(model="tiny", prompt="the", max_tokens=2000, temperature=0,
                                                stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 20
    while served.engine.stats()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.engine.stats()["cancelled"] == before + 1
    assert served.client().completions.create(model="tiny", prompt="the", max_tokens=2).choices


def test_the_playground_streams_a_completion_in_headless_chromium(served) -> None:
    from tests.serve import chromium

    if chromium.chromium() is None:
        pytest.skip("needs Chromium (apt-get install chromium)")
    expected = served.client().completions.create(model="tiny", prompt="the cat", max_tokens=12,
                                                  temperature=0).choices[0].text
    browser = chromium.Browser()
    try:
        # a key in the address is not taken (a link is not a place for a secret)
        browser.open(served.url.removesuffix("/v1") + "/?prompt=the+cat&max_tokens=12&temperature=0&run=1"
                     "&api_key=stolen")
        browser.wait_for("document.getElementById('output').dataset.done === '1'")
        assert browser.evaluate("document.getElementById('api_key').value") == ""
        text = browser.evaluate("document.getElementById('output').textContent")
        chunks = int(browser.evaluate("document.getElementById('output').dataset.chunks"))
        status = browser.evaluate("document.getElementById('status').textContent")
    finally:
        browser.close()
    assert text == "the cat" + expected and chunks > 1 and "model tiny" in status
    assert browser.errors == []


def test_each_request_is_logged_once_with_its_status_time_and_tokens(tmp_path, caplog) -> None:
    import logging
    import re

    from tests.serve.conftest import save_served_model

    before = {t.ident for t in threading.enumerate()}
    gen = start_server(save_served_model(tmp_path))  # its own: no line of another test's request comes late here
    served = next(gen)
    own = {t.ident for t in threading.enumerate()} - before
    base = served.url.removesuffix("/v1")
    client = served.client()

    def get(path: str) -> None:
        _post(base + path, None, method="GET")

    calls = [lambda: get("/health"), lambda: client.completions.create(model="tiny", prompt="the cat", max_tokens=3),
             lambda: list(client.completions.create(model="tiny", prompt="a", max_tokens=2, stream=True)),
             lambda: get("/v1/nowhere")]
    patterns = [r"GET /health 200 (\d+)ms", r"POST /v1/completions 200 (\d+)ms 2\+3 tokens",
                r"POST /v1/completions 200 (\d+)ms stream", r"GET /v1/nowhere 404 (\d+)ms"]

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "txl.serve" and r.thread in own]

    try:
        with caplog.at_level(logging.INFO, logger="txl.serve"):
            for i, (call, pattern) in enumerate(zip(calls, patterns)):
                sent = time.time()
                call()
                deadline = time.monotonic() + 10  # a line comes once the response's last byte has been sent
                while len(lines()) <= i and time.monotonic() < deadline:
                    time.sleep(0.01)
                records = lines()
                assert len(records) == i + 1, [r.getMessage() for r in records]
                ms = re.fullmatch(pattern, records[i].getMessage())
                # the time logged lies between the request's sending and the line
                assert ms and int(ms.group(1)) <= 1000 * (records[i].created - sent) + 1, records[i].getMessage()
    finally:
        gen.close()


def test_the_api_documentation_pages_are_off(served) -> None:
    base = served.url.removesuffix("/v1")
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + path, timeout=30)
        assert info.value.code == 404 and json.loads(info.value.read())["error"]["code"] == "not_found"


def test_the_request_log_leaves_other_scopes_alone_and_logs_a_request_without_a_response_as_499(caplog) -> None:
    import asyncio
    import logging
    import re

    from transformer_xl.serve.app import RequestLog

    seen: list = []

    async def inner(scope, receive, send) -> None:
        seen.append(scope["type"])
        if scope["type"] == "http":
            raise ConnectionResetError("the client went away")
        seen.append(await receive())
        await send({"type": "lifespan.startup.complete"})

    async def receive() -> dict:
        return {"type": "lifespan.startup"}

    async def send(message: dict) -> None:
        seen.append(message)

    with caplog.at_level(logging.INFO, logger="txl.serve"):
        asyncio.run(RequestLog(inner)({"type": "lifespan"}, receive, send))  # passed through as it is
        with pytest.raises(ConnectionResetError):
            asyncio.run(RequestLog(inner)({"type": "http", "method": "GET", "path": "/unanswered"}, receive, send))
    assert seen == ["lifespan", {"type": "lifespan.startup"}, {"type": "lifespan.startup.complete"}, "http"]
    lines = [r.getMessage() for r in caplog.records if r.name == "txl.serve" and r.thread == threading.get_ident()]
    assert len(lines) == 1 and re.fullmatch(r"GET /unanswered 499 \d+ms", lines[0]), lines


def test_the_request_log_gives_the_milliseconds_from_the_request_to_its_last_byte(monkeypatch, caplog) -> None:
    """The time logged is the time between the request's arrival and its response's sending, in milliseconds (a
    clock that reads 2.5 s between the two: 2500ms)."""
    import asyncio
    import logging
    import time as time_module

    from transformer_xl.serve.app import RequestLog

    readings = iter([100.0, 102.5])
    monkeypatch.setattr(time_module, "perf_counter", lambda: next(readings))

    async def inner(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    with caplog.at_level(logging.INFO, logger="txl.serve"):
        asyncio.run(RequestLog(inner)({"type": "http", "method": "GET", "path": "/timed"}, receive, send))
    lines = [r.getMessage() for r in caplog.records if r.name == "txl.serve" and r.thread == threading.get_ident()]
    assert lines == ["GET /timed 204 2500ms"]


@pytest.mark.parametrize("sid", ["s:1", "a.b-c_D", "...", "x" * 128])
def test_every_valid_session_id_can_be_deleted(served, sid) -> None:
    from urllib.parse import quote

    out = served.client().completions.create(model="tiny", prompt="the cat", max_tokens=1, extra_body={"session": sid})
    assert out.choices and sid in served.engine.sessions
    status, doc = _post(served.url + "/sessions/" + quote(sid), None, method="DELETE")
    assert (status, doc) == (200, {"id": sid, "object": "session", "deleted": True})
    assert sid not in served.engine.sessions


@pytest.mark.parametrize("path, sid", [("a%2Fb", "a/b"), ("a%20b", "a b"), ("%2E%2E%2Fx", "../x"),
                                       ("caf%C3%A9", "caf\u00e9")])
def test_an_invalid_session_id_is_400_in_a_request_and_a_delete(served, path, sid) -> None:
    status, doc = _post(served.url + "/sessions/" + path, None, method="DELETE")
    assert status == 400 and doc["error"]["code"] == "invalid_session_id", doc
    status, doc = _post(served.url + "/completions", json.dumps({"prompt": "the", "session": sid}).encode())
    assert status == 400 and doc["error"]["code"] == "invalid_session_id", doc


def test_a_session_in_use_cannot_be_deleted(served) -> None:
    stream = served.client().completions.create(model="tiny", prompt="the", max_tokens=2000, stream=True,
                                                extra_body={"session": "busy"})
    try:
        next(iter(stream))
        status, doc = _post(served.url + "/sessions/busy", None, method="DELETE")
        assert status == 409 and doc["error"]["code"] == "session_busy"
    finally:
        stream.close()


def test_each_api_key_has_its_own_sessions(tmp_path) -> None:
    """Key A's session "s1" is not key B's: B neither continues it nor deletes it (404)."""
    from tests.serve.conftest import save_served_model

    gen = start_server(save_served_model(tmp_path), api_key=["key-a", "key-b"])
    served = next(gen)
    try:
        a, b = served.client(api_key="key-a"), served.client(api_key="key-b")

        def ask(client, prompt: str) -> str:
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                             extra_body={"session": "s1"}).choices[0].text

        first = ask(a, "the cat sat")
        fresh = served.client(api_key="key-b").completions.create(model="tiny", prompt="on a mat", max_tokens=6,
                                                                  temperature=0).choices[0].text
        assert ask(b, "on a mat") == fresh  # b's s1 starts empty, whatever a's holds
        continued = a.completions.create(model="tiny", prompt="the cat sat" + first + "on a mat", max_tokens=6,
                                         temperature=0).choices[0].text
        assert ask(a, "on a mat") == continued  # a's s1 continues a's text
        keyed = {"Authorization": "Bearer key-b"}
        assert _post(served.url + "/sessions/s1", None, keyed, method="DELETE")[0] == 200  # b's own
        assert _post(served.url + "/sessions/s1", None, keyed, method="DELETE")[0] == 404  # a's is not b's
        status, doc = _post(served.url + "/sessions/s1", None, {"Authorization": "Bearer key-a"}, method="DELETE")
        assert (status, doc["deleted"]) == (200, True)
    finally:
        gen.close()


def test_the_playground_cannot_be_framed_and_takes_no_key_from_its_address(served) -> None:
    with urllib.request.urlopen(served.url.removesuffix("/v1") + "/", timeout=30) as resp:
        page = resp.read().decode()
        headers = resp.headers
    assert headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in headers["content-security-policy"]
    # the settings a link may fill: a fixed list, without the key
    settings = page.split("const SETTINGS = [", 1)[1].split("]", 1)[0]
    assert '"prompt"' in settings and "api_key" not in settings
    assert "location.search" in page and page.count("params.get(") == 3  # prompt/settings, session, run
