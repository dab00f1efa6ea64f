"""The RECL metric (transformer_xl.experiments.recl_metric) on synthetic per-token losses with known answers: group
baseline,
top-r, threshold, caps, censoring, the formula written out, the bootstrap, the grid."""

from __future__ import annotations

import math

import numpy as np
import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.experiments import recl as R

GRID = [100, 200, 300, 400, 500]


def _curves(n: int = 1000, seed: int = 0) -> np.ndarray:
    """Per-token base losses: the hardest 10% around 5 nats, the rest around 1 nat."""
    rng = np.random.default_rng(seed)
    u = 1.0 + 0.1 * rng.random(n)
    u[: n // 10] += 4.0
    return u


def _model_losses(u: np.ndarray, gains_easy: dict, gains_hard: dict, offset: float = 0.0) -> np.ndarray:
    """l(c, t) = u_t + offset - (cumulative gain at c), separately for hard and easy tokens -> [contexts, tokens]."""
    hard = np.zeros(u.shape[0], bool)
    hard[: u.shape[0] // 10] = True
    return np.stack([u + offset - np.where(hard, gains_hard[c], gains_easy[c]) for c in GRID])


def test_known_answer_group_baseline_and_threshold() -> None:
    u = _curves()
    # A improves by 0.1 nat per step up to 300 then stops: RECL 300 (gain 1 - e^-0.1 = 9.5% per step, then 0)
    a = _model_losses(u, *[{100: 0, 200: 0.1, 300: 0.2, 400: 0.2, 500: 0.2}] * 2)
    # B never improves: RECL = the first context
    b = _model_losses(u, *[dict.fromkeys(GRID, 0.0)] * 2, offset=0.05)
    # C improves exactly like A up to 500 but is always worse than A by 1 nat: against the group baseline
    # (A's losses) it never gains, so its RECL is the first context too
    c = _model_losses(u, *[{100: 0, 200: 0.1, 300: 0.2, 400: 0.3, 500: 0.4}] * 2, offset=1.0)
    res = R.compute_recl(np.stack([a, b, c]), GRID, names=["A", "B", "C"], r_values=[0.1, 0.5, 1.0])
    for r in (0.1, 0.5, 1.0):
        assert res.recl["A"][r] == 300 and res.recl["B"][r] == 100 and res.recl["C"][r] == 100
    np.testing.assert_allclose(res.gains[1.0][0], [1 - math.exp(-0.1)] * 2 + [0, 0], atol=1e-12)
    # alone, C would be measured against itself and gain 1 - e^-0.1 per step all the way
    alone = R.compute_recl(c[None], GRID, names=["C"], r_values=[1.0])
    assert alone.recl["C"][1.0] == 500 and alone.censored["C"][1.0]


def test_top_r_hardest_tokens() -> None:
    """Gains on the hardest 10% continue to 400, on the rest they stop at 200: RECL depends on r."""
    u = _curves()
    easy = {100: 0, 200: 0.05, 300: 0.05, 400: 0.05, 500: 0.05}
    hard = {100: 0, 200: 0.05, 300: 0.10, 400: 0.15, 500: 0.15}
    res = R.compute_recl(_model_losses(u, easy, hard)[None], GRID, names=["m"], r_values=[0.1, 0.5, 1.0])
    # r = 0.1: T = the hard tokens, gain 1 - e^-0.05 = 4.9% per step up to 400
    # r = 0.5 / 1.0: past 200 the mean gain is 0.05 * 0.2 or 0.05 * 0.1 nats, below 1%
    assert res.recl["m"] == {0.1: 400, 0.5: 200, 1.0: 200}
    assert not any(res.censored["m"].values())


def test_gains_match_the_formula_written_out() -> None:
    rng = np.random.default_rng(1)
    losses = rng.gamma(2.0, 1.0, size=(3, 4, 200))
    contexts, r = [10, 20, 30, 40], 0.3
    gains = R.relative_gains(losses, contexts, r)
    for k in range(3):
        b = [min(losses[i, k, t] for i in range(3)) for t in range(200)]
        top = sorted(range(200), key=lambda t: -b[t])[: math.ceil(r * 200)]
        f_cc = sum(b[t] for t in top) / len(top)
        for i in range(3):
            f_ccp = sum(min(b[t], losses[i, k + 1, t]) for t in top) / len(top)
            assert gains[i, k] == pytest.approx((math.exp(f_cc) - math.exp(f_ccp)) / math.exp(f_cc), rel=1e-12)
    assert (gains >= 0).all()  # min(b, l) <= b: a relative gain is never negative


def test_cap_and_censoring() -> None:
    u = _curves(200)
    steady = {c: 0.1 * i for i, c in enumerate(GRID)}
    long = _model_losses(u, steady, steady)
    capped = long.copy()
    capped[2:] = capped[1]  # cannot read more than 200: its losses at longer contexts repeat those at 200
    res = R.compute_recl(np.stack([long, capped]), GRID, names=["xl", "vanilla"], r_values=[1.0],
                         max_context=[None, 200])
    assert res.recl["xl"][1.0] == 500 and res.censored["xl"][1.0]
    assert res.recl["vanilla"][1.0] == 200 and not res.censored["vanilla"][1.0]
    # a cap between grid points: the algorithm says 200, the model cannot read more than 150
    res = R.compute_recl(np.stack([long, capped]), GRID, names=["xl", "vanilla"], r_values=[1.0],
                         max_context=[None, 150])
    assert res.recl["vanilla"][1.0] == 150


def test_hardest_and_input_checks() -> None:
    assert R.hardest(np.array([1.0, 3.0, 3.0, 2.0]), 0.5).tolist() == [1, 2]
    assert len(R.hardest(np.ones(10), 0.01)) == 1
    with pytest.raises(ConfigError):
        R.hardest(np.ones(3), 0.0)
    with pytest.raises(ConfigError, match="increasing"):
        R.compute_recl(np.ones((1, 2, 5)), [20, 10])
    with pytest.raises(ConfigError, match="contexts"):
        R.compute_recl(np.ones((1, 3, 5)), [10, 20])


def test_bootstrap_spread_zero_for_identical_tokens_positive_otherwise_and_seeded() -> None:
    grid = [10, 20, 30, 40]
    # every token the same: gains of 10% then 0 for model a, none for b; any resample gives the same numbers
    flat = np.stack([np.stack([np.full(500, v) for v in (2.0, 1.9, 1.9, 1.9)]),
                     np.stack([np.full(500, 2.1)] * 4)])
    res = R.compute_recl(flat, grid, names=["a", "b"], r_values=[0.1, 1.0], resamples=50, seed=3)
    for r in (0.1, 1.0):
        np.testing.assert_allclose(res.gain_std[r], 0.0, atol=1e-12)
        assert res.recl["a"][r] == 20 and res.recl_interval["a"][r] == (20, 20)
        assert res.recl_agreement["a"][r] == 1.0
    # noisy tokens: a positive spread, the same for the same seed, another for another seed
    rng = np.random.default_rng(0)
    noisy = flat + rng.normal(0, 0.5, flat.shape)
    one = R.compute_recl(noisy, grid, names=["a", "b"], r_values=[0.1, 1.0], resamples=50, seed=3)
    again = R.compute_recl(noisy, grid, names=["a", "b"], r_values=[0.1, 1.0], resamples=50, seed=3)
    other = R.compute_recl(noisy, grid, names=["a", "b"], r_values=[0.1, 1.0], resamples=50, seed=4)
    assert (one.gain_std[0.1] > 0).all() and (one.gain_std[1.0] > 0).all()
    np.testing.assert_array_equal(one.gain_std[0.1], again.gain_std[0.1])
    assert one.recl_interval == again.recl_interval
    assert not np.array_equal(one.gain_std[0.1], other.gain_std[0.1])
    doc = one.to_dict()["bootstrap"]
    assert doc["resamples"] == 50 and doc["seed"] == 3 and set(doc["recl_interval"]) == {"a", "b"}
    assert len(doc["gain_std"]["0.1"]["a"]) == 3
    assert R.compute_recl(noisy, grid).to_dict()["bootstrap"] is None  # resamples=0: none


def test_bootstrap_equals_recomputing_on_each_resample() -> None:
    """The vectorised weights give what resampling the positions and rerunning the metric gives."""
    rng = np.random.default_rng(5)
    losses = rng.gamma(2.0, 1.0, size=(3, 4, 300))
    grid, b = [8, 16, 24, 32], 7
    boot = R.bootstrap_gains(losses, grid, [0.1, 0.5], resamples=b, seed=11, chunk=b)
    draws = np.random.default_rng(11).integers(0, 300, size=(b, 300))
    for s in range(b):
        for r in (0.1, 0.5):
            np.testing.assert_allclose(boot[r][s], R.relative_gains(losses[:, :, draws[s]], grid, r), atol=1e-12)


def test_uniform_grid_parser() -> None:
    assert R.parse_grid("16:64:16") == [16, 32, 48, 64]
    assert R.parse_grid("100:1000:100") == list(range(100, 1001, 100))
    assert R.grid_step([16, 32, 48]) == 16 and R.grid_step([16, 32, 64]) is None
    for bad, msg in (("16:60:16", "not a multiple"), ("a:b:c", "START:STOP:STEP"), ("16:64", "START:STOP:STEP"),
                     ("0:10:5", "START >= 1|1 <= START"), ("16:16:1", "START < STOP"), ("8:16:0", "STEP >= 1")):
        with pytest.raises(ConfigError, match=msg):
            R.parse_grid(bad)
    res = R.compute_recl(np.ones((1, 3, 10)), [16, 32, 64])
    assert res.to_dict()["grid_step"] is None and R.compute_recl(np.ones((1, 3, 10)), [8, 16, 24]).step == 8
