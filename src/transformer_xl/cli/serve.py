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
the tokenizer routes /tokenize, /detokenize and /tokenizer_info (as vLLM's, which lm-evaluation-harness uses), and
sessions: a request naming a "session" continues from the memory of that session's earlier text. Listens on
127.0.0.1 unless --host says otherwise; beyond loopback it needs an API key (--api-key or TXL_API_KEY) or
--allow-no-key. Without a key, only requests naming this server in their Host header (localhost, an IP address,
--allowed-host) are answered, and web pages of other sites are refused. See docs/serving.md.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "serve", SERVE_HELP)
    add_model(p, "model_dir", "MODEL_OR_RUN_DIR", "txl " + MODEL_DIRS)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=nonneg_int, default=8000, help="TCP port (default: 8000; 0: a free one)")
    p.add_argument("--api-key", action="append", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but / and /health; repeat for several "
                        "keys, each with its own sessions (default: $TXL_API_KEY, keys separated by commas, else none)")
    p.add_argument("--allow-no-key", action="store_true",
                   help="listen beyond loopback without an API key (a trusted network only)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a name the Host header may give without an API key besides localhost and IP addresses "
                        "(a reverse proxy's); repeatable")
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
    p.add_argument("--max-prompt-chars", type=positive_int, default=262_144,
                   help="longest text prompt in characters, refused before it is read (default: 262144)")
    p.add_argument("--max-choices", type=positive_int, default=16,
                   help="most choices (prompts x n) in one request (default: 16)")
    p.add_argument("--max-stop-chars", type=positive_int, default=256,
                   help="longest stop string in characters (default: 256)")
    p.add_argument("--max-body-bytes", type=positive_int, default=4 * 2 ** 20, metavar="BYTES",
                   help="largest request body, refused with 413 as it arrives (default: 4194304, 4 MiB)")
    p.add_argument("--header-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="close a connection that has not sent a whole request line and headers this long after "
                        "opening or after its last answer (default: 10)")
    p.add_argument("--body-timeout", type=positive_float, default=30.0, metavar="SECONDS",
                   help="time a request body may take to arrive, 408 beyond (default: 30)")
    p.add_argument("--timeout-keep-alive", type=positive_float, default=5.0, metavar="SECONDS",
                   help="close a connection idle this long between requests (default: 5)")
    p.add_argument("--limit-concurrency", type=nonneg_int, default=512, metavar="N",
                   help="most connections at once, 503 beyond; 0: no bound (default: 512)")
    p.add_argument("--timeout-graceful-shutdown", type=positive_float, default=10.0, metavar="SECONDS",
                   help="on Ctrl-C or SIGTERM, wait this long for open responses to finish (default: 10)")
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

    limits = Limits(max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens, max_choices=args.max_choices,
                    max_body_bytes=args.max_body_bytes, max_prompt_chars=args.max_prompt_chars,
                    max_stop_chars=args.max_stop_chars)
    opts = ServeOptions(host=args.host, port=args.port, api_key=args.api_key, allow_no_key=args.allow_no_key,
                        allowed_hosts=args.allowed_host, model_name=args.model_name, max_batch=args.max_batch,
                        max_sessions=args.max_sessions, session_timeout=args.session_timeout, mem_len=args.mem_len,
                        clamp_len=args.clamp_len, limits=limits, level=args.level, vocab=args.vocab,
                        device=args.device, verify=not args.no_verify, body_timeout=args.body_timeout,
                        header_timeout=args.header_timeout,
                        timeout_keep_alive=args.timeout_keep_alive, limit_concurrency=args.limit_concurrency or None,
                        timeout_graceful_shutdown=args.timeout_graceful_shutdown)
    serve(args.model_dir, opts, note=stderr_note("txl serve"))
    return 0
