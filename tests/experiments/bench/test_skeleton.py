"""The GEMM skeleton of a step: every matrix product replayed, nothing else, at the strides the step used."""

from __future__ import annotations

import torch

from transformer_xl.experiments.bench.skeleton import _Matmuls, gemm_skeleton


def test_the_gemm_skeleton_replays_every_product_and_only_the_products() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    x, y = torch.randn(3, 5, 6), torch.randn(3, 6, 7)
    w = torch.randn(4, 16, requires_grad=True)

    def step() -> None:
        h = torch.relu(a @ b)  # mm: 2*8*16*4
        torch.baddbmm(torch.zeros(3, 5, 7), x, y)  # baddbmm: 2*3*5*6*7
        torch.nn.functional.linear(a, w).sum().backward()  # forward mm + backward mm for w.grad: 2 * 2*8*16*4
        h.exp()

    sk = gemm_skeleton(step, passes=1)
    assert sk["calls"] == 4 and sk["flops"] == 2 * 8 * 16 * 4 * 3 + 2 * 3 * 5 * 6 * 7
    assert sk["ops"] > sk["calls"] and sk["seconds"] > 0  # relu, zeros, sum, exp, ... counted as operators
    assert w.grad is not None  # the step itself ran


def test_the_skeleton_keeps_the_strides_of_each_product() -> None:
    with _Matmuls() as rec:
        torch.randn(6, 4).t() @ torch.randn(6, 3)  # a transposed first factor
    (func, args, _), = rec.calls
    assert func is torch.ops.aten.mm.default
    assert args[0].shape == (4, 6) and args[0].stride() == (1, 4) and args[1].stride() == (3, 1)
