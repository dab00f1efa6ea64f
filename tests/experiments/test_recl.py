"""txl.experiments.recl: RECL (paper Appendix C) on synthetic loss curves with known answers, cache, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.helpers import eval_model
from txl import TXLConfig
from txl.errors import ConfigError, DataError
from txl.experiments import recl as R

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


def test_loss_cache_roundtrip_and_resume(tmp_path) -> None:
    cache = R.LossCache(tmp_path)
    key = {"model": "abc", "context": 64}
    assert cache.get(key) is None
    cache.put(key, np.arange(5.0))
    again = R.LossCache(tmp_path)  # a new process reads the manifest
    np.testing.assert_array_equal(again.get(key), np.arange(5.0))
    assert again.get({"model": "abc", "context": 65}) is None
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert next(iter(manifest["entries"].values()))["key"] == key


def test_group_losses_window_by_default_caps_and_cache(tmp_path, monkeypatch, capsys) -> None:
    data = np.random.default_rng(0).integers(0, 40, 300)
    xl, van = eval_model(0, n_token=40), eval_model(3, n_token=40, tgt_len=12)
    members = [R.GroupMember("xl", xl, "d-xl"), R.GroupMember("van", van, "d-van")]
    cache = R.LossCache(tmp_path)
    losses, caps = R.group_losses(members, data, [8, 16], start=16, tokens=100, data_key={"d": 1}, cache=cache,
                                  tgt_len=4)
    assert caps == [None, 12] and losses.shape == (2, 2, 100)
    # every model, the relative one included, is measured by the window of exactly c tokens (Appendix C);
    # the vanilla model is read at its cap for the longer context
    from txl.inference.window import sliding_window_nll

    for c in (8, 16):
        np.testing.assert_allclose(losses[0, [8, 16].index(c)], sliding_window_nll(xl, data, window=c, first=16,
                                                                                     last=116))
    np.testing.assert_allclose(losses[1, 1], sliding_window_nll(van, data, window=12, first=16, last=116))

    with pytest.raises(ConfigError, match="start"):
        R.context_losses(xl, data, 32, start=16, tokens=10)

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(R, "context_losses", boom)  # everything now comes from the cache
    lines: list[str] = []
    again, _ = R.group_losses(members, data, [8, 16], start=16, tokens=100, data_key={"d": 1}, cache=cache,
                              tgt_len=4, progress=lines.append, bar="lines")
    np.testing.assert_allclose(again, losses, rtol=1e-6)
    assert lines == ["xl: context 8 cached, ppl " + f"{np.exp(losses[0, 0].mean()):.3f}",
                     "xl: context 16 cached, ppl " + f"{np.exp(losses[0, 1].mean()):.3f}",
                     "van: context 8 cached, ppl " + f"{np.exp(losses[1, 0].mean()):.3f}",
                     "van: context 16 (read at 12) cached, ppl " + f"{np.exp(losses[1, 1].mean()):.3f}"]
    counts = [ln.split(" | ")[0] for ln in capsys.readouterr().err.splitlines()]  # the progress over the group
    assert counts == ["recl 1/4 (25%)", "recl 2/4 (50%)", "recl 3/4 (75%)", "recl 4/4 (100%)"]


def test_the_default_method_is_the_window_and_a_group_has_one_method(tmp_path) -> None:
    import dataclasses

    assert R.DEFAULT_METHOD == "window" and R.METHODS == ("window", "attention-length")
    assert R.check_method("memory") == "attention-length"  # the old name, kept as an alias
    with pytest.raises(ConfigError, match="method must be one of"):
        R.check_method("xl=window")
    # the method belongs to the group, not to a member: no per-model path exists
    assert [f.name for f in dataclasses.fields(R.GroupMember)] == ["name", "model", "digest"]
    data = np.random.default_rng(1).integers(0, 40, 200)
    xl, van = eval_model(0, n_token=40), eval_model(2, n_token=40)
    members = [R.GroupMember("xl", xl, "a"), R.GroupMember("van", van, "b")]
    cache = R.LossCache(tmp_path)
    mem, caps = R.group_losses(members, data, [8, 16], method="memory", start=16, tokens=64, data_key={},
                               cache=cache, tgt_len=4)
    assert caps == [None, None]
    from txl.inference.evaluate import evaluate

    for i, model in enumerate((xl, van)):  # attention length for both models, absolute encoding included
        ref = evaluate(model, data[:80], batch_size=1, tgt_len=4, mem_len=16, same_length=True, return_nll=True)
        np.testing.assert_allclose(mem[i, 1], ref.nll[16:80], rtol=1e-6)
    win, _ = R.group_losses(members, data, [8, 16], start=16, tokens=64, data_key={}, cache=cache, tgt_len=4)
    assert not np.allclose(win[0], mem[0])  # the cache keeps the two methods apart
    assert {e["key"]["method"] for e in cache.entries.values()} == {"window", "attention-length"}


def test_receptive_field_statement_holds(tmp_path) -> None:
    """window: exactly c tokens; attention-length: up to n_layer * (c - 1) + 1 (checked by changing one token)."""
    assert R.receptive_field("window", 64, n_layer=4) == 64
    assert R.receptive_field("window", 64, n_layer=4, max_context=32) == 32
    assert R.receptive_field("attention-length", 64, n_layer=4) == 253  # the 4-layer figure
    assert R.receptive_field("memory", 1, n_layer=4) == 1
    assert "n_layer*(c-1)+1" in R.RECEPTIVE_FIELD["attention-length"]
    model = eval_model(0, n_token=40, n_layer=3)
    members = [R.GroupMember("xl", model, "x")]
    assert R.group_receptive_fields(members, [4, 8], "attention-length") == {"xl": [10, 22]}
    assert R.group_receptive_fields(members, [4, 8], "window") == {"xl": [4, 8]}

    data = np.random.default_rng(2).integers(0, 40, 80)
    t, c, n_layer = 60, 4, 3  # the token scored, the context, the layers

    def loss_at_t(method: str, changed: int | None) -> float:
        d = data.copy()
        if changed is not None:
            d[changed] = (d[changed] + 1) % 40
        return float(R.context_losses(model, d, c, method=method, start=40, tokens=40, tgt_len=4)[t - 40])

    for method in ("window", "attention-length"):
        field = R.receptive_field(method, c, n_layer=n_layer)
        base = loss_at_t(method, None)
        assert abs(loss_at_t(method, t - field) - base) > 1e-6, method  # the farthest token it can read
        assert abs(loss_at_t(method, t - field - 1) - base) < 1e-9, method  # one further: no effect


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


@pytest.mark.slow
def test_trained_xl_reaches_a_longer_recl_than_vanilla_on_a_copy_task(tmp_path) -> None:
    """Small trained models on data whose long-range structure is known: random blocks of 24 tokens, each
    repeated once, so a token of the second copy is the one 24 tokens back. Vanilla (Al-Rfou et al., 16
    learned positions) cannot read that far: its RECL is at most 16. Transformer-XL (tgt_len = mem_len = 16)
    measured by the window (exactly c tokens) gains from c = 24, where the source comes into view, so its
    RECL is at least 24; it may be longer, since telling a second copy from a first one needs pairs of tokens
    24 apart, i.e. more than 24 tokens of context (with these 600 steps: 24 for r = 0.1, 40 for r = 0.5, 1)."""
    from txl.data import Corpus
    from txl.experiments.ablations import Variant, train_variant, variant_config

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 16, size=(4000, 24))
    data = np.repeat(blocks, 2, axis=0).reshape(-1)  # A A B B C C ... (24 tokens each)
    base = TXLConfig(n_token=16, n_layer=2, n_head=4, d_model=64, d_head=16, d_inner=128)
    corpus = Corpus.from_arrays("copy", {"train": data[:150_000], "valid": data[150_000:]}, n_token=16)
    group = []
    for name, v in (("xl", Variant(True, "ours", "full")), ("vanilla", Variant(False, "alrfou", "full"))):
        model, _ = train_variant(variant_config(base, v, 16), corpus, tmp_path / name, steps=600, batch_size=16,
                                 lr=2e-3, warmup=20, seed=0)
        group.append(R.GroupMember(name, model, name))
    contexts = [8, 16, 24, 32, 40]
    losses, caps = R.group_losses(group, data[150_000:], contexts, start=48, tokens=2400, data_key={}, tgt_len=16)
    res = R.compute_recl(losses, contexts, names=["xl", "vanilla"], r_values=[0.1, 0.5, 1.0], max_context=caps)
    for r in (0.1, 0.5, 1.0):
        assert res.recl["xl"][r] >= 24, res.to_dict()
        assert res.recl["vanilla"][r] <= 16


def test_a_loss_cache_manifest_naming_another_folder_is_refused(tmp_path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "entries": {"../x": {"tokens": 3}}}))
    with pytest.raises(DataError, match=r"names '\.\./x', not a plain file name"):
        R.LossCache(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "entries": {"abc": [1]}}))
    with pytest.raises(DataError, match="entry 'abc' has the wrong structure"):
        R.LossCache(tmp_path)
