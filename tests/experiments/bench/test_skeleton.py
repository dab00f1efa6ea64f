"""The GEMM skeleton of a step: every matrix product replayed, nothing else, at the strides the step used."""

from __future__ import annotations

import torch

from transformer_xl.experiments.bench.skeleton import _matmul_flops, _Matmuls, gemm_skeleton


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


def test_the_recording_counts_products_of_each_kind_and_every_computing_operator() -> None:
    a, b, bias = torch.randn(5, 6), torch.randn(6, 3), torch.randn(1)  # a bias broadcast from one element
    x, y = torch.randn(2, 5, 6), torch.randn(2, 6, 3)
    with _Matmuls() as rec:
        torch.empty(7)  # an allocation: not an operator that computes
        h = a.t()  # a view: not counted either
        torch.addmm(bias, a, b, beta=0.5)  # 2*5*6*3, the bias is not a factor
        torch.baddbmm(torch.zeros(2, 5, 3), x, y)  # 2*2*5*6*3; zeros counts as an operator
        torch.relu(h)
    assert [f for f, _, _ in rec.calls] == [torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default]
    assert [_matmul_flops(f, args) for f, args, _ in rec.calls] == [2 * 5 * 6 * 3, 2 * 2 * 5 * 6 * 3]
    assert rec.ops == 4  # addmm, zeros (a fill), baddbmm, relu


def test_recorded_factors_are_fresh_tensors_of_the_same_layout_type_and_device() -> None:
    base = torch.randn(4, 7, dtype=torch.float64)
    a, b = base[1:, 2:5], torch.randn(3, 2, dtype=torch.float64)  # a view with a storage offset and a row stride
    with _Matmuls() as rec:
        out = torch.addmm(torch.ones(3, 2, dtype=torch.float64), a, b, beta=0.5)
    torch.testing.assert_close(out, 0.5 + a @ b)  # the step itself ran, with its keyword arguments
    (_, args, kwargs), = rec.calls
    assert kwargs == {"beta": 0.5}
    for got, real in zip(args, (None, a, b)):
        assert got.dtype is torch.float64 and got.device == base.device
        if real is not None:
            assert (got.shape, got.stride(), got.storage_offset()) == (real.shape, real.stride(), real.storage_offset())
            assert got.untyped_storage().data_ptr() != real.untyped_storage().data_ptr()  # random, not the step's
    with _Matmuls() as meta:
        torch.mm(torch.empty(2, 3, device="meta"), torch.empty(3, 4, device="meta"))
    assert {t.device.type for t in meta.calls[0][1]} == {"meta"}


def test_the_skeleton_replays_the_calls_with_their_keywords(monkeypatch) -> None:
    from transformer_xl.experiments.bench import skeleton

    seen: list[tuple] = []

    def timed(fn, passes: int, device: str) -> float:
        with _Matmuls() as replay:
            fn()
        seen.append((passes, device, [(f, kw) for f, _, kw in replay.calls]))
        return 0.5

    monkeypatch.setattr(skeleton, "best_seconds", timed)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    sk = gemm_skeleton(lambda: torch.addmm(torch.zeros(3, 5), a, b, alpha=2.0))
    assert sk == {"seconds": 0.5, "flops": 2 * 3 * 4 * 5, "calls": 1.0, "ops": 2.0}  # zeros, addmm
    assert seen == [(3, "cpu", [(torch.ops.aten.addmm.default, {"alpha": 2.0})])]
