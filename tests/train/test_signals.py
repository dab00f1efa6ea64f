"""Stopping cleanly on SIGTERM/SIGINT: the first signal asks to stop, a second Ctrl-C interrupts at once; a repeated
SIGTERM (a scheduler and torchrun both send one) or a SIGINT right after the first signal only repeats the request."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from transformer_xl.train import signals
from transformer_xl.train.signals import stop_on_signals

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _previous(signum, frame) -> None:  # pragma: no cover - replaced inside every block
    raise AssertionError(f"the handler in place before the block got signal {signum}")


@pytest.fixture
def handlers() -> Iterator[None]:
    """Known handlers before the test (never the default SIGTERM one, which would end pytest); the original
    ones after it."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _previous)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


class _Requests:
    """``request_stop``: True the first time (stop after this step), False afterwards (already stopping)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls == 1


@pytest.mark.parametrize("signum", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_first_signal_requests_a_stop_and_the_block_goes_on(handlers, signum) -> None:
    request = _Requests()
    after = False
    with stop_on_signals(request):
        os.kill(os.getpid(), signum)  # the handler runs before os.kill returns (signal sent to this process)
        assert request.calls == 1
        after = True
    assert after and request.calls == 1


@pytest.mark.parametrize("first", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_second_sigint_interrupts(handlers, monkeypatch, first) -> None:
    monkeypatch.setattr(signals, "SIGINT_GRACE", 0.0)
    request = _Requests()
    with pytest.raises(KeyboardInterrupt), stop_on_signals(request):
        os.kill(os.getpid(), first)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("not interrupted")  # pragma: no cover
    assert request.calls == 2
    assert all(signal.getsignal(s) is _previous for s in SIGNALS)  # restored on the way out too


@pytest.mark.parametrize("first", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_a_repeated_sigterm_only_repeats_the_request(handlers, monkeypatch, first) -> None:
    monkeypatch.setattr(signals, "SIGINT_GRACE", 0.0)
    request = _Requests()
    with stop_on_signals(request):
        for _ in range(3):
            os.kill(os.getpid(), first if _ == 0 else signal.SIGTERM)
    assert request.calls == 3


def test_a_sigint_within_the_grace_is_the_same_request(handlers) -> None:
    request = _Requests()  # torchrun forwards the Ctrl-C its workers received from the terminal already
    with stop_on_signals(request):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    assert request.calls == 2


def test_a_sigint_interrupts_when_request_stop_says_so(handlers) -> None:
    with pytest.raises(KeyboardInterrupt), stop_on_signals(lambda: False):
        os.kill(os.getpid(), signal.SIGINT)


def test_handlers_are_installed_inside_and_restored_after(handlers) -> None:
    with stop_on_signals(_Requests()):
        inside = [signal.getsignal(s) for s in SIGNALS]
    assert all(h is not _previous and callable(h) for h in inside)
    assert all(signal.getsignal(s) is _previous for s in SIGNALS)


def test_handlers_are_restored_when_the_block_raises(handlers) -> None:
    with pytest.raises(RuntimeError, match="boom"), stop_on_signals(_Requests()):
        raise RuntimeError("boom")
    assert all(signal.getsignal(s) is _previous for s in SIGNALS)


def test_off_the_main_thread_it_does_nothing(handlers) -> None:
    seen: dict[str, object] = {}

    def work() -> None:
        try:
            with stop_on_signals(_Requests()):
                seen["inside"] = [signal.getsignal(s) for s in SIGNALS]
        except Exception as exc:  # pragma: no cover - signal.signal raises ValueError off the main thread
            seen["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in seen, seen.get("error")
    assert seen["inside"] == [_previous, _previous]  # nothing installed
    assert all(signal.getsignal(s) is _previous for s in SIGNALS)
