"""The HTTP side of ``txl serve``: a FastAPI application over :class:`~transformer_xl.serve.completions.Completions`.

=========================  ===========================================================================
route                      what it does
=========================  ===========================================================================
``GET /``                  the playground page (prompt, sampling settings, streamed output, session)
``GET /health``            ``{"status": "ok", ...}``: the model, running rows, waiting requests, sessions
``GET /v1/models``         the one model this server holds
``POST /v1/completions``   the OpenAI completions protocol (``stream: true``: server-sent events)
``DELETE /v1/sessions/ID`` forget a session's memory
``/tokenize`` and others   the tokenizer routes (:mod:`~transformer_xl.serve.tokens`)
=========================  ===========================================================================

In front of the routes, the guards of :mod:`~transformer_xl.serve.guard`: the ``Host`` and ``Origin`` checks, the API
keys (``Authorization: Bearer KEY`` on every route but ``/`` and ``/health``; each key has its own sessions), a
request body only as JSON and bounded in size and time. Every error is the protocol's JSON error object with a 4xx
(5xx: a bug or the server stopping); one log line per request (method, path as sent with its control characters
escaped, status, milliseconds, and the tokens of a completion).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from transformer_xl.serve.completions import Completions
from transformer_xl.serve.guard import LOOPBACK_NAMES, OWNER, BodyGuard, HostGuard, KeyGuard
from transformer_xl.serve.memory import release_free_memory
from transformer_xl.serve.protocol import (
    RequestError,
    check_session_id,
    error_body,
    models_object,
    parse_completion,
    parse_json,
)
from transformer_xl.serve.sessions import owned_id
from transformer_xl.serve.tokens import detokenize, scoring_encoder, tokenize, tokenizer_info

log = logging.getLogger("txl.serve")
#: The playground may not be framed by another site's page (clickjacking).
PAGE_HEADERS = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a newline, an ANSI escape) and the backslash escaped as
    in a Python string, so that what a client sends cannot forge or colour a log line."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else ascii(c)[1:-1] for c in text)


def _collect() -> None:
    gc.collect()
    release_free_memory()


class RequestLog:
    """ASGI middleware: one log line per HTTP request when its response has been sent (streams included). A second
    after the last request in flight ended (none but ``/health`` came since; at most once in ``EVERY_S`` seconds),
    the requests' garbage is collected and the heap's free pages go back to the system, in a worker thread
    (:mod:`~transformer_xl.serve.memory`): a server left idle returns to its size."""

    #: Seconds without a request before the idle clean-up, and the least seconds between two clean-ups.
    IDLE_S, EVERY_S = 1.0, 10.0

    def __init__(self, app: Any) -> None:
        self.app = app
        self.in_flight = 0
        self.cleanups = 0
        self._idle: Any = None
        self._last = -float("inf")

    def clean_up(self) -> None:
        """Collect cyclic garbage (a refused body's buffers stay alive through its exception's frames) and hand the
        free pages back, in a worker thread."""
        self._idle = None
        self._last = time.monotonic()
        self.cleanups += 1
        asyncio.get_running_loop().run_in_executor(None, _collect)

    def _schedule(self) -> None:
        wait = max(self.IDLE_S, self._last + self.EVERY_S - time.monotonic())
        self._idle = asyncio.get_running_loop().call_later(wait, self.clean_up)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        counted = scope["path"] != "/health"  # a monitor asking every half second leaves the server idle
        self.in_flight += counted
        if counted and self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            await self.app(scope, receive, watch)
        finally:
            self.in_flight -= counted
            if counted and not self.in_flight:
                self._schedule()
            note = scope.get("state", {}).get("log_note", "")
            raw = scope.get("raw_path")  # the path as sent (percent-escapes kept), else as decoded
            path = raw.decode("latin-1") if isinstance(raw, bytes) else scope["path"]
            log.info("%s %s %d %.0fms%s", printable(scope["method"]), printable(path), status[0] or 499,
                     1000 * (time.perf_counter() - start), f" {note}" if note else "")


#: Bodies larger than this are parsed (and their answers serialized) in a worker thread, not on the event loop.
SMALL_BODY = 64 * 1024


async def off_loop(body: bytes, work: Callable[[bytes], Any]) -> Any:
    """``work(body)``: at once for a small body, else in a worker thread (parsing megabytes of JSON, checking a
    million ids, would hold every other request and stream)."""
    return work(body) if len(body) <= SMALL_BODY else await asyncio.to_thread(work, body)


async def json_off_loop(body: bytes, work: Callable[[bytes], Any]) -> Response:
    """The JSON response of ``work(body)``, computed and serialized in a worker thread (sized by the request)."""
    return Response(await asyncio.to_thread(lambda: json.dumps(work(body))), media_type="application/json")


class EventStream(StreamingResponse):
    """Server-sent events whose job is cancelled however the response ends: also when it fails or is cancelled
    before its first event (the events' own ``finally`` runs only once they have been iterated)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()  # runs the events' finally: the job leaves at the engine's next step


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def create_app(completions: Completions, *, api_key: str | Sequence[str] | None = None, info: dict | None = None,
               hosts: Iterable[str] = (), body_timeout: float = 30.0) -> Any:
    """The ASGI application serving ``completions``: :class:`RequestLog` over the guards over the routes.

    ``api_key``: a key or several (none: the ``Host`` is checked, it must be ``localhost``, an IP address or one of
    ``hosts``); ``body_timeout``: seconds a request body may take to arrive."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)  # no API pages (where a title would show)
    engine, limits = completions.engine, completions.limits

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(error_body(str(exc.detail), code=code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("txl serve: internal error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", kind="server_error"), status_code=500)

    def owner(request: Request) -> str | None:
        return request.scope.get("state", {}).get(OWNER)

    @app.get("/", response_class=HTMLResponse)
    async def playground() -> HTMLResponse:
        page = resources.files("transformer_xl.serve").joinpath("playground.html").read_text("utf-8")
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": completions.model_name, **(info or {}), **engine.stats()}

    @app.get("/v1/models")
    async def models() -> dict:
        return models_object(completions.model_name)

    @app.post("/v1/completions")
    async def complete(request: Request) -> Any:
        req = await off_loop(await request.body(), lambda body: parse_completion(parse_json(body), limits))
        if req.session is not None:
            req.session = owned_id(owner(request), req.session)  # each key its own sessions
        if req.stream:
            events = await completions.stream(req)  # a refusal raises here, before any byte is sent
            request.state.log_note = "stream"
            return EventStream(events, media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        out = await completions.complete(req, request.is_disconnected)
        request.state.log_note = f"{out['usage']['prompt_tokens']}+{out['usage']['completion_tokens']} tokens"
        # serialized in a worker thread: an echoed prompt's log-probabilities are megabytes of JSON
        return Response(await asyncio.to_thread(json.dumps, out), media_type="application/json")

    @app.delete("/v1/sessions/{sid:path}")  # an id with a "/" (decoded from %2F) is refused, not a missing route
    async def drop_session(request: Request, sid: str) -> dict:
        if not engine.sessions.drop(owned_id(owner(request), check_session_id(sid))):
            raise RequestError(f"no session {sid!r}", status=404, param="session", code="session_not_found")
        return {"id": sid, "object": "session", "deleted": True}

    codec = completions.codec
    scoring = scoring_encoder(codec)
    about = tokenizer_info(codec, limits)  # once: it encodes (which waits for any other encoding)

    async def tokenizer() -> dict:
        return about

    async def encode(request: Request) -> Response:
        return await json_off_loop(await request.body(), lambda body: tokenize(scoring, limits, body))

    async def decode(request: Request) -> Response:
        return await json_off_loop(await request.body(), lambda body: detokenize(codec, limits, body))

    for prefix in ("", "/v1"):  # where vLLM has them (lm-evaluation-harness asks at the root), and under /v1/
        app.add_api_route(prefix + "/tokenizer_info", tokenizer, methods=["GET"])
        app.add_api_route(prefix + "/tokenize", encode, methods=["POST"])
        app.add_api_route(prefix + "/detokenize", decode, methods=["POST"])
    names = [*LOOPBACK_NAMES, *hosts]
    guarded = HostGuard(KeyGuard(BodyGuard(app, limits.max_body_bytes, body_timeout), keys), names,
                        check_host=not keys)
    return RequestLog(guarded)
