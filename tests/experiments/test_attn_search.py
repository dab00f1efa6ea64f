"""The attention-length search (transformer_xl.experiments.attn_search): the shortest length within the tolerance of
the best."""

from __future__ import annotations

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.experiments import attn_search as A


def _counting(curve):
    calls: list[int] = []

    def loss_at(a: int) -> float:
        calls.append(a)
        return curve(a)

    return loss_at, calls


@pytest.mark.parametrize("curve, shortest", [
    (lambda a: 2.0 + 0.01 * max(0, 100 - a) + 1e-6 * a, 100),  # falls until 100, then flat: 100
    (lambda a: 2.0 + 1e-4 * (a - 50) ** 2, 46),  # a minimum at 50; within 0.1 % of it from 46 (|a - 50| <= 4.47)
    (lambda a: 2.0 + 0.1 * max(0, 10 - a), 10),  # already flat at the start (32): found below it
])
def test_search_finds_the_shortest_length_within_the_tolerance(curve, shortest) -> None:
    loss_at, calls = _counting(curve)
    res = A.search_attention_length(loss_at, start=32, step=4, max_len=1024, rel_tol=1e-3)
    best = min(curve(a) for a in range(1, 1025))
    assert res["loss"] <= best * (1 + 1e-3)
    assert shortest <= res["attn_len"] < shortest + 4  # the resolution: within `step` above the shortest
    assert curve(res["attn_len"]) <= res["loss"] * (1 + 1e-3)
    assert len(calls) == len(set(calls)) == len(res["tried"]) and calls == [a for a, _ in res["tried"]]
    assert calls[:2] == [32, 64] and not res["censored"]
    assert len(calls) < 12  # doubling then bisection, not a scan


def test_search_doubling_and_censoring() -> None:
    loss_at, calls = _counting(lambda a: 1.0 + 1.0 / a)  # improves all the way to the limit
    res = A.search_attention_length(loss_at, start=8, step=8, max_len=100, rel_tol=1e-4)
    assert calls[:5] == [8, 16, 32, 64, 100]  # doubling, then the limit itself
    assert res["censored"] and res["attn_len"] == 100
    loss_at, calls = _counting(lambda a: 2.0 - 0.1 * min(a, 16))  # stops improving after 16: one doubling more
    res = A.search_attention_length(loss_at, start=8, step=1, max_len=1000, rel_tol=1e-3)
    assert calls[:3] == [8, 16, 32] and res["attn_len"] == 16 and not res["censored"]
    with pytest.raises(ConfigError):
        A.search_attention_length(loss_at, start=8, step=0, max_len=100, rel_tol=0.0)
