"""--precision auto: the CPU rule, CUDA's capability rule, the flags and model read from /proc/cpuinfo, and the
measured matmul rate."""

from __future__ import annotations

import contextlib
import json
import warnings
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
    asked: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or (8, 0))
    assert precision.resolve_precision("auto", "cuda") == Precision("bf16", "auto: CUDA sm80 has bf16 tensor cores")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or (7, 5))
    chosen = precision.resolve_precision("auto", "cuda:1")
    assert chosen == Precision("fp32", "auto: CUDA sm75 lacks bf16 tensor cores")
    assert asked == [torch.device("cuda"), torch.device("cuda:1")]


def test_cpuinfo_flags_and_model(tmp_path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO, encoding="ascii")
    assert cpu_flags(path) == ["avx2", "avx512f", "avx512_bf16"]
    assert cpu_model(path) == "AMD EPYC 9R14"
    assert cpu_flags(tmp_path / "missing") == [] and cpu_model(tmp_path / "missing") == "unknown CPU"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_rate_is_positive(dtype) -> None:
    assert precision.matmul_rate("cpu", dtype, n=64, reps=1) > 0


def test_the_cpu_rule_says_its_ratio_and_threshold() -> None:
    assert cpu_choice(2.4) == Precision("bf16", "auto: bf16 matmul measured 2.4x fp32 on this CPU (>= 2x)")
    assert cpu_choice(0.61) == Precision("fp32", "auto: bf16 matmul measured 0.6x fp32 on this CPU (< 2x)")


def test_autocast_is_nothing_for_fp32_and_the_device_types_autocast_otherwise() -> None:
    assert isinstance(Precision("fp32", "").autocast("cpu"), contextlib.nullcontext)
    with Precision("fp16", "").autocast("cpu"):  # not autocast's default type for the device
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is torch.float16
    assert not torch.is_autocast_enabled("cpu")
    with warnings.catch_warnings():  # without CUDA, torch.autocast warns that it disables itself
        warnings.simplefilter("ignore")
        ctx = Precision("bf16", "").autocast("cuda:1")  # the device's type, not its index
    assert ctx.device == "cuda" and ctx.fast_dtype is torch.bfloat16


def test_cpuinfo_is_read_from_its_first_flags_and_model_lines(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_bytes(b"processor\t: 0\nvendor_id\t: Caf\xe9\n"  # not ASCII: replaced, not an error
                     b"model name\t: Vendor: CPU \xc3\xa9 \n"  # after the first colon, stripped; ASCII only
                     b"flags\t\t: fpu avx2 amx_tile a:b avx512f\n"
                     b"vmx flags\t: avx512_bf16\n"  # another line that mentions flags
                     b"model name\t: the second core\nflags\t\t: avx512_bf16\n")
    assert cpu_model(path) == "Vendor: CPU \ufffd\ufffd"
    assert cpu_flags(path) == ["avx2", "avx512f", "amx_tile"]  # in RELEVANT_FLAGS' order
    assert cpu_flags(path, wanted=("amx_tile", "fpu", "sse")) == ["amx_tile", "fpu"]
    (tmp_path / "noflags").write_text("processor\t: 0\n", encoding="ascii")
    assert cpu_flags(tmp_path / "noflags") == [] and cpu_model(tmp_path / "noflags") == "unknown CPU"


def test_device_description_names_the_cpu_and_its_flags_or_the_gpu(monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_model", lambda: "AMD EPYC 9R14")
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx2", "avx512f", "avx512_bf16"])
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert precision.device_description("cpu") == ("AMD EPYC 9R14 (avx2, avx512f, avx512_bf16; AVX-512 with bf16 "
                                                   "products (AVX512-BF16) kernels)")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # held to AVX2
    assert precision.device_description("cpu").endswith("; AVX2 (no AVX-512, no native bf16) kernels)")
    monkeypatch.setattr(precision, "cpu_flags", lambda: [])
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert precision.device_description("cpu") == "AMD EPYC 9R14 (no relevant flags; no AVX2 kernels)"
    asked: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: asked.append(d) or "NVIDIA H100")
    assert precision.device_description("cuda:1") == "NVIDIA H100" and asked == [torch.device("cuda:1")]


def test_matmul_rate_is_the_best_round_of_three_products(monkeypatch) -> None:
    """Rounds timed by a fake clock (a warm-up round and ``reps`` more): the rate is 2 n^3 over the fastest round's
    time per product, each product of two ``n x n`` matrices of ``dtype`` on ``device``."""
    now, calls, products = [0.0], [], []

    def timed(rounds: list[float]) -> None:
        it = iter(rounds)
        calls.clear(), products.clear()

        def clock() -> float:
            if len(calls) % 2:  # the end of a round
                now[0] += next(it)
            calls.append(now[0])
            return now[0]

        monkeypatch.setattr(precision.time, "perf_counter", clock)

    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: products.append(
        (a.dtype, b.dtype, a.device.type, b.device.type, a.shape, b.shape)))
    timed([9.0, 7.5, 6.0, 6.6])  # seconds per round of 3 products: the warm-up, then reps = 3
    assert precision.matmul_rate("meta", torch.bfloat16, n=8, reps=3) == pytest.approx(2 * 8**3 / 2.0)
    assert len(calls) == 2 * 4 and products == [(torch.bfloat16, torch.bfloat16, "meta", "meta", (8, 8), (8, 8))] * 12
    timed([3.0] * 6)  # the defaults: n = 1024, five rounds after the warm-up
    assert precision.matmul_rate("meta", torch.float32) == pytest.approx(2 * 1024**3)
    assert len(calls) == 2 * 6 and products[0][4:] == ((1024, 1024), (1024, 1024)) and len(products) == 18


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo")
def test_the_default_cpuinfo_is_the_kernels() -> None:
    assert cpu_model() == cpu_model("/proc/cpuinfo") and cpu_flags() == cpu_flags("/proc/cpuinfo")
    assert cpu_model() != "unknown CPU"


