"""``txl serve``: an OpenAI-compatible completions server over a model directory (needs the ``serve`` extra)."""

from __future__ import annotations

import argparse

from transformer_xl.cli.args import (
    MODEL_DIRS,
    add_command,
    add_device,
    add_model,
    add_no_verify,
    clamp_int,
    nonneg_int,
    positive_float,
    positive_int,
    stderr_note,
)
from transformer_xl.errors import ConfigError, install_hint

SERVE_HELP = """serve a txl model over HTTP with the OpenAI completions protocol

GET /v1/models, POST /v1/completions (stream: true for server-sent events), GET /health, a playground page at /,
and sessions: a request naming a "session" continues from the memory of that session's earlier text. Listens on
127.0.0.1 unless --host says otherwise; beyond loopback it needs an API key (--api-key or TXL_API_KEY) or
--allow-no-key. See docs/serving.md.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "serve", SERVE_HELP)
    add_model(p, "model_dir", "MODEL_OR_RUN_DIR", "txl " + MODEL_DIRS)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=nonneg_int, default=8000, help="TCP port (default: 8000; 0: a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/ (default: $TXL_API_KEY, else none)")
    p.add_argument("--allow-no-key", action="store_true",
                   help="listen beyond loopback without an API key (a trusted network only)")
    p.add_argument("--model-name", help="the model's id in the API (default: the directory's name)")
    p.add_argument("--max-batch", type=positive_int, default=8,
                   help="rows (choices of running requests) decoded together; more requests wait (default: 8)")
    p.add_argument("--max-sessions", type=nonneg_int, default=64,
                   help="session memories kept, least recently used dropped first; 0: sessions off (default: 64)")
    p.add_argument("--session-timeout", type=positive_float, default=900.0, metavar="SECONDS",
                   help="drop a session idle this long (default: 900)")
    p.add_argument("--max-tokens", type=positive_int, default=2048, help="largest max_tokens a request may ask "
                   "(default: 2048)")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=8192,
                   help="longest prompt in tokens (default: 8192)")
    p.add_argument("--mem-len", type=positive_int, help="memory length while generating (default: the model's)")
    p.add_argument("--clamp-len", type=clamp_int, help="clamp relative distances (useful with a long --mem-len)")
    p.add_argument("--vocab", help="vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)")
    p.add_argument("--level", choices=["word", "char", "text8", "byte"],
                   help="how to split prompts and join output (default: detected from the vocabulary)")
    add_device(p)
    add_no_verify(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(f"txl serve needs the serve extra: {install_hint('serve')}") from None
    from transformer_xl.serve.protocol import Limits
    from transformer_xl.serve.server import ServeOptions, serve

    opts = ServeOptions(host=args.host, port=args.port, api_key=args.api_key, allow_no_key=args.allow_no_key,
                        model_name=args.model_name, max_batch=args.max_batch, max_sessions=args.max_sessions,
                        session_timeout=args.session_timeout, mem_len=args.mem_len, clamp_len=args.clamp_len,
                        limits=Limits(max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens),
                        level=args.level, vocab=args.vocab, device=args.device, verify=not args.no_verify)
    serve(args.model_dir, opts, note=stderr_note("txl serve"))
    return 0
