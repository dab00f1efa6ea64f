"""The benchmark report (transformer_xl.experiments.bench.report): a whole tiny run, its ratios and its Markdown
rows."""

from __future__ import annotations

import pytest

from transformer_xl import TXLConfig
from transformer_xl.experiments.bench import report as report_module
from transformer_xl.experiments.bench import to_markdown

#: The GEMM peaks a whole run is measured against, faked: these tests need a number far above what a tiny model
#: reaches, not the machine's peaks (their own tests: test_yardstick.py), which take seconds per precision to measure
#: (bf16 without native products: the budget's worth).
PEAKS = {"fp32": 1e13, "bf16": 1e13, "bf16_gemm": 1e13}


@pytest.fixture(autouse=True)
def _fake_peaks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    monkeypatch.setattr(report_module, "gemm_peaks", lambda device: asked.append(device) or dict(PEAKS))
    return asked


def test_markdown_rows_carry_the_command() -> None:
    summary = {"txl": {"tok_per_s": 200.0, "mfu": 0.5}, "hf": {"tok_per_s": 100.0}, "ratio": 2.0}
    report = {"options": {"dtype": "fp32", "compile": False},
              "env": {"device": "cpu", "torch": "x", "threads": 2, "matmul_peak_gflops": 100.0},
              "results": [{"case": "char", "train": summary, "eval": {"512": summary},
                           "memory": {"txl": {"step_peak_mib": 7.0}, "hf": {"step_peak_mib": 10.0}, "ratio": 0.7}}]}
    table = to_markdown(report, "txl bench --cases char")
    rows = [line for line in table.splitlines() if line.startswith("| char")]
    assert len(rows) == 3 and all("`txl bench --cases char`" in r for r in rows)
    assert "**2.00**" in rows[0] and "**0.70**" in rows[2]


def test_smoke_run_with_recompute_runner(monkeypatch, _fake_peaks) -> None:
    """A whole (tiny) benchmark run: txl, txl with recompute and, if installed, HF, one table."""
    from transformer_xl.experiments import bench

    tiny = dict(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6)
    monkeypatch.setitem(bench.CASES, "tiny", (lambda: TXLConfig(**tiny), 2))
    opts = bench.BenchOptions(cases=["tiny"], eval_mem_lens=[12], steps=1, repeats=2, warmup=0, memory=False,
                              recompute=True, threads=1)
    report = bench.run_benchmark(opts, log=lambda line: None)
    assert _fake_peaks == ["cpu", "cpu"]  # at the start and at the end of the run (the load moves)
    assert report["env"]["matmul_peaks_gflops"] == {k: v / 1e9 for k, v in PEAKS.items()}
    train = report["results"][0]["train"]
    assert train["txl"]["tok_per_s"] > 0 and train[bench.RECOMPUTE]["tok_per_s"] > 0
    assert bench.RECOMPUTE not in report["results"][0]["eval"]["12"]  # nothing to recompute without a gradient
    table = to_markdown(report, "txl bench --cases tiny")
    assert "| tiny | train tok/s, recompute |" in table
    if report["results"][0]["hf"]:
        assert "ratio_" + bench.RECOMPUTE in train and report["results"][0]["max_abs_nll_diff"] < 1e-5


def test_the_skeleton_rows_are_the_steps_products_alone(monkeypatch) -> None:
    from transformer_xl.experiments import bench

    tiny = dict(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6)
    monkeypatch.setitem(bench.CASES, "tiny", (lambda: TXLConfig(**tiny), 2))
    opts = bench.BenchOptions(cases=["tiny"], eval_mem_lens=[], steps=1, repeats=1, warmup=1, memory=False,
                              skeleton=True, threads=1)
    report = bench.run_benchmark(opts, log=lambda line: None)
    res = report["results"][0]
    sk = res["skeleton"]["txl"]
    # faster than the step it comes from: the same products without the rest of the step
    assert sk["step_over_skeleton"] > 1 and sk["tok_per_s"] > res["train"]["txl"]["tok_per_s"]
    assert 0 < sk["mfu"] <= 1.02 and sk["calls"] > 0 and sk["ops"] > sk["calls"]
    table = to_markdown(report, "txl bench --cases tiny --skeleton")
    assert "| tiny | train tok/s, GEMM skeleton |" in table
    if res["hf"]:
        assert "ratio" in res["skeleton"] and "hf" in res["skeleton"]
        # txl's products alone against HF's whole step: above the step's own ratio
        assert sk["ceiling_ratio"] > res["train"]["ratio"]
        assert "| tiny | train txl ÷ HF ceiling (txl's GEMM skeleton ÷ HF's step) |" in table
