"""int8 weights for CPU inference: one scheme and one kernel for the plain model and the captured decode step.

**The scheme** (:func:`quantize_rows`): symmetric int8 per output row, ``W ~ q * s`` with ``q [out, in]`` in
``-127..127`` and one bf16 scale ``s = max|W_row| / 127`` per row; the biases stay float. The scales are rounded to
bf16 *before* the weights are divided by them, so ``q * s`` is exactly what the kernel multiplies by (a scale
rounded down, by at most 1/257 of itself, leaves ``|W / s| <= 127.4961`` before rounding: no clipping needed).

**The kernel** (:func:`int8_matmul`): ``aten._weight_int8pack_mm``, weight-only int8 (int8 weights times a bf16
input, float accumulation, a bf16 result; the input is not quantized). It reads ``in`` in blocks of
:data:`BLOCK` and fails (a segfault, or garbage at batch 1) when ``in`` is not a multiple of it, so
:func:`quantize_rows` pads ``in`` with zero columns (``d_model`` 410 -> 416, ``d_inner`` 2100 -> 2112) and
:func:`int8_matmul` pads the input with zeros. With a float32 input the same kernel is about 12 times slower: the
input is cast to bf16 for the product only, and the result back to the input's type.

**Who uses it**: :class:`Int8Linear`, the layer :meth:`TransformerXLLM.quantize
<transformer_xl.model.TransformerXLLM.quantize>` puts in place of the blocks' and the softmax's linear layers
(:func:`quantize_linears`, :func:`int8_linear`), and the captured step's packed weights
(:func:`transformer_xl.inference.packing.pack_linear`): the same :func:`quantize_rows`, so the two paths multiply
by the same int8 numbers and scales. The captured step has its own product over them (row blocks widened as read,
float32 input: :func:`transformer_xl.inference.decode.blocked_linear`, faster there than this kernel), so the two
paths differ by this kernel's bf16 rounding of the input. At batch 1 a generation step is bound by reading the
weights (:mod:`transformer_xl.inference.generate`), so a quarter of the bytes is most of the speed-up.

**When it pays**: the kernel reads a quarter of float32's bytes but computes no faster, so it pays where a product
is bound by reading its weights, a few rows by a large matrix (generation), and not where it is bound by
arithmetic: at 64 rows and more (evaluation, scoring) it ran at 0.4-0.5x float32's BLAS on both an AMX Xeon and the
same Xeon held to AVX2; at one row by the 33,278-word softmax, 2.0x and 1.7x. :func:`int8_speedup` measures it for a
command's row count (a probe of milliseconds), and the commands say in one line when it does not pay.

Why this kernel and not torchao's ``quantize_(model, Int8WeightOnlyConfig())`` or PyTorch's deprecated dynamic
quantization: ``benchmarks/bench_int8_choice.py`` (figures and the choice in ``docs/generation-speed.md``).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_xl.errors import ConfigError

#: The quantization schemes ``TransformerXLLM.quantize`` accepts.
SCHEMES = ("int8",)

#: The kernel reads the input dimension in blocks of this many (module docstring).
BLOCK = 16


def check_scheme(scheme: str, device: torch.device) -> None:
    """A one-line :class:`ConfigError` unless ``scheme`` can run here (int8 on the CPU, with the int8 kernel)."""
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")
    if device.type != "cpu":
        raise ConfigError(f"int8 quantization is for CPU inference; the model is on {device} (move it with "
                          ".cpu() first, or keep float weights on an accelerator)")
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):  # pragma: no cover - a torch build without the kernel
        raise ConfigError(f"this torch ({torch.__version__}) has no int8 kernel (aten._weight_int8pack_mm): int8 "
                          "inference is not available; use float weights")


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8 of ``weight [out, in]``: ``(q [out, in_16] int8, scales [out] bf16)``, the input
    dimension padded with zero columns to a multiple of :data:`BLOCK` (module docstring)."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(1).clamp(min=1e-12) / 127.0).to(torch.bfloat16)  # [out]
    q = torch.round(weight / scale.float()[:, None]).to(torch.int8)  # [out, in], -127..127 (module docstring)
    return F.pad(q, (0, -weight.size(1) % BLOCK)).contiguous(), scale


def int8_matmul(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x (q s)^T + b`` for ``x [..., in]`` and int8 rows ``weight [out, in_16]`` with ``scale [out]``
    (:func:`quantize_rows`): the input zero-padded to ``in_16`` and cast to bf16, the result ``[..., out]`` back in
    ``x``'s type."""
    lead = x.shape[:-1]
    xb = F.pad(x.reshape(-1, x.size(-1)), (0, weight.size(1) - x.size(-1))).to(torch.bfloat16).contiguous()
    y = torch.ops.aten._weight_int8pack_mm(xb, weight, scale).to(x.dtype)  # [N, out]
    y = y.view(*lead, weight.size(0))
    return y if bias is None else y + bias


