"""The progress decision (bar on a terminal, lines otherwise), its lines and its ETA."""

from __future__ import annotations

import io

import pytest

from transformer_xl.data.progress import Progress, format_eta, progress_mode


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_mode_is_a_bar_only_on_a_terminal_and_when_enabled() -> None:
    assert progress_mode(True, _Tty()) == "bar"
    assert progress_mode(False, _Tty()) == "lines"  # --no-progress
    assert progress_mode(True, io.StringIO()) == "lines"  # a batch job's log
    assert Progress(10, desc="x", stream=io.StringIO()).mode == "lines"
    bar = Progress(10, desc="x", stream=_Tty())
    assert bar.mode == "bar" and bar.bar is not None
    bar.close()
    with pytest.raises(ValueError, match="progress mode"):
        Progress(10, desc="x", mode="loud")


def test_lines_come_every_n_units_with_the_fields_and_an_eta() -> None:
    out = io.StringIO()
    with Progress(10, desc="work", unit="seg", every=4, stream=out, initial=2) as p:
        p.update(1, loss=1.5)  # 3
        p.update(2)  # 5: crosses 4
        p.update(5)  # 10: crosses 8, and the end
        p.write("a message")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1] == "a message"
    assert lines[0].startswith("work 5/10 (50%) | loss 1.5 | ") and " seg/s | ETA " in lines[0]
    assert lines[1].startswith("work 10/10 (100%) | loss 1.5 | ") and lines[1].endswith("ETA 0:00:00")


def test_off_writes_nothing_and_short_work_stays_quiet() -> None:
    out = io.StringIO()
    with Progress(4, desc="x", mode="off", stream=out) as p:
        p.update(4)
        p.write("hidden")
    with Progress(4, desc="x", mode="lines", stream=out, every=1, min_seconds=3600) as p:
        p.update(4)
    assert out.getvalue() == ""


def test_rate_in_another_unit_and_eta_format() -> None:
    out = io.StringIO()
    with Progress(None, desc="tokenize", unit="line", rate_unit="tok", every=1, stream=out) as p:
        p.update(1, amount=100)
    assert out.getvalue().startswith("tokenize 1 | ") and " tok/s" in out.getvalue() and "ETA" not in out.getvalue()
    assert format_eta(3725) == "1:02:05" and format_eta(float("nan")) == "?" and format_eta(-1) == "?"