def test_auto_keeps_a_resumed_runs_precision_without_measuring(monkeypatch, capsys) -> None:
    def unmeasured(*args, **kwargs):
        raise AssertionError("a resumed run measures nothing")

    monkeypatch.setattr(precision, "matmul_rate", unmeasured)
    kept = precision.resolve_precision("auto", "cpu", kept="bf16", announce=True)
    assert kept == Precision("bf16", "auto: as the run resolved it before, kept on resume")
    assert capsys.readouterr().err == f"txl train: precision bf16 ({kept.reason})\n"
    assert precision.resolve_precision("fp32", "cpu", kept="bf16", announce=True) == Precision("fp32", "requested")
    assert capsys.readouterr().err == ""  # only auto's choice is announced


def test_auto_announces_its_measurement_in_one_line(monkeypatch, capsys) -> None:
    asked: list[tuple] = []
    rates = {torch.float32: 100.0, torch.bfloat16: 250.0}
    monkeypatch.setattr(precision, "matmul_rate",
                        lambda device, dtype, **kw: asked.append((device, kw)) or rates[dtype])
    chosen = precision.resolve_precision("auto", "cpu", announce=True)
    assert chosen == cpu_choice(2.5)  # the probe, then the measurement: four short products of each size
    assert asked == [("cpu", {"n": n, "reps": 2}) for n in (precision.PROBE_N,) * 2 + (precision.MEASURE_N,) * 2]
    assert capsys.readouterr().err == f"txl train: precision bf16 ({chosen.reason})\n"
    precision.resolve_precision("auto", "cpu")
    assert capsys.readouterr().err == ""  # announce=False: silent
    # a rank that does not measure and has no share (no process group): nothing measured, fp32
    assert precision.resolve_precision("auto", "cpu", main=False) == cpu_choice(0.0)


#: bf16 ÷ fp32 matmul rates by CPU class, as measured (256^3 and 1024^3 products, 2 threads): AVX2 without bf16
#: (here: an AMX Xeon restricted to AVX2 kernels, 2.4 vs 164 and 0.9 vs 198 GFLOP/s; an AMD EPYC Zen 3 measured 1.3
#: vs 55-70), AVX-512 without the BF16 extension (emulated bf16, slower than fp32), AVX512-BF16 (AMD EPYC Zen 4,
#: 2.2-2.7x at 1024), AMX (Sapphire Rapids: 3.5x at 256, 3.6x at 1024).
CLASSES = {"avx2": (0.015, 0.005), "avx512": (0.4, 0.5), "avx512_bf16": (1.6, 2.4), "amx": (3.5, 3.6)}


@pytest.mark.parametrize("cpu_class, pick", [("avx2", "fp32"), ("avx512", "fp32"), ("avx512_bf16", "bf16"),
                                             ("amx", "bf16")])
