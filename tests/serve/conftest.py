"""A txl server started once per test module on 127.0.0.1 (a free port), over a tiny model saved to a folder."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.helpers import WORDS, generation_model

#: The served model's words: plain words, so that text and ids convert both ways without loss.
SERVE_WORDS = ["<eos>", "<unk>", *WORDS]


@dataclass
class Served:
    """A running server: its base URL (``.../v1``), the model directory, the engine."""

    url: str
    model_dir: Path
    engine: Any
    model: Any
    codec: Any

    def client(self, **kw: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)

    @property
    def root(self) -> str:
        """The server's root URL (no ``/v1``)."""
        return self.url.removesuffix("/v1")

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 30) -> tuple[int, dict[str, str], Any]:
        """``method path`` over a fresh connection with exactly ``headers`` (a ``Host`` given replaces the usual
        one; a JSON body needs its ``Content-Type`` given): status, headers (lower-case names), decoded JSON (else
        the text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            head = {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()
        try:
            return resp.status, head, json.loads(data)
        except ValueError:
            return resp.status, head, data.decode("utf-8", "replace")

    def post(self, path: str, doc: Any, headers: dict | None = None) -> tuple[int, Any]:
        """POST ``doc`` as JSON: status and decoded answer."""
        status, _, answer = self.request("POST", path, json.dumps(doc).encode(),
                                         {"Content-Type": "application/json", **(headers or {})})
        return status, answer

    def raw(self, data: bytes) -> socket.socket:
        """A socket to the server that has sent ``data`` as it is."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.sendall(data)
        return sock


def read_status(sock: socket.socket, timeout: float) -> tuple[int, bytes]:
    """The status of the response on ``sock`` and all it sent until it closed (or ``timeout`` seconds: status 0)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    finally:
        sock.close()
    head = data.split(b"\r\n", 1)[0].split()
    return (int(head[1]) if len(head) > 1 and head[1].isdigit() else 0), data


def save_served_model(root: Path, mem_len: int = 64) -> Path:
    """A tiny generation model over :data:`SERVE_WORDS` saved with its vocabulary as ``root/tiny``."""
    from transformer_xl.data import Vocab

    vocab = Vocab(SERVE_WORDS, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    model = generation_model(n_token=len(vocab), mem_len=mem_len)
    model.save_pretrained(root / "tiny")
    vocab.save(root / "tiny" / "vocab.json")
    return root / "tiny"


def start_server(model_dir: Path, **options: Any) -> Iterator[Served]:
    """Serve ``model_dir`` in a thread until the generator is closed."""
    import uvicorn

    from transformer_xl.inference.loading import load_codec, load_model
    from transformer_xl.serve.server import ServeOptions, bind, build_app, uvicorn_config

    model, directory = load_model(model_dir)
    _, codec = load_codec(directory)
    opts = ServeOptions(**options)
    app, engine = build_app(model, codec, opts, model_name="tiny")
    sock = bind("127.0.0.1", 0)

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        # the app as a coroutine function: under mutmut, RequestLog.__call__ is a plain function that uvicorn would
        # call with no arguments (its test for an app factory), and so take the coroutine it returns for the app
        await app(scope, receive, send)

    server = uvicorn.Server(uvicorn_config(asgi, opts))  # uvicorn's bounds as txl serve sets them
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", model_dir, engine, model, codec)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.stop()
        sock.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server per test module (batch 32, sessions on); skipped without the serve extra."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    yield from start_server(save_served_model(tmp_path_factory.mktemp("serve")), max_batch=32)
