"""The benchmark harness (txl.bench) compares like with like: same weights, same outputs, counted FLOPs."""

from __future__ import annotations

import pytest
import torch

from txl import TransformerXLLM, TXLConfig
from txl.bench import CASES, bench_case, model_flops, to_markdown


def test_cases_are_the_issue_configs() -> None:
    char, word = bench_case("char"), bench_case("word")
    assert (char.config.n_layer, char.config.d_model, char.config.n_token, char.batch_size) == (4, 256, 204, 8)
    assert (char.config.tgt_len, char.config.mem_len) == (128, 128)
    assert (word.config.n_token, word.config.cutoffs, word.config.div_val) == (33278, [2000, 10000], 4)
    assert {"enwik8-base", "wt103-base"} <= set(CASES)


def test_model_flops_by_hand() -> None:
    cfg = TXLConfig(n_token=10, n_layer=1, n_head=2, d_model=4, d_head=2, d_inner=8)
    b, q, m = 3, 5, 7
    k, n = q + m, b * q
    layer = 2 * (n * 4 * 4 + b * k * 4 * 8 + k * 4 * 4 + 3 * b * q * k * 4 + n * 4 * 4 + 2 * n * 4 * 8)
    assert model_flops(cfg, batch=b, qlen=q, mlen=m, targets=None) == layer + n * 2 * 4 * 10
    streaming = layer - 2 * b * m * 4 * 8  # memory keys/values were projected by an earlier segment
    assert model_flops(cfg, batch=b, qlen=q, mlen=m, targets=None, streaming=True) == streaming + n * 2 * 4 * 10


def test_hf_copy_gives_the_same_nll() -> None:
    pytest.importorskip("transformers.models.deprecated.transfo_xl.modeling_transfo_xl")
    from txl.bench import build_hf, check_equal

    torch.manual_seed(0)
    cfg = TXLConfig(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=5, mem_len=5,
                    cutoffs=[10, 20], div_val=2, tie_projs=[False, True, True], init_std=0.3)
    ours = TransformerXLLM(cfg)
    hf = build_hf(ours)
    x = torch.randint(0, 30, (2, 5))
    assert check_equal(ours, hf, x, x.roll(-1, 1)) < 1e-5


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


def test_run_with_recompute_runner(monkeypatch) -> None:
    """A whole (tiny) benchmark run: txl, txl with recompute and, if installed, HF, one table."""
    from txl import bench

    tiny = dict(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6)
    monkeypatch.setitem(bench.CASES, "tiny", (lambda: TXLConfig(**tiny), 2))
    opts = bench.BenchOptions(cases=["tiny"], eval_mem_lens=[12], steps=1, repeats=2, warmup=0, memory=False,
                              recompute=True, threads=1)
    report = bench.run_benchmark(opts, log=lambda line: None)
    train = report["results"][0]["train"]
    assert train["txl"]["tok_per_s"] > 0 and train[bench.RECOMPUTE]["tok_per_s"] > 0
    assert bench.RECOMPUTE not in report["results"][0]["eval"]["12"]  # nothing to recompute without a gradient
    table = to_markdown(report, "txl bench --cases tiny")
    assert "| tiny | train tok/s, recompute |" in table
    if report["results"][0]["hf"]:
        assert "ratio_" + bench.RECOMPUTE in train and report["results"][0]["max_abs_nll_diff"] < 1e-5
