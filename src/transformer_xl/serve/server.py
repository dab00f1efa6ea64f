"""Starting ``txl serve``: the model and its text codec loaded, the engine started, uvicorn on a bound socket.

Binding beyond the loopback interface needs an API key (``api_key``: one or several, or ``TXL_API_KEY`` in the
environment, keys separated by commas), unless ``allow_no_key`` says that the network in between is trusted: a
refusal is one line before anything loads, as is a port in use before the engine starts. uvicorn's own bounds are
options too: the seconds an idle connection is kept, the most connections at once (503 beyond), the seconds a stop
waits for open responses.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, check_int
from transformer_xl.serve.connections import header_deadline_protocol
from transformer_xl.serve.memory import fix_mmap_threshold
from transformer_xl.serve.protocol import DEFAULT_LIMITS, Limits
from transformer_xl.serve.sessions import SessionStore, session_bytes

#: The environment variable API keys can come from, separated by commas (the command line shows up in ``ps``).
API_KEY_ENV = "TXL_API_KEY"
#: What an API key may hold: printable ASCII, no space (it travels in a header).
KEY_CHARS = re.compile(r"[!-~]+")
#: An ``--allowed-host``: a DNS name or an IP address (IPv6 in brackets), maybe with a port.
HOST_NAME = re.compile(r"([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?|\[[0-9A-Fa-f:.]+\])(:\d+)?")


@dataclass
class ServeOptions:
    """What ``txl serve`` is asked for."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | Sequence[str] | None = None  # a key, or several (each with its own sessions)
    allow_no_key: bool = False
    allowed_hosts: Sequence[str] = ()  # names the Host header may give beyond localhost (a reverse proxy's)
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
    body_timeout: float = 30.0  # seconds a request body may take to arrive (408 beyond)
    header_timeout: float = 10.0  # seconds a connection may take to send a request's head (closed beyond)
    timeout_keep_alive: float = 5.0  # seconds an idle connection is kept open
    limit_concurrency: int | None = 512  # connections at once (503 beyond); None: no bound
    timeout_graceful_shutdown: float | None = 10.0  # seconds a stop waits for open responses; None: for ever


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface only (``localhost``, ``127.x.x.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_api_keys(opts: ServeOptions) -> tuple[str, ...]:
    """The API keys (the option, else :data:`API_KEY_ENV` split at commas), refusing a bind beyond loopback without
    one and a key that cannot travel in a header."""
    given = [opts.api_key] if isinstance(opts.api_key, str) else list(opts.api_key or ())
    keys = tuple(given or [k.strip() for k in os.environ.get(API_KEY_ENV, "").split(",") if k.strip()])
    for key in keys:
        if not KEY_CHARS.fullmatch(key):
            raise ConfigError(f"an API key (--api-key or {API_KEY_ENV}) is printable ASCII without spaces; one of "
                              f"{len(keys)} is not")
    if not keys and not is_loopback(opts.host) and not opts.allow_no_key:
        raise ConfigError(f"--host {opts.host} listens beyond this machine: give an API key (--api-key or "
                          f"{API_KEY_ENV}), or --allow-no-key on a trusted network")
    return keys


def host_names(opts: ServeOptions) -> list[str]:
    """Names the ``Host`` header may give beyond localhost and IP addresses: ``--host`` (a name) and
    ``--allowed-host`` (each checked: a name as a ``Host`` header gives it, its port ignored)."""
    for name in opts.allowed_hosts:
        if not HOST_NAME.fullmatch(name):
            raise ConfigError(f"--allowed-host takes a host name as a Host header gives it (no scheme nor path), "
                              f"got {name!r}")
    return [opts.host, *opts.allowed_hosts]


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
                      api_key=resolve_api_keys(opts), info=info, hosts=host_names(opts),
                      body_timeout=opts.body_timeout), engine


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one); a port in use or an address not of this machine
    is a :class:`ConfigError` of one line."""
    check_int("port", port, 0)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if ":" in host else host
        raise ConfigError(f"cannot listen on {shown}:{port}: {exc.strerror or exc} (another --port or --host)") \
            from None
    return sock


def uvicorn_config(app: Any, opts: ServeOptions) -> Any:
    """uvicorn's configuration of ``app`` under ``opts`` (its bounds; its own log lines off: ours are one a request)."""
    import uvicorn

    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                          timeout_keep_alive=opts.timeout_keep_alive, limit_concurrency=opts.limit_concurrency,
                          timeout_graceful_shutdown=opts.timeout_graceful_shutdown,
                          http=header_deadline_protocol(opts.header_timeout))


def serve(model_path: str | Path, opts: ServeOptions, *, note: Callable[[str], None] = print) -> None:
    """Load the model at ``model_path`` and serve it until interrupted (``note`` hears where it listens)."""
    import uvicorn

    from transformer_xl.inference.loading import load_codec, load_model

    resolve_api_keys(opts)  # refuse before loading
    host_names(opts)
    fix_mmap_threshold()  # a server left running returns to its size after the largest requests (serve.memory)
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
    config = uvicorn_config(app, opts)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