def test_auto_on_each_cpu_class_probes_small_and_measures_large_only_where_bf16_is_native(monkeypatch, cpu_class,
                                                                                          pick) -> None:
    """A fake of each class's rates: ``auto`` picks what the class computes faster, and a CPU without native bf16
    products runs no 1024^3 bf16 product (seconds each there): the 256^3 probe decides."""
    small, large = CLASSES[cpu_class]
    asked: list[tuple] = []

    def rate(device, dtype, n, reps):
        asked.append((dtype, n))
        return 100.0 * ({PROBE: small, MEASURE: large}[n] if dtype is torch.bfloat16 else 1.0)

    PROBE, MEASURE = precision.PROBE_N, precision.MEASURE_N
    monkeypatch.setattr(precision, "matmul_rate", rate)
    assert precision.resolve_precision("auto", "cpu").name == pick
    native = small >= 1
    assert ((torch.bfloat16, MEASURE) in asked) == native
    assert asked[:2] == [(torch.bfloat16, PROBE), (torch.float32, PROBE)] and len(asked) == (4 if native else 2)
    assert precision.bf16_speedup("cpu") == (large if native else small)


def test_the_probe_stops_at_a_ratio_below_one_and_the_rule_needs_two() -> None:
    """The probe's shortcut never changes the answer: it is taken only where the ratio is below 1, and the rule picks
    bf16 from CPU_BF16_MIN_SPEEDUP >= 1 on."""
    assert CPU_BF16_MIN_SPEEDUP >= 1 and cpu_choice(0.99).name == "fp32"
    assert precision.PROBE_N < precision.MEASURE_N == 1024  # the size the rule's threshold was measured at


@pytest.mark.parametrize("flags, capability, onednn, expected", [
    (["avx2"], "AVX2", None, "avx2"),  # AMD EPYC Zen 3, a laptop
    (["avx2", "avx512f"], "AVX512", None, "avx512"),  # Skylake/Cascade Lake servers: no bf16 products
    (["avx2", "avx512f", "avx512_bf16"], "AVX512", None, "avx512-bf16"),  # AMD EPYC Zen 4
    (["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"], "AVX512", None, "amx"),  # Sapphire Rapids
    (["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "AVX2", "AVX2", "avx2"),  # held to AVX2 (make test-avx2)
    (["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "AVX512", "AVX2", "avx2"),  # oneDNN alone held to AVX2
    (["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "AVX512", "AVX512_CORE_BF16", "avx512-bf16"),
    (["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "avx512", "avx512_core", "avx512"),
    (["avx2", "avx512f"], "AVX512", "ALL", "avx512"),
    ([], "DEFAULT", None, "other"), ([], "SVE256", None, "other"),  # no AVX2, or not x86
])
def test_the_cpu_class_is_what_pytorch_may_use_of_the_flags(monkeypatch, flags, capability, onednn, expected) -> None:
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert precision.cpu_class(flags, capability, onednn) == expected
    if onednn is not None:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn)
        assert precision.cpu_class(flags, capability) == expected  # the environment's limit by default
    assert expected == "other" or expected in precision.CPU_CLASSES


def test_the_cpu_class_of_this_process_follows_its_kernels(monkeypatch) -> None:
    """This CPU as it is, and held to AVX2: the class follows torch's kernel capability and oneDNN's limit."""
    cls = precision.cpu_class()
    assert cls in (*precision.CPU_CLASSES, "other")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert precision.cpu_class() in ("avx2", "other")


def test_a_recorded_command_carries_the_variables_that_held_the_kernels() -> None:
    assert precision.isa_limits({}) == "" and precision.isa_limits({"PATH": "/bin", "ATEN_CPU_CAPABILITY": ""}) == ""
    env = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert precision.isa_limits(env) == ("ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
                                         "MKL_ENABLE_INSTRUCTIONS=AVX2 ")


def test_only_fp16_has_a_grad_scaler_and_it_is_the_device_kind_s() -> None:
    """fp16 scales its loss on the CPU as on CUDA (the same logic, tested on the CPU); bf16 and fp32 need none."""
    scaler = Precision("fp16", "").grad_scaler("cpu")
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled() and scaler._device == "cpu"
    assert Precision("bf16", "").grad_scaler("cpu") is None and Precision("fp32", "").grad_scaler("cuda:0") is None
