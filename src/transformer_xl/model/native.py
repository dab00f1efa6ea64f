"""txl's own matrix-vector kernels for decoding, compiled at first use for this machine's CPU.

A decode step multiplies a few rows by every weight matrix of the model: it is bound by reading the matrices once.
Three things stop the library kernels from doing that on every CPU, measured on an AMD EPYC Zen 3 (2 cores, AVX2;
``benchmarks/decode_kernels.py``, ``docs/generation-speed.md``):

* MKL's single-precision matrix-vector kernel (``torch.mv``, ``F.linear`` at one row) runs on one core on AMD CPUs
  (pytorch/pytorch#96643): 14 GB/s over the WT103-base weights against a read rate of 27-38 GB/s;
* inductor's compiled reductions over row blocks (the captured step's float form) reach about half the read rate
  there;
* int8 weights widened to float as they are read are bound by arithmetic on AVX2 (4 GB/s), slower than float32.

``native_gemv.cpp`` (beside this file) holds three operators, registered as ``torch.ops.txl.gemv``,
``torch.ops.txl.gemv_q8`` and ``torch.ops.txl.ring_attend`` with fake implementations, so that ``torch.compile``
calls them from a compiled graph:

* **gemv**: float32, the weights in tiles of 8 rows x 8 columns (:func:`tile`, one sequential stream per thread),
  or as stored ``[out, in]``; FMA on AVX2; ``gemv_t``, the same over a stored ``[in, out]`` matrix (``x W``: an
  adaptive softmax's projection), its columns split between threads;
* **gemv_q8**: int8 weights with one scale per row (the scheme of :func:`transformer_xl.model.int8.quantize_rows`)
  in tiles of 4 rows x 32 columns; every row of ``x`` quantized to int8 with a scale of its own (``max |x| / 127``,
  rounded to nearest), products accumulated in 32-bit integers by ``vpmaddubsw``/``vpmaddwd`` (``|x|`` as unsigned
  bytes times ``w`` with ``x``'s sign: 32 weights an instruction), then scaled. The quantized activation is the
  only difference from the float product over the same int8 weights (tested within
  :data:`INT8_ACTIVATION_TOLERANCE`);
* **ring_attend**: one layer's attention of the new token over the captured step's ring of keys, position keys and
  values (float32 or bfloat16 widened as read), scores, softmax (a polynomial ``exp`` on AVX2, relative error about
  2e-7) and the values' sum in one pass per head: inductor's reductions over the ring reached 55 % of the read rate
  in float32 and 27 % in bfloat16 on the Zen 3.

Each call splits the rows in one contiguous range per thread (``at::parallel_for``: one OpenMP region, torch's own
runtime), at least 64 KiB of weights each. The kernels are compiled with ``-O3 -march=native`` by
``torch.utils.cpp_extension`` (ninja and a C++ compiler; about 15 s once per machine and torch version, cached in
torch's extensions directory). Where that fails, :func:`unavailable` says why and the decode path keeps the
compiled forms (:func:`transformer_xl.model.dispatch.decode_products`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

#: The C++ source of the operators.
SOURCE = Path(__file__).with_name("native_gemv.cpp")
#: Tile shapes (rows, columns) of the float32 and int8 operators (the constants of ``native_gemv.cpp``).
TILE_F32, TILE_Q8 = (8, 8), (4, 32)
#: The largest difference of ``gemv_q8`` from the float product over the same int8 weights, relative to the largest
#: output magnitude, that the tests accept: the activation's rounding to 1/254 of its largest entry (a bound of
#: ``sqrt(in) * max|x| / 254 * rms(w)`` per output in the worst case, far less on average).
INT8_ACTIVATION_TOLERANCE = 0.02


def vendor(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's vendor as the kernel reports it (``AuthenticAMD``, ``GenuineIntel``; ``""`` where unknown)."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")), "")


def _build_name() -> str:
    """The extension's name: one per source, torch version, Python and CPU (``-march=native`` code runs only on the
    instruction set it was compiled for, and an extensions directory may be shared between machines)."""
    try:
        cpu = " ".join(line for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines()[:40]
                       if line.startswith(("flags", "model name")))
    except OSError:
        cpu = ""
    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + sys.version.encode()
                            + cpu.encode()).hexdigest()[:12]
    return f"txl_native_{digest}"


@functools.cache
def unavailable() -> str | None:
    """Why the operators cannot run in this process (one line), or None once they are loaded (compiled first
    when this machine has not built them yet). ``TXL_NATIVE=0`` turns them off."""
    if os.environ.get("TXL_NATIVE", "1") == "0":
        return "TXL_NATIVE=0 turns txl's native kernels off"
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        return "no C++ compiler (c++, g++ or clang++) on the PATH"
    flags = ["-O3", "-march=native", "-fopenmp"]
    try:
        cpp_extension.load(name=_build_name(), sources=[str(SOURCE)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                           is_python_module=False, verbose=False)
    except Exception as e:
        line = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        return f"compiling txl's native kernels failed: {line[:200]}"
    _register_fakes()
    return None


def available() -> bool:
    """Whether ``torch.ops.txl.gemv`` and ``gemv_q8`` run here (:func:`unavailable`)."""
    return unavailable() is None


def _register_fakes() -> None:
    """Shapes for ``torch.compile`` (the operators are opaque to it: extern calls in its graph)."""

    @torch.library.register_fake("txl::gemv")
    def _gemv(x: Tensor, w: Tensor, out: int, bias: Tensor | None = None) -> Tensor:
        return x.new_empty(x.size(0), out)

    @torch.library.register_fake("txl::gemv_t")
    def _gemv_t(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
        return x.new_empty(x.size(0), w.size(1))

    @torch.library.register_fake("txl::gemv_q8")
    def _gemv_q8(x: Tensor, w: Tensor, scale: Tensor, out: int, bias: Tensor | None = None) -> Tensor:
        return x.new_empty(x.size(0), out)

    @torch.library.register_fake("txl::ring_attend")
    def _ring_attend(qu: Tensor, qv: Tensor, ks: Tensor, ps: Tensor, vs: Tensor, by_slot: Tensor, bias: Tensor,
                     scale: float) -> Tensor:
        return qu.new_empty(ks.size(0), ks.size(1), ks.size(3), dtype=torch.float32)


def _require() -> None:
    """Load the operators (compiling them first where needed) before a call outside ``torch.compile`` (a compiled
    graph calls them once its decoder has loaded them); a one-line error where they cannot run."""
    if not torch.compiler.is_compiling() and (why := unavailable()):
        raise RuntimeError(f"txl's native kernels cannot run here: {why}")


# ---------------------------------------------------------------------------------------------- the rule
#: Rows of ``x`` up to which :func:`linear` multiplies by txl's matrix-vector kernel (a generation step: bound by
#: reading the weights); beyond, BLAS's matrix product, bound by arithmetic.
NATIVE_ROWS = 4
#: The forms of a decode step's products (:func:`products`).
PRODUCTS = ("native", "compiled", "blas")


def products(device: torch.device | str = "cpu") -> str:
    """The form of a decode step's matrix products here: the rule and its reasons are the table of
    :func:`transformer_xl.model.dispatch.decode_products`."""
    if torch.device(device).type != "cpu":
        return "blas"
    return _cpu_products(os.environ.get("TXL_DECODE_PRODUCTS", ""))


@functools.cache
def _cpu_products(wanted: str) -> str:
    if wanted == "compiled" or not available():
        return "compiled"
    if wanted == "native":
        return "native"
    isa = torch.backends.cpu.get_cpu_capability().upper()
    return "native" if vendor() == "AuthenticAMD" or isa == "AVX2" else "compiled"


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; at :data:`NATIVE_ROWS` rows or fewer of float32 on the CPU, without a gradient
    and outside ``torch.compile``, where :func:`products` says ``native``, by :func:`gemv` over the weight as stored
    (every core streams its share of the rows; MKL's kernel uses one on AMD CPUs), or by ``gemv_t`` where
    ``weight`` is the transpose of a stored matrix (``x @ W`` written ``linear(x, W.t())``)."""
    if (torch.compiler.is_compiling()  # first: the sizes of a traced input may be symbolic (no guard on them)
            or x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32
            or x.numel() > NATIVE_ROWS * x.size(-1) or not x.numel()
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            or weight.dim() != 2 or not (weight.is_contiguous() or weight.t().is_contiguous())
            or products() != "native"):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.size(-1))
    if weight.is_contiguous():
        out = gemv(rows, weight, weight.size(0), bias)
    else:  # the transpose of a stored [in, out] matrix (an adaptive softmax's projection)
        _require()
        out = torch.ops.txl.gemv_t(rows, weight.t(), bias)
    return out.view(*x.shape[:-1], weight.size(0))


