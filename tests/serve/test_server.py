"""Starting the server: who may listen where without a key, the socket, the app it builds."""

from __future__ import annotations

import contextlib

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.serve.server import API_KEY_ENV, ServeOptions, bind, is_loopback, resolve_api_keys


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("127.0.0.2", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("example.org", False)])
def test_is_loopback(host, loopback) -> None:
    assert is_loopback(host) is loopback


def test_beyond_loopback_needs_a_key_or_an_explicit_allowance(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_keys(ServeOptions()) == ()
    with pytest.raises(ConfigError, match="--api-key"):
        resolve_api_keys(ServeOptions(host="0.0.0.0"))
    assert resolve_api_keys(ServeOptions(host="0.0.0.0", allow_no_key=True)) == ()
    assert resolve_api_keys(ServeOptions(host="0.0.0.0", api_key="k")) == ("k",)
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_keys(ServeOptions(host="0.0.0.0")) == ("from-env",)
    assert resolve_api_keys(ServeOptions(api_key=["a", "b"])) == ("a", "b")  # the option, not the environment


def test_several_keys_from_the_environment_and_keys_that_cannot_travel_in_a_header(monkeypatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, " one, two ,,three ")
    assert resolve_api_keys(ServeOptions()) == ("one", "two", "three")
    monkeypatch.setenv(API_KEY_ENV, " , ")
    with pytest.raises(ConfigError, match="--api-key"):
        resolve_api_keys(ServeOptions(host="0.0.0.0"))
    for bad in (["ok", "with space"], "tab\t", "caf\u00e9", ""):
        with pytest.raises(ConfigError, match=r"^an API key \(--api-key or TXL_API_KEY\) is printable ASCII"):
            resolve_api_keys(ServeOptions(api_key=bad if bad else [""]))


def test_bind_a_free_port() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()
    with pytest.raises(ConfigError, match=r"^port must be an integer >= 0, got -1$"):
        bind("127.0.0.1", -1)
    busy = bind("127.0.0.1", 0)
    port = busy.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: .*in use"):
            bind("127.0.0.1", port)
    finally:
        busy.close()
    with pytest.raises(ConfigError, match=r"^cannot listen on \[::2\]:0: "):
        bind("::2", 0)  # an address of no interface here


def test_uvicorn_gets_the_bounds_asked_for() -> None:
    pytest.importorskip("uvicorn")
    from transformer_xl.serve.server import uvicorn_config

    config = uvicorn_config(None, ServeOptions())
    assert (config.timeout_keep_alive, config.limit_concurrency, config.timeout_graceful_shutdown) == (5.0, 512, 10.0)
    config = uvicorn_config(None, ServeOptions(timeout_keep_alive=1.5, limit_concurrency=None,
                                               timeout_graceful_shutdown=None))
    assert (config.timeout_keep_alive, config.limit_concurrency, config.timeout_graceful_shutdown) == (1.5, None, None)
    assert (config.access_log, config.lifespan) == (False, "off")


def _serve_and_ask(model_path, opts, ask) -> list[str]:
    """Run ``serve`` as ``txl serve`` runs it, in this process, until ``ask(base_url)`` (on another thread) has asked
    what it wants; then Ctrl-C (SIGINT) ends it. The notes ``serve`` gave."""
    import os
    import re
    import signal
    import threading
    import time

    pytest.importorskip("uvicorn")
    from transformer_xl.serve.server import serve

    notes: list[str] = []

    def client_side() -> None:
        try:
            deadline = time.monotonic() + 120
            while not any(n.startswith("serving") for n in notes) and time.monotonic() < deadline:
                time.sleep(0.05)
            ask(re.search(r"http://(\[[\d:]+\]|[\d.]+):\d+", notes[-1]).group(0), deadline)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=client_side, daemon=True)
    thread.start()
    with contextlib.suppress(KeyboardInterrupt):
        # uvicorn stops on the SIGINT, then raises it again: KeyboardInterrupt under Python's own handler, nothing
        # where an earlier library in this process installed another one (the whole suite does)
        serve(model_path, opts, note=notes.append)
    thread.join(timeout=60)
    return notes


def _health(url: str, deadline: float) -> dict:
    import json
    import time
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as resp:
                return json.loads(resp.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_serve_answers_until_interrupted_and_logs_each_request(tmp_path, caplog) -> None:
    """``serve``: the note of where it listens, the openai client's answers, one log line per request (INFO lines,
    shown under a root logger at WARNING that a host program has set up)."""
    import logging
    import re

    openai = pytest.importorskip("openai")
    from tests.serve.conftest import save_served_model

    model_dir = save_served_model(tmp_path, mem_len=64)
    seen: dict = {}

    def ask(url: str, deadline: float) -> None:
        seen["health"] = _health(url, deadline)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        seen["models"] = [m.id for m in client.models.list().data]
        seen["out"] = client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0)

    levels = {name: logging.getLogger(name).level for name in ("", "txl.serve")}
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("txl.serve").setLevel(logging.NOTSET)
    try:
        notes = _serve_and_ask(str(model_dir) + "/",
                               ServeOptions(port=0, max_batch=3, max_sessions=5, mem_len=16), ask)
        assert logging.getLogger().level == logging.WARNING  # the host's root logger: only txl.serve's level set
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
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


