"""Sessions: a Transformer-XL memory kept between requests, so that a text is continued without re-reading it.

A session's state is what generation carries from one segment to the next (paper Sec. 3.2): the memories of the
last ``mem_len`` positions of every layer (``n_layer + 1`` tensors of ``[1, mem_len, d_model]``), the token chosen
last but not yet read, and the last few ids (so that the text of the next reply joins the earlier text). Its size
is fixed however long the conversation grows: :func:`session_bytes`.

:class:`SessionStore` keeps at most ``max_sessions`` of them (the least recently used is dropped first), drops a
session idle for ``idle_timeout`` seconds, and lets one request at a time use a session (another gets 409).

With API keys, each key has its own sessions: the store holds :func:`owned_id` ``(owner, sid)`` (``OWNER/SID``; a
session id never holds ``/``, see :data:`~transformer_xl.serve.protocol.SESSION_ID`), so that key A's ``s1`` is not
key B's; messages name the session as its client does (:func:`shown_id`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from transformer_xl.errors import check_int
from transformer_xl.model import TransformerXLLM
from transformer_xl.serve.protocol import RequestError

#: How many of a session's last ids are kept to detokenize its next reply (a word's spacing, a UTF-8 sequence).
TAIL = 8


def owned_id(owner: str | None, sid: str) -> str:
    """The store's id of session ``sid`` of the API key ``owner`` (None: a server without keys)."""
    return sid if owner is None else f"{owner}/{sid}"


def shown_id(key: str) -> str:
    """The session id a client gave, from the store's id (:func:`owned_id`)."""
    return key.rpartition("/")[2]


@dataclass
class SessionState:
    """What a session remembers between two requests."""

    mems: list[Tensor]  # n_layer + 1 tensors [1, m, d_model], m <= mem_len
    pending: list[int] = field(default_factory=list)  # ids chosen but not yet read (the last generated token)
    tail: list[int] = field(default_factory=list)  # the last ids of its text
    tokens: int = 0  # ids read so far, over every request


def session_bytes(model: TransformerXLLM, mem_len: int | None = None) -> int:
    """Bytes of one full session memory: ``(n_layer + 1) * mem_len * d_model * bytes per element``."""
    cfg = model.config
    length = cfg.mem_len if mem_len is None else mem_len
    return (cfg.n_layer + 1) * length * cfg.d_model * next(model.parameters()).element_size()


class SessionStore:
    """Sessions by id: least-recently-used eviction beyond ``max_sessions``, idle ones dropped after
    ``idle_timeout`` seconds, one request at a time per session. Thread-safe."""

    def __init__(self, max_sessions: int = 64, idle_timeout: float = 900.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = check_int("max_sessions", max_sessions, 0)
        self.idle_timeout = float(idle_timeout)
        self._clock = clock
        self._lock = threading.Lock()
        self._states: OrderedDict[str, tuple[SessionState, float]] = OrderedDict()  # oldest use first
        self._busy: set[str] = set()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._states)

    def __contains__(self, sid: object) -> bool:
        with self._lock:
            self._expire()
            return sid in self._states

    def acquire(self, sid: str) -> SessionState | None:
        """Reserve session ``sid`` for one request: its state (None for a new session); 409 while another request
        uses it, 400 when sessions are off."""
        if self.max_sessions == 0:
            raise RequestError("sessions are off on this server (--max-sessions 0)", param="session")
        with self._lock:
            self._expire()
            if sid in self._busy:
                raise RequestError(f"session {shown_id(sid)!r} is in use by another request", status=409,
                                   param="session", code="session_busy")
            self._busy.add(sid)
            entry = self._states.get(sid)
            return None if entry is None else entry[0]

    def release(self, sid: str, state: SessionState | None) -> None:
        """End a request on ``sid``: keep ``state`` (None: keep what it had), then evict beyond the bound."""
        with self._lock:
            self._busy.discard(sid)
            if state is not None:
                self._states[sid] = (state, self._clock())
                self._states.move_to_end(sid)
            elif sid in self._states:
                self._states[sid] = (self._states[sid][0], self._clock())
                self._states.move_to_end(sid)
            idle = [s for s in self._states if s not in self._busy]
            for old in idle[:max(0, len(self._states) - self.max_sessions)]:
                del self._states[old]

    def drop(self, sid: str) -> bool:
        """Forget ``sid``; False when there was no such session (409 while a request uses it)."""
        with self._lock:
            if sid in self._busy:
                raise RequestError(f"session {shown_id(sid)!r} is in use by a request", status=409, code="session_busy")
            return self._states.pop(sid, None) is not None

    def _expire(self) -> None:
        now = self._clock()
        for sid in [s for s, (_, used) in self._states.items() if now - used > self.idle_timeout
                    and s not in self._busy]:
            del self._states[sid]
