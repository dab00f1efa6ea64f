"""The GEMM skeleton of a training step (a yardstick beside the GEMM peak, :mod:`.yardstick`): the matrix products
one step runs, recorded under a dispatch mode and replayed back to back on random inputs without the rest of the
step, so that a step's time can be set against what its BLAS calls alone cost."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_xl.experiments.bench.yardstick import best_seconds

_MATMULS = {torch.ops.aten.mm.default: 0, torch.ops.aten.addmm.default: 1, torch.ops.aten.bmm.default: 0,
            torch.ops.aten.baddbmm.default: 1}  # -> index of the first factor among the arguments


def _matmul_flops(func: Any, args: tuple) -> int:
    """2 x multiply-adds of a recorded ``mm``/``addmm``/``bmm``/``baddbmm`` (the rectangle it computes)."""
    a, b = args[_MATMULS[func]], args[_MATMULS[func] + 1]
    return 2 * math.prod(a.shape) * b.size(-1)


_METADATA = {torch.ops.aten.detach.default, torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
             torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default,
             torch.ops.aten.new_empty_strided.default, torch.ops.aten.resize_.default}


class _Matmuls(TorchDispatchMode):
    """Records every matrix product run under it: the function, and its arguments as tensors of the same shapes,
    strides and dtypes (random values), so that the chain can be replayed without the rest of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict]] = []
        self.ops = 0  # every operator that computes (views and allocations left out)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self.ops += not func.is_view and func not in _METADATA
        if func in _MATMULS:
            def like(t: Any) -> Any:
                if not isinstance(t, torch.Tensor):
                    return t
                base = torch.randn(t.untyped_storage().nbytes() // t.element_size() + 1, device=t.device)
                return base.to(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())

            self.calls.append((func, tuple(like(a) for a in args), {k: like(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


def gemm_skeleton(step: Callable[[], Any], *, passes: int = 3, device: str = "cpu") -> dict[str, float]:
    """The bare skeleton of a step: every matrix product one call of ``step`` runs (forward and backward: ``mm``,
    ``addmm``, ``bmm``, ``baddbmm``, recorded under a dispatch mode with their shapes, strides and dtypes), replayed
    back to back on random inputs, nothing else. Returns its best ``seconds`` of ``passes``, the ``flops`` those
    products compute (the rectangles, masked entries included), ``calls`` (their number) and ``ops`` (every operator
    the step dispatched that computes something; views and allocations left out): the skeleton is what a step could
    cost if everything but its matrix products were free, the floor to set the step's time against."""
    with _Matmuls() as rec:
        step()

    def chain() -> None:
        for func, args, kwargs in rec.calls:
            func(*args, **kwargs)

    secs = best_seconds(chain, passes, device)
    return {"seconds": secs, "flops": float(sum(_matmul_flops(f, a) for f, a, _ in rec.calls)),
            "calls": float(len(rec.calls)), "ops": float(rec.ops)}