def test_serve_on_ipv6_loopback_names_a_nameless_path_txl_and_logs_to_stderr(tmp_path, monkeypatch, capsys) -> None:
    """Where no logging is set up, ``serve`` shows its request lines (and every INFO line) on stderr, with the time,
    and none of uvicorn's; ``.`` is served as ``txl``, at the level and without the check asked for; once it
    returns, its port and engine are gone."""
    import json
    import logging
    import re
    import threading
    import urllib.request

    from tests.serve.conftest import save_served_model

    model_dir = save_served_model(tmp_path)
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # a weight changed since its manifest: served all the same, unchecked
    weights.write_bytes(bytes(data))
    monkeypatch.chdir(model_dir)
    monkeypatch.setattr(logging.root, "handlers", [])  # what pytest installs: gone for this test
    levels = {name: logging.getLogger(name).level for name in ("", "txl.serve")}
    seen: dict = {}

    def ask(url: str, deadline: float) -> None:
        seen["health"] = _health(url, deadline)
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps({"prompt": "the cat",
                                                                              "max_tokens": 2}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            seen["out"] = json.loads(resp.read())

    try:
        notes = _serve_and_ask(".", ServeOptions(host="::1", port=0, level="char", verify=False), ask)
        logging.getLogger("txl.elsewhere").info("another line")
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    cfg = seen["health"]
    size = cfg["session_bytes"]
    port = re.fullmatch(rf"serving txl on http://\[::1\]:(\d+) \(OpenAI completions at /v1, playground at /; "
                        rf"batch 8, 64 sessions of {size / 2 ** 20:.2f} MiB\)", notes[-1])
    assert port and cfg["model"] == "txl" and cfg["mem_len"] == 64
    assert seen["out"]["usage"]["prompt_tokens"] == len("the cat")  # read at the level asked for: characters
    bind("::1", int(port.group(1))).close()  # free again
    assert not [t for t in threading.enumerate() if t.name == "txl-serve-engine"]
    err = capsys.readouterr().err
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    assert re.search(rf"^{stamp} txl\.serve GET /health 200 \d+ms$", err, re.M), err
    assert re.search(rf"^{stamp} txl\.elsewhere another line$", err, re.M), err
    assert "Uvicorn running" not in err and "Started server process" not in err


def test_serve_refuses_a_key_less_public_bind_before_loading_and_a_changed_model(tmp_path, monkeypatch) -> None:
    from tests.serve.conftest import save_served_model
    from transformer_xl.errors import CheckpointError
    from transformer_xl.serve.server import serve

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match="--api-key"):  # and not that there is no model there
        serve(tmp_path / "nowhere", ServeOptions(host="0.0.0.0", port=0), note=print)
    model_dir = save_served_model(tmp_path)
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight: the file no longer matches its manifest
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        serve(model_dir, ServeOptions(port=0), note=print)


def test_the_app_built_follows_every_option(tmp_path) -> None:
    import json
    import urllib.request

    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from tests.serve.conftest import save_served_model, start_server
    from transformer_xl.serve.protocol import Limits

    gen = start_server(save_served_model(tmp_path), model_name="named", api_key="k", max_batch=2, mem_len=4,
                       clamp_len=2, session_timeout=0.0, limits=Limits(max_tokens=6))
    served = next(gen)
    try:
        client = served.client(api_key="k")
        assert [m.id for m in client.models.list().data] == ["named"]
        with pytest.raises(openai.AuthenticationError):
            served.client(api_key="wrong").models.list()
        with pytest.raises(openai.BadRequestError, match="--max-batch"):
            client.completions.create(model="named", prompt="the", n=3, max_tokens=1)
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.completions.create(model="named", prompt="the", max_tokens=7)
        prompt = "the cat sat on a red mat and then it ran"
        out = client.completions.create(model="named", prompt=prompt, max_tokens=6, temperature=0, logprobs=0,
                                        extra_body={"session": "s"})
        ids = served.codec.encode(prompt)
        expected = served.model.generate(ids, max_new_tokens=6, mem_len=4, clamp_len=2).log_probs[0].tolist()
        assert out.choices[0].logprobs.token_logprobs == pytest.approx(expected, rel=1e-5, abs=1e-6)
        for other in (dict(mem_len=4), dict(clamp_len=2)):  # each length changes what the model says here
            lp = served.model.generate(ids, max_new_tokens=6, **other).log_probs[0].tolist()
            assert lp != pytest.approx(expected, rel=1e-5, abs=1e-6), other
        with urllib.request.urlopen(served.url.removesuffix("/v1") + "/health", timeout=30) as resp:
            health = json.loads(resp.read())
        cfg = served.model.config
        assert {k: health[k] for k in ("max_batch", "mem_len", "session_bytes", "sessions")} == {
            "max_batch": 2, "mem_len": 4, "session_bytes": (cfg.n_layer + 1) * 4 * cfg.d_model * 4,
            "sessions": 0}  # the session was idle longer than 0 s: dropped
    finally:
        gen.close()


