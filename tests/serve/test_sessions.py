"""Session memories: least-recently-used eviction, idle timeout, one request at a time, the size formula."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import generation_model
from transformer_xl.serve.protocol import RequestError
from transformer_xl.serve.sessions import SessionState, SessionStore, session_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _state(tag: int) -> SessionState:
    return SessionState(mems=[torch.full((1, 2, 3), float(tag))], pending=[tag])


def test_least_recently_used_is_evicted_first() -> None:
    store = SessionStore(max_sessions=2, clock=Clock())
    for sid in ("a", "b"):
        assert store.acquire(sid) is None
        store.release(sid, _state(ord(sid)))
    assert store.acquire("a").pending == [ord("a")]  # a is now the most recent
    store.release("a", None)
    store.acquire("c")
    store.release("c", _state(3))
    assert "b" not in store and "a" in store and "c" in store and len(store) == 2


def test_idle_sessions_expire() -> None:
    clock = Clock()
    store = SessionStore(max_sessions=4, idle_timeout=10, clock=clock)
    store.acquire("a")
    store.release("a", _state(1))
    clock.now = 9.0
    assert "a" in store
    clock.now = 20.0
    assert "a" not in store and store.acquire("a") is None


def test_one_request_at_a_time_and_drop() -> None:
    store = SessionStore()
    store.acquire("a")
    with pytest.raises(RequestError) as info:
        store.acquire("a")
    assert info.value.status == 409
    with pytest.raises(RequestError):
        store.drop("a")
    store.release("a", _state(1))
    assert store.drop("a") is True and store.drop("a") is False
    with pytest.raises(RequestError, match="sessions are off"):
        SessionStore(max_sessions=0).acquire("a")


def test_a_busy_session_is_not_evicted() -> None:
    store = SessionStore(max_sessions=1)
    store.acquire("a")
    store.release("a", _state(1))
    store.acquire("a")
    store.acquire("b")
    store.release("b", _state(2))
    assert "a" in store  # in use: kept beyond the bound until released
    store.release("a", None)
    assert len(store) == 1


def test_session_bytes_is_the_size_of_the_memories() -> None:
    model = generation_model(mem_len=7)
    out = model.generate(torch.arange(12)[None] % model.config.n_token, max_new_tokens=3)
    assert session_bytes(model) == sum(m.numel() * m.element_size() for m in out.mems)
    cfg = model.config
    assert session_bytes(model, 100) == (cfg.n_layer + 1) * 100 * cfg.d_model * 4


def test_refusals_in_full_and_the_defaults() -> None:
    from transformer_xl.errors import ConfigError

    store = SessionStore()
    assert (store.max_sessions, store.idle_timeout) == (64, 900.0) and type(store.idle_timeout) is float
    assert SessionStore(idle_timeout=5).idle_timeout == 5.0 and type(SessionStore(idle_timeout=5).idle_timeout) is float
    with pytest.raises(ConfigError, match=r"^max_sessions must be an integer >= 0, got -1$"):
        SessionStore(max_sessions=-1)
    store.acquire("a")
    with pytest.raises(RequestError) as info:
        store.acquire("a")
    err = info.value
    assert (str(err), err.status, err.param, err.code) == ("session 'a' is in use by another request", 409,
                                                          "session", "session_busy")
    with pytest.raises(RequestError) as info:
        store.drop("a")
    err = info.value
    assert (str(err), err.status, err.param, err.code) == ("session 'a' is in use by a request", 409, None,
                                                          "session_busy")
    with pytest.raises(RequestError) as info:
        SessionStore(max_sessions=0).acquire("a")
    err = info.value
    assert (str(err), err.status, err.param, err.code) == ("sessions are off on this server (--max-sessions 0)", 400,
                                                          "session", None)


def test_a_request_that_keeps_no_new_state_still_counts_as_a_use() -> None:
    """``release(sid, None)``: the state stays, its idle time and its place in the eviction order start again."""
    clock = Clock()
    store = SessionStore(max_sessions=2, idle_timeout=10, clock=clock)
    kept = _state(1)
    for sid, state in (("a", kept), ("b", _state(2))):
        store.acquire(sid)
        store.release(sid, state)
    clock.now = 8.0
    assert store.acquire("a") is kept
    store.release("a", None)  # used at 8: idle until 18; and now the most recent
    clock.now = 10.0  # exactly the timeout for b: kept
    assert "b" in store and len(store) == 2
    store.acquire("c")
    store.release("c", _state(3))  # b, the least recently used, goes
    assert "b" not in store and "a" in store and "c" in store
    clock.now = 15.0
    assert "a" in store and store.acquire("a") is kept
    store.release("a", None)
    store.release("never", None)  # a request on a session that never kept a state: nothing stored
    assert "never" not in store and len(store) == 2
    clock.now = 25.5  # a idle since 15, c since 10: both beyond 10 s
    assert len(store) == 0


def test_a_busy_session_does_not_expire_and_eviction_counts_only_the_excess() -> None:
    clock = Clock()
    store = SessionStore(max_sessions=2, idle_timeout=10, clock=clock)
    store.acquire("a")
    store.release("a", _state(1))
    store.acquire("a")  # busy from here on
    clock.now = 100.0
    assert "a" in store
    for sid in ("b", "c", "d"):
        store.acquire(sid)
        store.release(sid, _state(ord(sid)))
    assert "a" in store and "d" in store and len(store) == 2  # a busy and one idle (the newest): the bound
    store.release("a", None)
    assert len(store) == 2 and "a" in store and "d" in store
    assert store.drop("d") is True and store.drop("zz") is False and len(store) == 1


def test_each_owner_has_its_own_sessions_and_messages_name_the_clients_id() -> None:
    from transformer_xl.serve.sessions import owned_id, shown_id

    store = SessionStore()
    a, b = owned_id("key1", "s1"), owned_id("key2", "s1")
    assert a != b and owned_id(None, "s1") == "s1" and shown_id(a) == shown_id(b) == shown_id("s1") == "s1"
    store.acquire(a)
    store.release(a, _state(1))
    assert a in store and b not in store and "s1" not in store
    assert store.drop(b) is False and store.acquire(b) is None  # key2's s1: new
    with pytest.raises(RequestError, match=r"^session 's1' is in use by another request$"):
        store.acquire(b)
    with pytest.raises(RequestError, match=r"^session 's1' is in use by a request$"):
        store.drop(b)
    assert store.drop(a) is True
