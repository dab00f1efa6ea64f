"""Evaluation speed, Transformer-XL memory (txl's caches and cache-free) vs the vanilla sliding window (Table 9)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from tests.helpers import one_line_error, tiny_config
from transformer_xl.cli import main
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.experiments import speed as S
from transformer_xl.experiments.speed import eval_speed
from transformer_xl.experiments.tables import speed_table
from transformer_xl.model import TransformerXLLM
from transformer_xl.model.attention import MultiHeadAttention

BASE = tiny_config(n_token=40, tgt_len=8, mem_len=8, init_std=0.02)
DATA = np.random.default_rng(0).integers(0, 40, 4000)


def test_smoke_eval_speed_rows(capsys) -> None:
    lines: list[str] = []
    rows = eval_speed(BASE, DATA, [8, 16], tgt_len=4, xl_batch=2, rows=4, xl_segments=3, vanilla_forwards=2,
                      repeats=3, progress=lines.append, bar="lines")
    assert [r["attn_len"] for r in rows] == [8, 16]
    assert [ln.split(":")[0] for ln in lines] == ["L=8", "L=16"]
    assert [ln.split(" | ")[0] for ln in capsys.readouterr().err.splitlines()] == ["eval-speed 1/2 (50%)",
                                                                                   "eval-speed 2/2 (100%)"]
    for r in rows:
        assert r["statistic"] == S.STATISTIC == "median" and r["repeats"] == 3
        assert r["xl_tokens"] == 3 * 4 * 2 and r["vanilla_tokens"] == 4 * 2 and r["xl_segments"] == 3
        for name in ("xl_cached", "xl_uncached", "vanilla"):  # both XL timings and the window, every repeat kept
            key = f"{name}_ms_per_token"
            assert r[key] > 0 and len(r[f"{key}_all"]) == 3
            assert r[f"{key}_min"] <= r[key] <= r[f"{key}_max"]
            assert r[key] == pytest.approx(statistics.median(r[f"{key}_all"]), rel=1e-3)
        for name in ("cached", "uncached"):
            ratios = [v / x for v, x in zip(r["vanilla_ms_per_token_all"], r[f"xl_{name}_ms_per_token_all"])]
            assert r[f"slowdown_{name}"] == pytest.approx(statistics.median(ratios), rel=1e-2)
    table = speed_table(rows)
    assert "cache-free" in table and "txl's caches" in table and "median over 3 repeats" in table


def _fake_timers(monkeypatch) -> dict[str, list]:
    """Timers that hand out fixed seconds per call (a warm-up value first) and record the cache flags."""
    seconds = {True: [9.0, 0.003, 0.001, 0.002], False: [9.0, 0.004, 0.006, 0.005], "vanilla": [9.0, 0.1, 0.3, 0.6]}
    calls: dict[str, list] = {"xl": [], "vanilla": []}

    def time_xl(model, data, *, inference_cache, segments, **kw):
        calls["xl"].append((inference_cache, segments))
        return seconds[inference_cache].pop(0)

    def time_vanilla(model, data, *, forwards, **kw):
        calls["vanilla"].append(forwards)
        return seconds["vanilla"].pop(0)

    monkeypatch.setattr(S, "_time_xl", time_xl)
    monkeypatch.setattr(S, "_time_vanilla", time_vanilla)
    return calls


def test_the_statistic_kept_is_the_median_of_the_repeats(monkeypatch) -> None:
    calls = _fake_timers(monkeypatch)
    (r,) = eval_speed(BASE, DATA, [8], tgt_len=4, xl_batch=2, rows=4, xl_segments=7, vanilla_forwards=5, repeats=3)
    # one warm-up of each (1 segment, 1 forward), then the three back to back per repeat, cached XL first
    assert calls["xl"] == [(True, 1), (False, 1), (True, 7), (False, 7), (True, 7), (False, 7), (True, 7), (False, 7)]
    assert calls["vanilla"] == [1, 5, 5, 5]
    assert r["xl_cached_ms_per_token_all"] == [3.0, 1.0, 2.0]  # the warm-up (9 s) is not a repeat
    assert r["xl_cached_ms_per_token"] == pytest.approx(2.0)  # the median, not the minimum (1.0)
    assert (r["xl_cached_ms_per_token_min"], r["xl_cached_ms_per_token_max"]) == pytest.approx((1.0, 3.0))
    assert r["xl_uncached_ms_per_token"] == pytest.approx(5.0)  # from the inference_cache=False calls
    assert r["vanilla_ms_per_token"] == pytest.approx(300.0)
    # per-repeat ratios 33.3, 300, 300 -> median 300 (the ratio of the medians would be 150)
    assert r["slowdown_cached"] == pytest.approx(300.0) and r["slowdown_cached_min"] == pytest.approx(100 / 3)
    assert r["slowdown_uncached"] == pytest.approx(50.0)  # 25, 50, 120
    assert r["cache_speedup"] == pytest.approx(2.5)  # 1.33, 6, 2.5


def _count_projections(monkeypatch, model: TransformerXLLM) -> dict[str, int]:
    """Counts of the memory's key/value projections and of W_kR applications (every layer)."""
    counts = {"memory_kv": 0, "r_net": 0}
    plain = MultiHeadAttention._memory_kv

    def memory_kv(self, mem):
        counts["memory_kv"] += 1
        return plain(self, mem)

    monkeypatch.setattr(MultiHeadAttention, "_memory_kv", memory_kv)
    for layer in model.layers:
        layer.dec_attn.r_net.register_forward_hook(lambda *a: counts.__setitem__("r_net", counts["r_net"] + 1))
    return counts


