"""Stopping a run cleanly: SIGTERM or Ctrl-C ask it to stop after the current step (the trainer then saves a
checkpoint and exits 0); a second signal interrupts at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], bool]) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT call ``request_stop()``; when it returns False (a stop was
    already requested) the signal raises ``KeyboardInterrupt`` instead. The previous handlers are restored
    afterwards. Off the main thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        if not request_stop():
            raise KeyboardInterrupt

    for s in old:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
