"""--compile in training: the fallback line, and the clock that logs the steps that compiled."""

from __future__ import annotations

import torch
from torch import nn

from transformer_xl.train import compiling
from transformer_xl.train.compiling import CompileClock, SegmentRouted, compile_for_training


def test_fallback_is_the_eager_model_with_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(compiling, "compile_unavailable", lambda device: "no C++ compiler")
    model = nn.Linear(2, 2)
    assert compile_for_training(model, tgt_len=4, device="cpu", main=True) is model
    assert capsys.readouterr().err == "txl train: --compile unavailable (no C++ compiler); training eager\n"
    compile_for_training(model, tgt_len=4, device="cpu", main=False)
    assert capsys.readouterr().err == ""  # other ranks stay silent


def test_clock_logs_only_the_steps_that_made_graphs(monkeypatch, capsys) -> None:
    made = iter([0, 2, 2, 2])  # graph counts read before/after two steps
    monkeypatch.setattr(compiling, "graph_count", lambda: next(made))
    events: list[dict] = []
    clock = CompileClock(True, lambda **kw: events.append(kw), main=True)
    assert clock.step(lambda: {"loss": 1.0}) == {"loss": 1.0}
    clock.step(lambda: {"loss": 2.0})
    assert clock.graphs == 2 and len(events) == 1 and events[0]["graphs"] == 2
    assert "compiled 2 graph(s)" in capsys.readouterr().err
    off = CompileClock(False, lambda **kw: events.append(kw), main=True)
    assert off.step(lambda: {"loss": 3.0}) == {"loss": 3.0} and len(events) == 1  # eager: not timed


def test_graph_count_is_an_int() -> None:
    assert isinstance(compiling.graph_count(), int)


def test_segments_of_another_length_run_eager() -> None:
    """The compiled model takes the segments of tgt_len targets; a shorter last segment runs eager (no graph of its
    own), and attributes such as DDP's no_sync are the eager model's."""
    calls: list[str] = []

    class Eager(nn.Module):
        def forward(self, x, y, mems):
            calls.append("eager")

        def no_sync(self) -> str:
            return "eager's no_sync"

    routed = SegmentRouted(Eager(), lambda x, y, mems: calls.append("compiled"), tgt_len=4)
    routed(torch.zeros(2, 4), torch.zeros(2, 4), None)
    routed(torch.zeros(2, 3), torch.zeros(2, 3), None)
    assert calls == ["compiled", "eager"]
    assert routed.no_sync() == "eager's no_sync"