def test_serve_loads_what_it_is_asked_for_and_a_port_in_use_starts_nothing(tmp_path) -> None:
    import threading

    import torch

    pytest.importorskip("uvicorn")
    from tests.serve.conftest import save_served_model
    from transformer_xl.serve.server import serve

    run = tmp_path / "run"
    run.mkdir()
    save_served_model(tmp_path).rename(run / "best")  # a run directory: its best model is served
    busy = bind("127.0.0.1", 0)
    try:
        notes: list[str] = []
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127\.0\.0\.1:{busy.getsockname()[1]}: "):
            serve(run, ServeOptions(port=busy.getsockname()[1]), note=notes.append)
        assert notes == [f"using {run / 'best'} (the best validation model)"]  # the loader's note reaches the caller
        assert not [t for t in threading.enumerate() if t.name == "txl-serve-engine"]  # no engine left running
        if not torch.cuda.is_available():  # the device asked for is the one loaded on
            with pytest.raises(ConfigError, match="CUDA is not available"):
                serve(run, ServeOptions(port=busy.getsockname()[1], device="cuda"), note=print)
    finally:
        busy.close()


def test_serve_hides_the_server_librarys_deprecation_warnings_and_no_other_warning(tmp_path, monkeypatch,
                                                                                   recwarn) -> None:
    """A DeprecationWarning given while uvicorn starts (as websockets' legacy modules give under uvicorn[standard])
    is not shown to the user of ``txl serve``; any other warning is."""
    import warnings

    uvicorn = pytest.importorskip("uvicorn")
    from tests.serve.conftest import save_served_model

    load = uvicorn.Config.load

    def load_with_warnings(self) -> None:
        warnings.warn("a library module is deprecated", DeprecationWarning, stacklevel=1)
        warnings.warn("something else to see", UserWarning, stacklevel=1)
        load(self)

    monkeypatch.setattr(uvicorn.Config, "load", load_with_warnings)
    seen: dict = {}
    _serve_and_ask(save_served_model(tmp_path), ServeOptions(port=0), lambda url, deadline: seen.setdefault(
        "health", _health(url, deadline)))
    assert seen["health"]["status"] == "ok"
    shown = [(w.category, str(w.message)) for w in recwarn]
    assert (UserWarning, "something else to see") in shown
    assert not [w for w in shown if w[0] is DeprecationWarning], shown


def test_build_app_names_the_model_txl_unless_told(tmp_path) -> None:
    """``build_app`` without a model name (nor ``ServeOptions.model_name``) serves the model as ``txl``."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from tests.serve.conftest import save_served_model
    from transformer_xl.inference.loading import load_codec, load_model
    from transformer_xl.serve.server import build_app

    model, directory = load_model(save_served_model(tmp_path))
    _, codec = load_codec(directory)
    for opts, name in ((ServeOptions(), "txl"), (ServeOptions(model_name="given"), "given")):
        app, engine = build_app(model, codec, opts)

        async def asgi(scope, receive, send, app=app) -> None:  # a coroutine function, as conftest.start_server's
            await app(scope, receive, send)

        try:
            models = TestClient(asgi, base_url="http://localhost").get("/v1/models").json()  # a name of this server
        finally:
            engine.stop()
        assert [m["id"] for m in models["data"]] == [name]


def test_allowed_hosts_are_host_names() -> None:
    from transformer_xl.serve.server import host_names

    good = ("proxy.example", "proxy.example:443", "models", "[::1]:8000", "10.0.0.5", "a-b.example.")
    assert host_names(ServeOptions(host="::", allowed_hosts=good)) == ["::", *good]
    for bad in ("http://proxy.example", "proxy.example/x", "a b", "", "user@proxy.example", "a..b", "proxy:port"):
        with pytest.raises(ConfigError, match=r"^--allowed-host takes a host name as a Host header gives it"):
            host_names(ServeOptions(allowed_hosts=[bad]))


def test_a_converted_tensorflow_checkpoint_serves_completions(tmp_path) -> None:
    """A released-model layout converted by txl convert --from tf (TF's memory and LayerNorm epsilon in its config)
    answers the openai client over a real socket."""
    pytest.importorskip("openai")
    from tests.cli.test_convert import _released
    from tests.serve.conftest import start_server
    from transformer_xl.cli import main

    assert main(["convert", "--from", "tf", str(_released(tmp_path)), "--out", str(tmp_path / "m")]) == 0
    server = start_server(tmp_path / "m")
    served = next(server)
    try:
        answer = served.client().completions.create(model="tiny", prompt="the game was", max_tokens=6, seed=0)
        assert 1 <= answer.usage.completion_tokens <= 6 and answer.choices[0].finish_reason in ("length", "stop")
    finally:
        server.close()
