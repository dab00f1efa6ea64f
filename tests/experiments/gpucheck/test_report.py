"""The GPU check's Markdown summary: every part's table from the JSON alone, failures listed, any shape survived."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from transformer_xl.experiments.gpucheck.report import _num, to_markdown

ENV = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0",
       "python": "3.12.3", "date": "2026-01-01T00:00:00+00:00", "tf32": {"cuda_matmul_tf32": False,
       "cudnn_tf32": True}, "command": "python benchmarks/gpu_check.py --out o", "tiny": False, "seed": 0,
       "compile": True, "budget_s": 465.0}

A = {"tolerances": {"fp32_rel": 1e-5, "bf16_loss_rel": 1e-2, "grad_rel": 1e-4,
                    "relative_error": "max |a - b| / max |b|"},
     "forward": [{"case": "attn1", "against": "cpu", "fp32_loss_rel": 2.5e-7, "fp32_logprob_rel": 3.25e-6,
                  "bf16_loss_rel": 4.5e-3, "ok": True}],
     "gradients": [{"case": "attn1", "paths": "default vs reference", "worst_param": "pos_enc.r_bias",
                    "worst_rel": 7.75e-6, "ok": True}],
     "amp_training": [{"precision": "fp16 + GradScaler", "steps": 12, "losses": [7.61, 6.25], "scale": 32768.0,
                       "ok": True}],
     "gpu_tests": {"status": "failed", "files": ["t.py", "u.py"], "passed": 5, "failed": 1, "errors": 0,
                   "skipped": 1, "failures": ["tests.t::test_x"]},
     "checks": [{"name": "pytest -m gpu: no failures", "ok": False}]}
B = {"peaks_flop_per_s": {"bf16": 7.5e14, "fp32": 5e13, "tf32": 3.75e14},
     "nvidia_a100": {"source": "NVIDIA README"}, "goals_h100_bf16": {"base": 120000, "large": 50000},
     "rows": [{"model": "base", "mode": "bf16-compile", "status": "ok", "compiled": True, "tok_per_s": 131072.4,
               "step_s": 0.046875, "mfu": 0.4321, "nvidia_a100_tok_per_s": 59961, "goal_tok_per_s": 120000,
               "meets_goal": True, "compile_s": 61.25, "batch": 32, "tgt_len": 192},
              {"model": "large", "mode": "tf32", "status": "oom", "error": "OutOfMemoryError: CUDA out of memory"}],
     "checks": []}
C = {"precision": "bf16 autocast", "nvidia_a100": {"eval_note": "TorchScript fp16"},
     "rows": [{"model": "large", "batch": 32, "tgt_len": 128, "mem_len": 1600, "status": "ok", "tok_per_s": 45678.9,
               "nvidia_a100_tok_per_s": 32162}], "checks": []}
D = {"model": "base", "n_token": 267735, "read_rate": {"bytes_per_s": 3.1e12, "method": "Tensor.sum"},
     "skipped_mem_lens": [1600],
     "rows": [{"mem_len": 640, "cuda_graphs": True, "compiled": True, "tok_per_s": 2500.0, "plain_tok_per_s": 80.0,
               "step_bytes": {"total": 7.5e8}, "limit_tok_per_s": 4133.3, "share": 0.6049, "meets_goal": False,
               "goal_share": 0.7, "same_tokens": "10/10", "logprob_max_abs_diff": 2.5e-6, "compile_s": 33.5}],
     "checks": [{"name": "d: tokens", "ok": True}]}


def _report(**parts: Any) -> dict[str, Any]:
    titles = {"a": "correctness", "b": "training throughput", "c": "evaluation throughput", "d": "decoding",
              "e": "train, kill and resume", "f": "serving"}
    return {"environment": ENV, "total_s": 401.5, "ok": False, "problems": ["a: pytest -m gpu: no failures"],
            "parts": {k: {"title": titles[k], "status": "ok", "seconds": 12.25, "cap_s": 85.0, "error": None,
                          "result": v} for k, v in parts.items()}}


def test_every_part_renders_its_figures_from_the_json() -> None:
    md = to_markdown(_report(a=A, b=B, c=C, d=D, e={"resumed_at": 4, "bit_exact": True, "inner": {"p50_s": 0.25},
                                                    "checks": []}))
    assert "**NVIDIA H100 80GB HBM3**" in md and "torch 2.11.0+cu130" in md and "401.5 s in all" in md
    assert "NOT OK** - a: pytest -m gpu: no failures" in md
    for figure in ("3.2e-06", "4.5e-03", "`pos_enc.r_bias`", "7.8e-06", "32768", "5 passed, 1 failed, 0 errors, "
                   "1 skipped", "`tests.t::test_x`",  # a
                   "bf16 750.0, fp32 50.0, TF32 375.0 TFLOP/s", "131,072", "46.9", "43.2 %", "59,961",
                   "120,000 (met)", "61.2", "| large | tf32 | oom |", "CUDA out of memory",  # b
                   "| large | 32 | 128 / 1600 | 45,679 | ok | 32,162 |",  # c
                   "3100.0 GB/s", "CUDA graphs", "2,500", "750.0", "4,133", "60.5 % (goal 70.0 %)", "10/10",
                   "2.5e-06", "33.5", "Not run for lack of time: mem 1600",  # d
                   "- resumed_at: 4", "- bit_exact: True", "- inner: p50_s 0.25"):  # e: the generic list
        assert figure in md, figure
    assert "Out of tolerance or failed:\n- pytest -m gpu: no failures" in md


def test_a_part_without_a_result_and_an_unexpected_shape_still_render() -> None:
    report = _report(a=A, b=B)
    report["parts"]["a"].update(status="timed_out", result=None, error="still running at its cap of 85 s: stopped")
    broken = copy.deepcopy(B)
    del broken["rows"][0]["mfu"]
    report["parts"]["b"]["result"] = broken
    md = to_markdown(report)
    assert "| a | correctness | timed_out | 12.2 | 85 | still running at its cap of 85 s: stopped |" in md
    assert "No result (timed_out)." in md
    assert "(table not rendered: KeyError: 'mfu')" in md
    report["parts"]["b"]["result"] = ["not", "a", "dict"]
    assert "Result: ['not', 'a', 'dict']" in to_markdown(report)


@pytest.mark.parametrize("value, fmt, unit, text", [(None, ",.0f", "", "–"), (1234.5, ",.0f", "", "1,234"),
                                                     (0.5, ".1f", " %", "0.5 %"), ("x", ",.0f", "", "x"),
                                                     (True, ",.0f", "", "True")])
def test_num(value: Any, fmt: str, unit: str, text: str) -> None:
    assert _num(value, fmt, unit) == text
