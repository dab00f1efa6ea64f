"""The HTTP side of ``txl serve``: a FastAPI application over :class:`~transformer_xl.serve.completions.Completions`.

=========================  ===========================================================================
route                      what it does
=========================  ===========================================================================
``GET /``                  the playground page (prompt, sampling settings, streamed output, session)
``GET /health``            ``{"status": "ok", ...}``: the model, running rows, waiting requests, sessions
``GET /v1/models``         the one model this server holds
``POST /v1/completions``   the OpenAI completions protocol (``stream: true``: server-sent events)
``DELETE /v1/sessions/ID`` forget a session's memory
=========================  ===========================================================================

With an API key, every ``/v1/`` route wants ``Authorization: Bearer KEY`` (401 otherwise); ``/`` and
``/health`` stay open. Every error is the protocol's JSON error object with a 4xx (5xx: a bug or the server
stopping); one log line per request (method, path, status, milliseconds, and the tokens of a completion).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from transformer_xl.serve.completions import Completions
from transformer_xl.serve.protocol import RequestError, error_body, models_object, parse_completion

log = logging.getLogger("txl.serve")


class RequestLog:
    """ASGI middleware: one log line per HTTP request when its response has been sent (streams included)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            note = scope.get("state", {}).get("log_note", "")
            log.info("%s %s %d %.0fms%s", scope["method"], scope["path"], status[0] or 499,
                     1000 * (time.perf_counter() - start), f" {note}" if note else "")


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def create_app(completions: Completions, *, api_key: str | None = None, info: dict | None = None) -> Any:
    """The ASGI application (with :class:`RequestLog`) serving ``completions``."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)  # no API pages (where a title would show)
    engine = completions.engine

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

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        if api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _error(RequestError("a valid API key is needed: Authorization: Bearer KEY", status=401,
                                           code="invalid_api_key"))
        return await call_next(request)

    @app.get("/", response_class=HTMLResponse)
    async def playground() -> HTMLResponse:
        return HTMLResponse(resources.files("transformer_xl.serve").joinpath("playground.html").read_text("utf-8"))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": completions.model_name, **(info or {}), **engine.stats()}

    @app.get("/v1/models")
    async def models() -> dict:
        return models_object(completions.model_name)

    @app.post("/v1/completions")
    async def complete(request: Request) -> Any:
        body = await request.body()
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(f"the request body is not valid JSON ({exc})", code="invalid_json") from None
        req = parse_completion(doc, completions.limits)
        if req.stream:
            events = completions.stream(req)
            request.state.log_note = "stream"
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        out = await completions.complete(req, request.is_disconnected)
        request.state.log_note = f"{out['usage']['prompt_tokens']}+{out['usage']['completion_tokens']} tokens"
        return out

    @app.delete("/v1/sessions/{sid}")
    async def drop_session(sid: str) -> dict:
        if not engine.sessions.drop(sid):
            raise RequestError(f"no session {sid!r}", status=404, param="session", code="session_not_found")
        return {"id": sid, "object": "session", "deleted": True}

    return RequestLog(app)
