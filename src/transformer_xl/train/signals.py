"""Stopping a run cleanly: SIGTERM or Ctrl-C ask it to stop after the current step (the trainer then saves a
checkpoint and exits 0); a second Ctrl-C interrupts at once.

A repeated SIGTERM only repeats the request: a scheduler that preempts a ``torchrun`` job (SLURM, Kubernetes)
signals the workers, and the ``torchrun`` agent forwards its own SIGTERM to them as well, so a worker commonly
receives two; neither may cut the checkpoint short. For the same reason a second SIGINT within
:data:`SIGINT_GRACE` seconds of the first (Ctrl-C reaches ``torchrun`` and its workers, which ``torchrun`` then
signals again) is taken as the same request.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

#: Seconds after a first stop signal during which a SIGINT is the same request, not a second Ctrl-C.
SIGINT_GRACE = 1.0


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], bool]) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT call ``request_stop()``; when it returns False (a stop was
    already requested) a SIGINT more than :data:`SIGINT_GRACE` seconds after the first signal raises
    ``KeyboardInterrupt`` instead. The previous handlers are restored afterwards. Off the main thread (where Python
    cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    first: list[float] = []

    def handler(signum: int, frame: Any) -> None:
        now = time.monotonic()
        if request_stop():
            first[:] = [now]
        elif signum == signal.SIGINT and (not first or now - first[0] > SIGINT_GRACE):
            raise KeyboardInterrupt

    for s in old:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
