"""Progress of long work on stderr, decided once: a tqdm bar, plain periodic lines, or nothing.

``mode`` is ``"auto"`` (a bar when stderr is a terminal, else lines: batch jobs' logs get lines, not the
carriage returns of a bar), ``"bar"``, ``"lines"`` or ``"off"``. :func:`progress_mode` maps a command's
``--progress/--no-progress`` to a mode: ``--no-progress`` keeps the plain lines. stdout is never written to.

A line reads ``DESC 40/100 (40%) | loss 5.12 | ... | 812 tok/s | ETA 0:01:02``: done/total, the fields last
given to :meth:`Progress.update`, the rate and the estimated time left. Lines come every ``every`` units (by
default about every 10 % of ``total``) and only once ``min_seconds`` have passed, so short work stays quiet.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

MODES = ("auto", "bar", "lines", "off")


def progress_mode(enabled: bool = True, stream: TextIO | None = None) -> str:
    """``"bar"`` when ``enabled`` and ``stream`` (default: stderr) is a terminal; otherwise ``"lines"``."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "bar" if enabled and callable(isatty) and isatty() else "lines"


def format_eta(seconds: float) -> str:
    """``H:MM:SS`` (``?`` when unknown)."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")) or seconds < 0:
        return "?"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """A bar or periodic lines over ``total`` units of work (see the module docstring); a context manager.

    ``initial`` units are already done (a resumed run): rates and ETA count only what this process does.
    ``rate_unit`` names the rate's unit when :meth:`update` is given ``amount`` (e.g. tokens per second
    while the bar counts steps)."""

    def __init__(self, total: int | None, *, desc: str, unit: str = "it", mode: str = "auto", initial: int = 0,
                 every: int | None = None, min_seconds: float = 0.0, rate_unit: str | None = None,
                 stream: TextIO | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {MODES}, got {mode!r}")
        self.stream = sys.stderr if stream is None else stream
        self.mode = progress_mode(True, self.stream) if mode == "auto" else mode
        self.total, self.desc, self.unit, self.rate_unit = total, desc, unit, rate_unit
        self.n = self.initial = initial
        self.amount = 0.0
        self.fields: dict[str, str] = {}
        self.every = every if every is not None else max(1, (total or 10) // 10)
        self.min_seconds = min_seconds
        self.start = time.monotonic()
        self.bar: Any = None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, mininterval=1.0,
                            file=self.stream, delay=min_seconds, leave=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set_fields(self, **fields: Any) -> None:
        """Fields shown on the bar and on the next lines (values already formatted, or numbers)."""
        self.fields = {k: (f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in fields.items()}
        if self.bar is not None:
            self.bar.set_postfix(self.fields, refresh=False)

    def update(self, n: int = 1, *, amount: float = 0.0, **fields: Any) -> None:
        """``n`` more units done (``amount`` more of ``rate_unit``); a line when one is due."""
        self.n += n
        self.amount += amount
        if fields:
            self.set_fields(**fields)
        if self.bar is not None:
            self.bar.update(n)
        elif self.mode == "lines":
            due = self.n // self.every > (self.n - n) // self.every or self.n == self.total
            if due and time.monotonic() - self.start >= self.min_seconds:
                self.write(self.line())

    def line(self) -> str:
        """The plain progress line for now."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        done = self.n - self.initial
        head = f"{self.desc} {self.n}/{self.total}" if self.total else f"{self.desc} {self.n}"
        if self.total:
            head += f" ({100 * self.n / self.total:.0f}%)"
        parts = [head, *(f"{k} {v}" for k, v in self.fields.items())]
        if self.rate_unit is not None:
            parts.append(f"{self.amount / elapsed:,.0f} {self.rate_unit}/s")
        else:
            parts.append(f"{done / elapsed:,.2f} {self.unit}/s")
        if self.total:
            left = (self.total - self.n) * elapsed / done if done > 0 else float("nan")
            parts.append(f"ETA {format_eta(left)}")
        return " | ".join(parts)

    def write(self, message: str) -> None:
        """A message on the progress stream (above the bar when there is one); nothing when ``mode`` is off."""
        if self.mode == "off":
            return
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
