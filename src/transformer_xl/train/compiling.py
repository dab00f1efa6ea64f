"""``--compile`` in training: the model compiled (:func:`transformer_xl.model.fastpath.compiled`) or, where
``torch.compile`` cannot run, a one-line explanation and the eager model; and the compile time counted, each step
that made new graphs on its own line of the log."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from transformer_xl.model.fastpath import compile_unavailable, compiled


def compile_for_training(model: nn.Module, *, tgt_len: int, device: str, main: bool) -> Any:
    """``model`` compiled for training (:class:`SegmentRouted`), or ``model`` itself with one line on stderr (rank 0)
    saying why not."""
    why = compile_unavailable(device)
    if why is None:
        return SegmentRouted(model, compiled(model), tgt_len)
    if main:
        print(f"txl train: --compile unavailable ({why}); training eager", file=sys.stderr)
    return model


class SegmentRouted:
    """The compiled model for segments of ``tgt_len`` targets, the eager one for others: the last, shorter segment
    of an epoch (and the segments of ``--varlen``) would each compile a graph of their own (static shapes) for one
    step. Two graphs are made: the first segment (no memory) and the steady state. Attributes (``no_sync`` of DDP)
    are the eager model's."""

    def __init__(self, eager: nn.Module, compiled_model: Any, tgt_len: int) -> None:
        self.eager, self.compiled, self.tgt_len = eager, compiled_model, tgt_len

    def __call__(self, input_ids: Any, targets: Any, *args: Any, **kwargs: Any) -> Any:
        fn = self.compiled if targets.size(1) == self.tgt_len else self.eager
        return fn(input_ids, targets, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.eager, name)


def graph_count() -> int:
    """Graphs ``torch.compile`` has made in this process (dynamo's counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileClock:
    """Wall seconds of the training steps that compiled new graphs (when ``enabled``), and how many graphs they
    made; each such step is ``log(step_seconds=..., compile_seconds_total=..., graphs=...)`` (the run log's
    ``compile`` event) and one line on stderr (``main``: rank 0)."""

    def __init__(self, enabled: bool, log: Callable[..., None], main: bool) -> None:
        self.enabled, self.log, self.main = enabled, log, main
        self.seconds, self.graphs = 0.0, 0

    def step(self, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """``fn(*args)``, one training step, timed if it compiles."""
        if not self.enabled:
            return fn(*args)
        before, t = graph_count(), time.monotonic()
        out = fn(*args)
        made, took = graph_count() - before, time.monotonic() - t
        if made:
            self.seconds += took
            self.graphs += made
            self.log(step_seconds=round(took, 2), compile_seconds_total=round(self.seconds, 2), graphs=self.graphs)
            if self.main:
                print(f"txl train: compiled {made} graph(s) in a {took:.1f} s step ({self.seconds:.1f} s of "
                      "compiling steps so far)", file=sys.stderr)
        return out
