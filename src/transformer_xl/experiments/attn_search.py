"""The attention-length search of the ablations (paper Table 6, "Attn Len"): the shortest evaluation attention length
whose loss is within a tolerance of the best, found by doubling and then bisection (:func:`search_attention_length`,
pure: the loss of a length is a function it is given). Used by :mod:`transformer_xl.experiments.ablations`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformer_xl.errors import ConfigError, check_int


@dataclass(frozen=True)
class AttnSearch:
    """Settings of the attention-length search (module docstring): bisection resolution ``step``, longest
    length ``max_len``, and ``rel_tol``, the relative tolerance on the loss that counts as reaching the best."""

    step: int
    max_len: int
    rel_tol: float = 1e-3

    def __post_init__(self) -> None:
        check_int("step", self.step, 1)
        check_int("max_len", self.max_len, 1)
        if not (math.isfinite(self.rel_tol) and self.rel_tol >= 0):
            raise ConfigError(f"rel_tol must be a finite number >= 0, got {self.rel_tol!r}")


def search_attention_length(loss_at: Callable[[int], float], *, start: int, step: int, max_len: int,
                            rel_tol: float) -> dict[str, Any]:
    """The shortest attention length whose loss is within ``rel_tol`` of the best, for a loss function of the
    length (pure: ``loss_at`` is the only evaluator).

    Doubling from ``start`` while each length improves on the best so far by more than ``rel_tol x best``
    (up to ``max_len``, evaluated last when it is not a doubling of ``start``); then, with ``best`` the lowest
    loss seen and ``hi`` the shortest length within ``best * (1 + rel_tol)`` and ``lo`` the longest shorter
    length evaluated (0 when none), ``(lo + hi) // 2`` is evaluated until ``hi - lo <= step``. Returns
    ``attn_len`` (= ``hi``), ``loss`` (the best), ``censored`` (still improving at ``max_len``) and ``tried``
    (every ``(length, loss)`` in evaluation order).
    """
    check_int("start", start, 1)
    check_int("step", step, 1)
    check_int("max_len", max_len, start)
    tried: dict[int, float] = {}

    def f(a: int) -> float:
        if a not in tried:
            tried[a] = float(loss_at(a))
        return tried[a]

    a, censored = start, True
    f(a)
    while a < max_len:
        best = min(tried.values())
        nxt = min(2 * a, max_len)
        if not f(nxt) < best - rel_tol * abs(best):
            censored = False
            break
        a = nxt
    while True:
        best = min(tried.values())
        hi = min(n for n, loss in tried.items() if loss <= best + rel_tol * abs(best))
        lo = max((n for n in tried if n < hi), default=0)
        if hi - lo <= step:
            break
        f((lo + hi) // 2)
    return {"attn_len": hi, "loss": best, "censored": censored and min(tried, key=tried.__getitem__) == max_len,
            "tried": list(tried.items())}
