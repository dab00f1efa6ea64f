"""Starting the server: who may listen where without a key, the socket, the app it builds."""

from __future__ import annotations

import contextlib

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.serve.server import API_KEY_ENV, ServeOptions, bind, is_loopback, resolve_api_key


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("127.0.0.2", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("example.org", False)])
def test_is_loopback(host, loopback) -> None:
    assert is_loopback(host) is loopback


def test_beyond_loopback_needs_a_key_or_an_explicit_allowance(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(ServeOptions()) is None
    with pytest.raises(ConfigError, match="--api-key"):
        resolve_api_key(ServeOptions(host="0.0.0.0"))
    assert resolve_api_key(ServeOptions(host="0.0.0.0", allow_no_key=True)) is None
    assert resolve_api_key(ServeOptions(host="0.0.0.0", api_key="k")) == "k"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(ServeOptions(host="0.0.0.0")) == "from-env"


def test_bind_a_free_port() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()
    with pytest.raises(ConfigError):
        bind("127.0.0.1", -1)


def test_serve_answers_until_interrupted_and_logs_each_request(tmp_path, caplog) -> None:
    """``serve`` as ``txl serve`` runs it, in this process: the note of where it listens, the openai client's answers,
    one log line per request, and Ctrl-C (SIGINT) ending it."""
    import json
    import logging
    import os
    import re
    import signal
    import threading
    import time
    import urllib.request

    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from tests.serve.conftest import save_served_model
    from transformer_xl.serve.server import serve

    model_dir = save_served_model(tmp_path, mem_len=64)
    notes: list[str] = []
    seen: dict = {}

    def client_side() -> None:
        try:
            deadline = time.monotonic() + 120
            while not any(n.startswith("serving") for n in notes) and time.monotonic() < deadline:
                time.sleep(0.05)
            url = re.search(r"http://[\d.]+:\d+", notes[-1]).group(0)
            while "health" not in seen and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=10) as resp:
                        seen["health"] = json.loads(resp.read())
                except OSError:
                    time.sleep(0.05)
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            seen["models"] = [m.id for m in client.models.list().data]
            seen["out"] = client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=client_side, daemon=True)
    thread.start()
    with caplog.at_level(logging.INFO, logger="txl.serve"), contextlib.suppress(KeyboardInterrupt):
        # uvicorn stops on the SIGINT, then raises it again: KeyboardInterrupt under Python's own handler, nothing
        # where an earlier library in this process installed another one (the whole suite does)
        serve(str(model_dir) + "/", ServeOptions(port=0, max_batch=3, max_sessions=5, mem_len=16), note=notes.append)
    thread.join(timeout=60)
    from transformer_xl.inference.loading import load_model

    model, _ = load_model(model_dir)
    cfg = model.config
    size = (cfg.n_layer + 1) * 16 * cfg.d_model * 4
    assert re.fullmatch(rf"serving tiny on http://127\.0\.0\.1:\d+ \(OpenAI completions at /v1, playground at /; "
                        rf"batch 3, 5 sessions of {size / 2 ** 20:.2f} MiB\)", notes[-1]), notes
    assert seen["models"] == ["tiny"] and seen["out"].usage.completion_tokens == 5
    assert {k: seen["health"][k] for k in ("model", "max_batch", "mem_len", "session_bytes", "max_sessions")} == {
        "model": "tiny", "max_batch": 3, "mem_len": 16, "session_bytes": size, "max_sessions": 5}
    lines = [r.getMessage() for r in caplog.records if r.name == "txl.serve"]
    assert any(re.fullmatch(r"POST /v1/completions 200 \d+ms 2\+5 tokens", ln) for ln in lines), lines
    assert any(re.fullmatch(r"GET /health 200 \d+ms", ln) for ln in lines), lines


def test_serve_refuses_a_vocabulary_of_another_size(tmp_path) -> None:
    pytest.importorskip("uvicorn")
    from tests.serve.conftest import save_served_model
    from transformer_xl.data import Vocab
    from transformer_xl.serve.server import serve

    model_dir = save_served_model(tmp_path)
    Vocab(["<eos>", "<unk>", "the"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>").save(tmp_path / "v.json")
    with pytest.raises(ConfigError, match=r"^the vocabulary has 3 symbols but the model predicts \d+$"):
        serve(model_dir, ServeOptions(port=0, vocab=str(tmp_path / "v.json")), note=lambda _: None)
