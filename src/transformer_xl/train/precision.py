"""Which arithmetic a run uses: ``--precision auto`` resolved from what the device offers, and the facts it
rests on (the matmul rate of each precision measured in this process, the CPU's relevant flags).

``auto`` picks bf16 where the device has native bf16 matrix products that pay, fp32 elsewhere:

* CUDA: compute capability 8.0 or newer (A100, H100, ...: bf16 tensor cores);
* CPU: a ``1024^3`` bf16 matmul measured at least :data:`CPU_BF16_MIN_SPEEDUP` times as fast as fp32 in this
  process (:func:`bf16_speedup`). A ``256^3`` probe comes first: where bf16 is slower than fp32 there, the CPU has no
  native bf16 products, the answer is fp32 and the larger products are not run (a ``1024^3`` bf16 product alone
  takes about 2 s on such a CPU; the probe a tenth of a second). AMX (Sapphire Rapids and later) measures 3.5-6x;
  AVX512-BF16 without AMX (AMD EPYC Zen 4) 2.4-2.7x, and end to end a bf16 training step there runs 1.5-1.8x the
  fp32 one (``txl bench --variants``, ``benchmarks/results/train_cpu_2t.json``; a test ties this rule to that file);
  a CPU without native bf16 products (AVX2 or AVX-512 without the BF16 extension) computes bf16 far more slowly
  than fp32 (0.01x on AVX2) and stays fp32.

The default of ``txl train`` stays fp32: its numbers equal the official code's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_xl.devices import float32_matmul_settings, is_cuda, synchronize

#: bf16 ÷ fp32 matmul rate above which ``auto`` picks bf16 on a CPU (see the module docstring).
CPU_BF16_MIN_SPEEDUP = 2.0
#: Sizes of :func:`bf16_speedup`'s products: the probe, then the measurement the rule was set on.
PROBE_N, MEASURE_N = 256, 1024
#: /proc/cpuinfo flags that decide bf16 and fp32 matmul speed on x86.
RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Precision:
    """The arithmetic a run uses and why (``reason`` is one line for the log)."""

    name: str  # "fp32", "bf16" or "fp16"
    reason: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None for fp32 (no autocast)."""
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    def autocast(self, device: str) -> Any:
        """The context a forward runs in: ``torch.autocast`` to :attr:`autocast_dtype`, or nothing for fp32."""
        dtype = self.autocast_dtype
        return contextlib.nullcontext() if dtype is None else torch.autocast(device.split(":")[0], dtype=dtype)

    def grad_scaler(self, device: str) -> torch.amp.GradScaler | None:
        """fp16's loss scaler for ``device`` (CUDA's, or the CPU's: the same logic, so that the CPU tests check
        the overflow steps, the scale's updates and its resume); None for the other precisions, whose exponent
        range is fp32's (bf16) or which are fp32."""
        return torch.amp.GradScaler(torch.device(device).type) if self.name == "fp16" else None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo", wanted: tuple[str, ...] = RELEVANT_FLAGS) -> list[str]:
    """The ``wanted`` flags (default :data:`RELEVANT_FLAGS`) the CPU reports (empty where ``cpuinfo`` cannot be
    read)."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in wanted if f in flags]


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name as the kernel reports it, or ``"unknown CPU"``."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                "unknown CPU")


#: The classes of CPU a speed figure is given for (:func:`cpu_class`), by the kernels PyTorch runs there.
CPU_CLASSES = {"avx2": "AVX2 (no AVX-512, no native bf16)", "avx512": "AVX-512 without bf16 products",
               "avx512-bf16": "AVX-512 with bf16 products (AVX512-BF16)", "amx": "AVX-512 with AMX tiles"}


def cpu_class(flags: list[str] | None = None, capability: str | None = None,
              onednn_isa: str | None = None) -> str:
    """Which class of :data:`CPU_CLASSES` this process computes as: the CPU's ``flags`` (default :func:`cpu_flags`)
    as far as PyTorch may use them, by its kernels' ``capability`` (default
    ``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY=avx2`` lowers) and oneDNN's limit
    ``onednn_isa`` (default ``$ONEDNN_MAX_CPU_ISA``; ``AVX2`` keeps bf16 products off AVX512-BF16 and AMX);
    ``"other"`` for a CPU without AVX2 (not x86, or an older one)."""
    flags = cpu_flags() if flags is None else flags
    capability = (capability or torch.backends.cpu.get_cpu_capability()).upper()
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL") if onednn_isa is None else onednn_isa).upper()
    rank = _ONEDNN_ISAS.index(limit) if limit in _ONEDNN_ISAS else len(_ONEDNN_ISAS)  # unknown: no limit
    if capability not in ("AVX2", "AVX512"):
        return "other"
    if capability == "AVX2" or "avx512f" not in flags or rank < _ONEDNN_ISAS.index("AVX512_CORE"):
        return "avx2"
    if "amx_bf16" in flags and rank >= _ONEDNN_ISAS.index("AVX512_CORE_AMX"):
        return "amx"
    if "avx512_bf16" in flags and rank >= _ONEDNN_ISAS.index("AVX512_CORE_BF16"):
        return "avx512-bf16"
    return "avx512"


#: The environment variables that hold PyTorch's CPU kernels to a narrower instruction set (``make test-avx2``).
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def isa_limits(environ: dict[str, str] | None = None) -> str:
    """The :data:`ISA_LIMITS` set in ``environ`` (default ``os.environ``) as a command's prefix (``"A=x B=y "``), or
    ``""``: what a recorded command needs to measure the same kernels again."""
    env = os.environ if environ is None else environ
    return "".join(f"{k}={env[k]} " for k in ISA_LIMITS if env.get(k))


#: oneDNN's instruction-set limits (``ONEDNN_MAX_CPU_ISA``), lowest first.
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
                "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT")


def device_description(device: str) -> str:
    """The GPU's name, or the CPU's model with its :func:`cpu_flags` and the class of kernels this process runs
    (:func:`cpu_class`): what every measurement is printed with."""
    if is_cuda(device):
        return torch.cuda.get_device_name(torch.device(device))
    flags = cpu_flags()  # RELEVANT_FLAGS: every flag cpu_class reads
    return (f"{cpu_model()} ({', '.join(flags) or 'no relevant flags'}; "
            f"{CPU_CLASSES.get(cpu_class(flags), 'no AVX2')} kernels)")


def matmul_rate(device: str, dtype: torch.dtype, n: int = 1024, reps: int = 5) -> float:
    """Best FLOP/s of an ``n x n x n`` matmul of ``dtype`` in this process (``reps`` rounds of 3 products)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(reps + 1):  # the first round warms up
        synchronize(device)
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - t) / 3)
    return 2 * n**3 / best


