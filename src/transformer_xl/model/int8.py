"""int8 weights for CPU inference, through PyTorch's dynamic quantization (``torch.ao.quantization``).

A quantized linear layer keeps its weight as int8, one scale per output row (symmetric per-channel), and at
every call quantizes its input per tensor and runs the x86/fbgemm int8 kernel with int32 accumulation
(``torch.ops.quantized.linear_dynamic``); the bias stays float. At batch 1 a generation step is bound by
reading the weights (:mod:`transformer_xl.inference.generate`), so a quarter of the bytes is most of the speed-up.

Why this path (``benchmarks/bench_int8_choice.py``, a matrix-vector pass over 55 M weights on the 2-core
development CPU with AVX-512 VNNI and BF16, torch 2.13; ``docs/generation-speed.md``): PyTorch's dynamic quantization
took 6.0 ms on one thread and 3.5 ms on two, against 22.6 / 22.5 ms in float32; torchao 0.18's
``Int8WeightOnlyConfig`` 10.9 / 9.6 ms and its ``Int8DynamicActivationInt8WeightConfig`` 27.8 / 22.5 ms; bf16
15.6 / 9.3 ms where the CPU has native bf16 (on one without, a bf16 matrix product ran at 0.9 GFLOP/s against 132
in float32). ``torch.ao.quantization`` is deprecated upstream in favour of torchao but present and working in the
torch releases txl supports; its deprecation warnings are silenced here, and a torch without it (or without a
quantized CPU engine) gets a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from transformer_xl.errors import ConfigError

#: The quantization schemes ``TransformerXLLM.quantize`` accepts.
SCHEMES = ("int8",)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """``torch.ao.quantization`` announces its deprecation at every call: once is enough (the module docs)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.ao.quantization.*")
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def check_scheme(scheme: str, device: torch.device) -> None:
    """A one-line :class:`ConfigError` unless ``scheme`` can run here (int8 on the CPU, with a quantized engine)."""
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")
    if device.type != "cpu":
        raise ConfigError(f"int8 quantization is for CPU inference; the model is on {device} (move it with "
                          ".cpu() first, or keep float weights on an accelerator)")
    engines = getattr(torch.backends, "quantized", None)
    if engines is None or not any(e in engines.supported_engines for e in ("x86", "fbgemm", "qnnpack")):
        raise ConfigError("this torch build has no quantized CPU engine (torch.backends.quantized): int8 "
                          "inference is not available; use float weights")
    try:
        from torch.ao.quantization import quantize_dynamic  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a future torch without torch.ao.quantization
        raise ConfigError(f"this torch ({torch.__version__}) has no torch.ao.quantization: int8 inference is "
                          "not available; use float weights") from exc


def quantize_linears(module: nn.Module, names: list[str]) -> None:
    """Replace the ``nn.Linear`` submodules ``names`` of ``module`` (dotted paths) by int8 ones, in place."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with _quiet():
        quantize_dynamic(module, {name: per_channel_dynamic_qconfig for name in names}, dtype=torch.qint8,
                         inplace=True)


def int8_linear(weight: Tensor, bias: Tensor | None) -> nn.Module:
    """An int8 linear layer ``x -> x weight^T + bias`` from float ``weight [out, in]`` (copied)."""
    linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    holder = nn.ModuleDict({"linear": linear})
    quantize_linears(holder, ["linear"])
    return holder["linear"]


def is_quantized(module: nn.Module) -> bool:
    """Whether ``module`` is one of the int8 layers made here."""
    return type(module).__module__.startswith("torch.ao.nn.quantized")