@pytest.mark.parametrize("inference_cache", [True, False])
def test_cache_free_xl_projects_the_memory_at_every_segment(monkeypatch, inference_cache: bool) -> None:
    torch.manual_seed(0)
    model = TransformerXLLM(BASE.replace(attn_type=0, mem_len=8, same_length=True)).eval()
    counts = _count_projections(monkeypatch, model)
    tensor = torch.from_numpy(DATA.astype(np.int64))
    segments, tgt_len, n_layer = 6, 4, BASE.n_layer
    S._time_xl(model, tensor, tgt_len=tgt_len, attn_len=8, segments=segments, batch=2, device=torch.device("cpu"),
               inference_cache=inference_cache)
    fill = 8 // tgt_len
    if inference_cache:  # every position projected once, as a segment token (the buffers start with the text)
        assert counts["memory_kv"] == 0
        assert counts["r_net"] < n_layer * (fill + segments) // 2
    else:  # every segment that has a memory projects all of it again, and the position table
        assert counts["memory_kv"] == n_layer * (fill + segments - 1)
        assert counts["r_net"] == n_layer * (fill + segments)


@pytest.mark.parametrize("kwargs, message", [
    (dict(vanilla_attn_type=0), "absolute positions"),
    (dict(xl_segments=0), "xl_segments = 0"),
    (dict(vanilla_forwards=0), "vanilla_forwards = 0"),
    (dict(repeats=0), "repeats = 0"),
    (dict(rows=0), "rows = 0"),
    (dict(attn_lens=[8, 0]), "attention lengths must be >= 1"),
    (dict(device="nonsense"), "unknown device"),
])
def test_bad_settings_are_refused(kwargs, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        eval_speed(BASE, DATA, **{"attn_lens": [8], **kwargs})


def test_short_data_is_refused_before_timing() -> None:
    with pytest.raises(DataError, match="eval-speed needs"):
        eval_speed(BASE, DATA[:500], [8, 64], tgt_len=4, xl_batch=10, xl_segments=20)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is absent")
def test_cuda_absent_is_one_line(capsys) -> None:
    assert main(["experiment", "eval-speed", "--device", "cuda"]) == 2
    assert "CUDA is not available" in one_line_error(capsys)


@pytest.mark.parametrize("flag", ["--xl-segments", "--vanilla-forwards", "--repeats", "--rows"])
def test_smoke_cli_counts_are_positive(capsys, flag: str) -> None:
    assert main(["experiment", "eval-speed", flag, "0"]) == 2
    assert f"argument {flag}: expected a positive integer" in one_line_error(capsys)


def test_cli_help_says_the_statistic_kept(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["experiment", "eval-speed", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    repeats = text[text.index("--repeats REPEATS repeats"):text.index("--device DEVICE torch")]
    assert f"the {S.STATISTIC} over the repeats" in repeats and "min" in repeats
    assert "fastest" not in text and "cache-free" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eval_speed_on_cuda() -> None:
    rows = eval_speed(BASE, DATA, [8], tgt_len=4, xl_batch=2, rows=4, xl_segments=2, vanilla_forwards=2, repeats=2,
                      device="cuda")
    assert rows[0]["device"].startswith("cuda") and rows[0]["threads"] is None
    assert rows[0]["xl_uncached_ms_per_token"] > 0 and rows[0]["slowdown_uncached"] > 0
