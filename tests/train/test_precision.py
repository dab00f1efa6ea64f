"""--precision auto: the CPU rule, CUDA's capability rule, the flags and model read from /proc/cpuinfo, and the
measured matmul rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from transformer_xl.train import precision
from transformer_xl.train.precision import CPU_BF16_MIN_SPEEDUP, Precision, cpu_choice, cpu_flags, cpu_model

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
CPUINFO = ("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n"
           "flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512vl\n")


def test_explicit_precisions_are_kept() -> None:
    for name in ("fp32", "bf16", "fp16"):
        assert precision.resolve_precision(name, "cpu") == Precision(name, "requested")
    assert Precision("bf16", "").autocast_dtype is torch.bfloat16
    assert Precision("fp16", "").autocast_dtype is torch.float16
    assert Precision("fp32", "").autocast_dtype is None


def test_cpu_rule_is_the_measured_speedup() -> None:
    assert cpu_choice(CPU_BF16_MIN_SPEEDUP).name == "bf16"
    assert cpu_choice(5.5).name == "bf16"  # AMX
    assert cpu_choice(2.4).name == "bf16"  # AVX512-BF16 without AMX
    low = cpu_choice(0.6)  # bf16 products without native support
    assert low.name == "fp32" and "0.6x" in low.reason
    assert cpu_choice(1.9).name == "fp32"


@pytest.mark.parametrize("name", ["train_cpu_2t.json", "train_before_cpu_2t.json", "compiled_bf16_train_char_t1.json",
                                  "compiled_bf16_train_charmid_t1.json"])
def test_the_cpu_rule_picks_what_measured_faster_end_to_end(name: str) -> None:
    """The rule against the bench's own files: where the bf16 / fp32 GEMM ratio of a run's machine picks bf16, its
    eager bf16 training step measured faster than the fp32 one, in the same run (and fp32 where it did not)."""
    run = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    peaks = run["env"]["matmul_peaks_gflops"]
    gemm = peaks.get("bf16_gemm", peaks["bf16"]) / peaks["fp32"]
    for case in run["results"]:
        rates = {name: r["tok_per_s"] for name, r in case["train"].items() if isinstance(r, dict)}
        faster = rates["txl-eager-bf16"] > rates["txl"]
        assert (cpu_choice(gemm).name == "bf16") == faster, (case["case"], gemm, rates)


def test_auto_on_cpu_measures_both_rates(monkeypatch) -> None:
    rates = {torch.float32: 100.0, torch.bfloat16: 600.0}
    monkeypatch.setattr(precision, "matmul_rate", lambda device, dtype, **kw: rates[dtype])
    assert precision.resolve_precision("auto", "cpu").name == "bf16"
    rates[torch.bfloat16] = 150.0
    assert precision.resolve_precision("auto", "cpu").name == "fp32"


def test_auto_in_a_distributed_run_takes_rank_0s_ratio(monkeypatch) -> None:
    """Rank 0 measures and shares its ratio; the other ranks measure nothing and take it (one precision per job)."""
    rates = {torch.float32: 100.0, torch.bfloat16: 210.0}
    monkeypatch.setattr(precision, "matmul_rate", lambda device, dtype, **kw: rates[dtype])
    shared: list[float] = []
    chosen = precision.resolve_precision("auto", "cpu", main=True, share=lambda v: shared.append(v) or v)
    assert chosen.name == "bf16" and shared == [2.1]

    def unmeasured(*args, **kwargs):
        raise AssertionError("only rank 0 measures")

    monkeypatch.setattr(precision, "matmul_rate", unmeasured)
    assert precision.resolve_precision("auto", "cpu", main=False, share=lambda v: 2.1).name == "bf16"
    assert precision.resolve_precision("auto", "cpu", main=False, share=lambda v: 1.9).name == "fp32"


def test_auto_on_cuda_reads_the_capability(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert precision.resolve_precision("auto", "cuda").name == "bf16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    chosen = precision.resolve_precision("auto", "cuda:0")
    assert chosen.name == "fp32" and "sm75" in chosen.reason


def test_cpuinfo_flags_and_model(tmp_path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO, encoding="ascii")
    assert cpu_flags(path) == ["avx2", "avx512f", "avx512_bf16"]
    assert cpu_model(path) == "AMD EPYC 9R14"
    assert cpu_flags(tmp_path / "missing") == [] and cpu_model(tmp_path / "missing") == "unknown CPU"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_rate_is_positive(dtype) -> None:
    assert precision.matmul_rate("cpu", dtype, n=64, reps=1) > 0