class Int8Linear(nn.Module):
    """``x -> x W^T + b`` with ``W`` as int8 rows and bf16 row scales (:func:`quantize_rows`), run by
    :func:`int8_matmul`; for inference (its tensors are buffers, not parameters). ``weight [out, in_16]`` int8,
    ``scale [out]`` bf16, ``bias [out]`` float or None."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """From the float ``weight [out, in]`` and ``bias`` of a linear map (copied)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_rows(weight)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        return int8_matmul(x, self.weight, self.scale, self.bias)

    def rows(self, x: Tensor, rows: slice) -> Tensor:
        """Output columns ``rows`` of ``x W^T`` (no bias), multiplying by those rows of the weight only."""
        return int8_matmul(x, self.weight[rows], self.scale[rows])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_linears(module: nn.Module, names: list[str]) -> None:
    """Replace the ``nn.Linear`` submodules ``names`` of ``module`` (dotted paths) by :class:`Int8Linear`, in
    place."""
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        linear = getattr(parent, attr)
        if not isinstance(linear, nn.Linear):
            raise ConfigError(f"{name} is a {type(linear).__name__}, not a linear layer: it cannot be quantized")
        setattr(parent, attr, Int8Linear(linear.weight, linear.bias))


def int8_linear(weight: Tensor, bias: Tensor | None) -> nn.Module:
    """An int8 linear layer ``x -> x weight^T + bias`` from float ``weight [out, in]`` (copied)."""
    return Int8Linear(weight, bias)


def is_quantized(module: nn.Module) -> bool:
    """Whether ``module`` is one of the int8 layers made here."""
    return isinstance(module, Int8Linear)


#: Rows and output width :func:`int8_speedup` probes with at most: the ratio is flat beyond them, and the probe stays
#: at milliseconds.
PROBE_ROWS, PROBE_OUT = 64, 4096


def int8_speedup(n_out: int, n_in: int, rows: int, *, reps: int = 3) -> float:
    """float32 seconds ÷ int8 seconds of a product of ``rows`` rows (at most :data:`PROBE_ROWS`) by a ``[n_out, n_in]``
    matrix (at most :data:`PROBE_OUT` outputs) on this CPU: :func:`int8_matmul` against ``F.linear``, each the best
    of ``reps`` after a warm-up (above 1: int8 is faster)."""
    rows, n_out = max(1, min(rows, PROBE_ROWS)), max(1, min(n_out, PROBE_OUT))
    weight = torch.randn(n_out, n_in)
    q, scale = quantize_rows(weight)
    x = torch.randn(rows, n_in)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.no_grad():
        return best(lambda: F.linear(x, weight)) / best(lambda: int8_matmul(x, q, scale))


def int8_note(speedup: float, rows: int) -> str | None:
    """One line for a user who asked for int8 weights where :func:`int8_speedup` measured them no faster (None where
    they pay)."""
    if speedup >= 1:
        return None
    return (f"int8 weights measured {speedup:.2f}x the speed of float32 on this CPU for products of {rows} rows: "
            "--quantize int8 saves memory here, not time")
