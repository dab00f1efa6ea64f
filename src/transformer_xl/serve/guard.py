"""The guards in front of the ``txl serve`` routes: who may ask (``Host``, ``Origin``, API key) and what a request body
may be (JSON, bounded in size and in time).

Each guard is plain ASGI, not Starlette's ``BaseHTTPMiddleware``: behind that, a route never hears that its client
went away (``request.is_disconnected()`` stays false), so a whole completion whose client left decoded on to its
end. A refusal is the protocol's JSON error object, sent before any route sees the request, and closes the
connection (its body may be unread):

==================  ======  ===============================================================================
guard               status  refuses
==================  ======  ===============================================================================
:class:`HostGuard`  421     without an API key, a ``Host`` that is no name of this server (DNS rebinding: a web
                            page whose own name has been pointed at 127.0.0.1)
..                  403     an ``Origin`` (a web page's request) of another site
:class:`KeyGuard`   401     with API keys, a request without ``Authorization: Bearer KEY`` (``/`` and
                            ``/health`` stay open)
:class:`BodyGuard`  415     a ``POST`` body that is not ``application/json`` (a form or a ``text/plain`` fetch,
                            which a web page may send to any site without asking first)
..                  413     a body over ``max_bytes``: by its ``Content-Length``, or counted as it arrives
..                  408     a body that has not arrived within ``timeout`` seconds (a slow client holding a
                            connection)
==================  ======  ===============================================================================
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from transformer_xl.serve.protocol import RequestError

App = Callable[[dict, Any, Any], Awaitable[None]]
#: The names every server answers to (with or without a port).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: Routes open without an API key: the playground page and the health check.
OPEN_PATHS = frozenset({"/", "/health"})
#: Where :class:`KeyGuard` leaves the owner of the key a request gave (``scope["state"][OWNER]``).
OWNER = "key_owner"


def header(scope: dict, name: bytes) -> str | None:
    """The value of header ``name`` (lower case) of an ASGI ``scope``, or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def refuse(send: Any, err: RequestError, *extra: tuple[bytes, bytes]) -> None:
    """Send ``err`` as the protocol's error object, and close the connection after it."""
    body = json.dumps(err.body()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra]})
    await send({"type": "http.response.body", "body": body})


def host_name(value: str) -> str:
    """The name of a ``Host`` header or URL authority, lower case, without its port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    name = value if value.count(":") > 1 else value.partition(":")[0]  # a bare IPv6 address keeps its colons
    return name.rstrip(".")  # "localhost." is the fully qualified "localhost"


def is_ip(name: str) -> bool:
    """Whether ``name`` is an IP address (no DNS name can be rebound to it)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """421 for a ``Host`` that names neither ``names``, nor an IP address (when ``check_host``: a server without an
    API key); 403 for an ``Origin`` that is neither ``names`` nor the ``Host`` itself (another site's page)."""

    def __init__(self, app: App, names: Iterable[str], *, check_host: bool) -> None:
        self.app, self.check_host = app, check_host
        self.names = frozenset(host_name(n) for n in names)

    def origin_ok(self, origin: str, host: str) -> bool:
        """Whether a page at ``origin`` may call this server reached as ``host``."""
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null": a file, a sandboxed frame
        return parts.netloc.lower() == host.strip().lower() or host_name(parts.netloc) in self.names

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = header(scope, b"host")
        if self.check_host and host is not None and not (host_name(host) in self.names or is_ip(host_name(host))):
            return await refuse(send, RequestError(
                f"the Host header {host!r:.80} is no name of this server: without an API key it answers to "
                "localhost, an IP address and --allowed-host names only (a guard against DNS rebinding)",
                status=421, code="invalid_host"))
        origin = header(scope, b"origin")
        if origin is not None and not self.origin_ok(origin, host or ""):
            return await refuse(send, RequestError(
                f"a request from the web page at {origin!r:.80} is refused: only this server's own pages (and "
                "--allowed-host names) may call it", status=403, code="cross_origin"))
        await self.app(scope, receive, send)


class KeyGuard:
    """401 for a request without ``Authorization: Bearer KEY`` (the scheme in any case) naming one of ``keys``, on
    every path but ``open_paths``; the index of the key given goes to ``scope["state"][OWNER]`` (``key1``, ...)."""

    def __init__(self, app: App, keys: Sequence[str], open_paths: Iterable[str] = OPEN_PATHS) -> None:
        self.app, self.keys, self.open_paths = app, [k.encode() for k in keys], frozenset(open_paths)

    def owner(self, authorization: str | None) -> str | None:
        """``keyN`` for the N-th key, or None when ``authorization`` names none of them."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        given = token.strip().encode("latin-1")
        found = None
        for i, key in enumerate(self.keys, 1):  # every key compared, in constant time
            if hmac.compare_digest(given, key) and found is None:
                found = f"key{i}"
        return found if scheme.lower() == "bearer" else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        owner = self.owner(header(scope, b"authorization"))
        if owner is None:
            return await refuse(send, RequestError("a valid API key is needed: Authorization: Bearer KEY", status=401,
                                                   code="invalid_api_key"), (b"www-authenticate", b"Bearer"))
        scope.setdefault("state", {})[OWNER] = owner
        await self.app(scope, receive, send)


class BodyTooLarge(Exception):
    """A request body beyond the limit (:class:`BodyGuard`)."""


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` is ``application/json`` (parameters such as ``charset`` allowed)."""
    return (content_type or "").partition(";")[0].strip().lower() == "application/json"


class BodyGuard:
    """Read each request's body before the routes: ``POST`` only as JSON (415), at most ``max_bytes`` (413) within
    ``timeout`` seconds (408); the routes then read it from memory, and hear of a disconnection as usual."""

    def __init__(self, app: App, max_bytes: int, timeout: float) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def read(self, receive: Any) -> bytes | None:
        """The whole body, counted as it arrives (None: the client went away)."""
        body = bytearray()  # one buffer: many small chunks cost no more than their bytes
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > self.max_bytes:
                raise BodyTooLarge
            body += chunk
            if not message.get("more_body", False):
                return bytes(body)

    def too_large(self) -> RequestError:
        """The 413 of a body over the limit."""
        return RequestError(f"the request body is larger than this server takes ({self.max_bytes} bytes, "
                            "--max-body-bytes)", status=413, code="body_too_large")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == "POST" and not is_json(header(scope, b"content-type")):
            return await refuse(send, RequestError(
                f"a request body must be JSON, sent as Content-Type: application/json (got "
                f"{header(scope, b'content-type')!r:.60})", status=415, code="unsupported_media_type"))
        length = (header(scope, b"content-length") or "").strip()
        if length.isascii() and length.isdigit() and int(length) > self.max_bytes:
            return await refuse(send, self.too_large())
        try:
            body = await asyncio.wait_for(self.read(receive), self.timeout)
        except BodyTooLarge:
            return await refuse(send, self.too_large())
        except asyncio.TimeoutError:
            return await refuse(send, RequestError(f"the request body did not arrive within {self.timeout:g} s "
                                                   "(--body-timeout)", status=408, code="body_timeout"))
        if body is None:
            return None
        pending: list[dict] = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay() -> dict:
            # no await before returning the body: Starlette's is_disconnected() calls this in a cancelled scope
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)