def resolve_precision(requested: str, device: str, *, announce: bool = False, main: bool = True,
                      share: Callable[[float], float] | None = None, kept: str | None = None) -> Precision:
    """``requested`` as is, or for ``auto`` bf16 where the device's bf16 matmuls pay and fp32 elsewhere (the rule
    of the module docstring; on a CPU :func:`bf16_speedup`, well under a second), said in one line on stderr
    with ``announce``. In a distributed run (``share``: rank 0's value to every process, a broadcast) only rank 0
    (``main``) measures and every process takes its ratio, so that a ratio near the threshold cannot give the
    processes of one job different precisions. ``kept``: the precision a resumed run's checkpoint was trained in,
    which ``auto`` keeps without measuring (a measurement under another load could pick the other precision and
    break the resume's exactness)."""
    if requested == "auto" and kept is not None:
        chosen = Precision(kept, "auto: as the run resolved it before, kept on resume")
    else:
        chosen = _resolve(requested, device, main, share)
    if announce and requested == "auto":
        print(f"txl train: precision {chosen.name} ({chosen.reason})", file=sys.stderr)
    return chosen


def _resolve(requested: str, device: str, main: bool, share: Callable[[float], float] | None) -> Precision:
    if requested != "auto":
        return Precision(requested, "requested")
    if is_cuda(device):
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        native = major >= 8
        return Precision("bf16" if native else "fp32",
                         f"auto: CUDA sm{major}{minor} {'has' if native else 'lacks'} bf16 tensor cores")
    speedup = bf16_speedup(device) if main else 0.0
    return cpu_choice(speedup if share is None else share(speedup))


def bf16_speedup(device: str = "cpu") -> float:
    """bf16 ÷ fp32 matmul rate on ``device``: at :data:`MEASURE_N` (two rounds each), unless the
    :data:`PROBE_N` probe already finds bf16 slower than fp32 (no native bf16 products: its ratio is returned, far
    below the rule's threshold, after about a tenth of a second instead of seconds)."""
    def ratio(n: int) -> float:
        return matmul_rate(device, torch.bfloat16, n=n, reps=2) / matmul_rate(device, torch.float32, n=n, reps=2)

    probe = ratio(PROBE_N)
    return probe if probe < 1 else ratio(MEASURE_N)


def cpu_choice(speedup: float) -> Precision:
    """``auto``'s choice on a CPU whose bf16 matmuls measure ``speedup`` times the fp32 rate."""
    pick = "bf16" if speedup >= CPU_BF16_MIN_SPEEDUP else "fp32"
    return Precision(pick, f"auto: bf16 matmul measured {speedup:.1f}x fp32 on this CPU "
                           f"({'>=' if pick == 'bf16' else '<'} {CPU_BF16_MIN_SPEEDUP:g}x)")


def run_environment(device: str, precision: str) -> dict[str, Any]:
    """What a run's figures were computed on, logged at each start or resume of ``txl train`` (an ``environment``
    event of ``metrics.jsonl``; a resumed run may continue on another machine): the device (:func:`device_description`),
    torch's version, the precision and the float32 product settings (TF32 on CUDA:
    :func:`transformer_xl.devices.float32_matmul_settings`)."""
    return {"device": device, "device_name": device_description(device), "torch": torch.__version__,
            "precision": precision, **float32_matmul_settings()}