# ---------------------------------------------------------------------------------------------- layouts
def tile(weight: Tensor, rows: int, cols: int) -> Tensor:
    """``weight [out, in]`` as tiles ``[ceil(out / rows), ceil(in / cols), rows, cols]`` (zeros pad the last block
    of rows and the columns beyond ``in``): a block of ``rows`` rows is one sequential stream, ``cols`` columns of
    each row at a time."""
    out, n_in = weight.shape
    padded = F.pad(weight, (0, -n_in % cols, 0, -out % rows))
    return padded.view(padded.size(0) // rows, rows, padded.size(1) // cols, cols).transpose(1, 2).contiguous()


def untile(tiles: Tensor, shape: tuple[int, int]) -> Tensor:
    """The ``[out, in]`` matrix of :func:`tile`'s ``tiles`` (a copy)."""
    blocks, width, rows, cols = tiles.shape
    return tiles.transpose(1, 2).reshape(blocks * rows, width * cols)[:shape[0], :shape[1]]


def gemv(x: Tensor, weight: Tensor, out: int, bias: Tensor | None = None) -> Tensor:
    """``x W^T + b`` for ``x [N, in]`` float32 and ``weight`` float32 tiles (:func:`tile` with :data:`TILE_F32`) or
    ``[out, in]`` as stored."""
    _require()
    return torch.ops.txl.gemv(x, weight, out, bias)


def ring_attend(qu: Tensor, qv: Tensor, ks: Tensor, ps: Tensor, vs: Tensor, by_slot: Tensor, bias: Tensor,
                scale: float) -> Tensor:
    """One query per row over a ring (:func:`transformer_xl.inference.decode.attend_ring`'s math): ``qu``, ``qv``
    ``[B, H, E]`` (the query plus ``u``, plus ``v``), keys in slot blocks ``ks [B, H, C / 16, E, 16]``, position keys
    ``ps [H, C / 16, E, 16]`` by distance, values ``vs [B, H, E, C]`` (float32 or bfloat16, widened as read),
    every slot's distance row ``by_slot [C]`` and additive mask ``bias [C]`` -> ``softmax(scale (qu . k_c +
    qv . p_by_slot[c]) + bias_c) . v``, ``[B, H, E]`` float32; the (row, head) pairs split between threads."""
    _require()
    return torch.ops.txl.ring_attend(qu, qv, ks, ps, vs, by_slot, bias, scale)


def gemv_q8(x: Tensor, weight: Tensor, scale: Tensor, out: int, bias: Tensor | None = None) -> Tensor:
    """``x (q s)^T + b`` for ``x [N, in]`` float32, int8 tiles ``q`` (:func:`tile` with :data:`TILE_Q8`) and float32
    row scales ``s [>= out]``; ``x`` quantized per row to int8 (module docstring)."""
    _require()
    return torch.ops.txl.gemv_q8(x, weight, scale, out, bias)


def int8_speedup(n_in: int, rows: int = 1, *, nbytes: int = 64 * 2**20, reps: int = 3) -> float:
    """float32 seconds ÷ int8 seconds of :func:`gemv` and :func:`gemv_q8` over a random ``[out, n_in]`` matrix of
    ``nbytes`` float32 bytes (default 64 MiB: more than a last-level cache, read from memory as a step reads its
    weights) at ``rows`` rows, each the best of ``reps`` after a warm-up (above 1: int8 is faster). A probe of a
    fraction of a second, for the commands that say when int8 does not pay."""
    out = max(TILE_F32[0], nbytes // (4 * n_in))
    weight = torch.randn(out, n_in)
    tiles, q8 = tile(weight, *TILE_F32), tile(weight.clamp(-1, 1).mul(127).round().to(torch.int8), *TILE_Q8)
    scale = torch.full((q8.size(0) * TILE_Q8[0],), 1 / 127)
    x = torch.randn(rows, n_in)
    del weight

    def timed(fn: Callable[[], Tensor]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def best(fn: Callable[[], Tensor]) -> float:
        return min(timed(fn) for _ in range(reps + 1))  # the first call warms up (and loses to the others)

    return best(lambda: gemv(x, tiles, out)) / best(lambda: gemv_q8(x, q8, scale, out))
