"""Starting ``txl serve``: the model and its text codec loaded, the engine started, uvicorn on a bound socket.

Binding beyond the loopback interface needs an API key (``api_key``, or ``TXL_API_KEY`` in the environment),
unless ``allow_no_key`` says that the network in between is trusted: a refusal is one line before anything
loads.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, check_int
from transformer_xl.serve.protocol import DEFAULT_LIMITS, Limits
from transformer_xl.serve.sessions import SessionStore, session_bytes

#: The environment variable an API key can come from (the command line shows up in ``ps``).
API_KEY_ENV = "TXL_API_KEY"


@dataclass
class ServeOptions:
    """What ``txl serve`` is asked for."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allow_no_key: bool = False
    model_name: str | None = None  # default: the model directory's name
    max_batch: int = 8
    max_sessions: int = 64
    session_timeout: float = 900.0
    mem_len: int | None = None
    clamp_len: int | None = None
    limits: Limits = DEFAULT_LIMITS
    level: str | None = None
    vocab: str | None = None
    device: str = "cpu"
    verify: bool = True


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface only (``localhost``, ``127.x.x.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_api_key(opts: ServeOptions) -> str | None:
    """The API key (option, else :data:`API_KEY_ENV`), refusing a bind beyond loopback without one."""
    key = opts.api_key or os.environ.get(API_KEY_ENV) or None
    if key is None and not is_loopback(opts.host) and not opts.allow_no_key:
        raise ConfigError(f"--host {opts.host} listens beyond this machine: give an API key (--api-key or "
                          f"{API_KEY_ENV}), or --allow-no-key on a trusted network")
    return key


def build_app(model: Any, codec: Any, opts: ServeOptions, *, model_name: str = "txl") -> tuple[Any, Any]:
    """``(asgi_app, engine)`` serving ``model`` (the engine started; stop it with ``engine.stop()``)."""
    from transformer_xl.serve.app import create_app
    from transformer_xl.serve.completions import Completions
    from transformer_xl.serve.engine import Engine

    sessions = SessionStore(opts.max_sessions, opts.session_timeout)
    engine = Engine(model, codec, max_batch=opts.max_batch, mem_len=opts.mem_len, clamp_len=opts.clamp_len,
                    sessions=sessions).start()
    mem_len = opts.mem_len or model.config.mem_len
    info = {"max_batch": opts.max_batch, "mem_len": mem_len, "session_bytes": session_bytes(model, mem_len),
            "max_sessions": opts.max_sessions}
    return create_app(Completions(engine, codec, opts.model_name or model_name, opts.limits),
                      api_key=resolve_api_key(opts), info=info), engine


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one)."""
    check_int("port", port, 0)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(model_path: str | Path, opts: ServeOptions, *, note: Callable[[str], None] = print) -> None:
    """Load the model at ``model_path`` and serve it until interrupted (``note`` hears where it listens)."""
    import uvicorn

    from transformer_xl.inference.loading import load_codec, load_model

    resolve_api_key(opts)  # refuse before loading
    model, directory = load_model(model_path, device=opts.device, verify=opts.verify, note=note)
    vocab, codec = load_codec(directory, opts.vocab, level=opts.level)
    if len(vocab) != model.config.n_token:
        raise ConfigError(f"the vocabulary has {len(vocab)} symbols but the model predicts {model.config.n_token}")
    name = opts.model_name or Path(model_path).name or "txl"  # "." or "/": txl
    sock = bind(opts.host, opts.port)  # a port in use refuses before the engine starts
    app, engine = build_app(model, codec, opts, model_name=name)
    host, port = sock.getsockname()[:2]
    mem_len = opts.mem_len or model.config.mem_len
    note(f"serving {name} on http://{'[' + host + ']' if ':' in host else host}:{port} (OpenAI completions at /v1, "
         f"playground at /; batch {opts.max_batch}, {opts.max_sessions} sessions of "
         f"{session_bytes(model, mem_len) / 2 ** 20:.2f} MiB)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("txl.serve").setLevel(logging.INFO)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
