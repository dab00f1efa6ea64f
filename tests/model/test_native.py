"""txl's matrix-vector kernels (:mod:`transformer_xl.model.native`): equal to ``F.linear`` in float32, equal to the
integer products of the activation quantized per row in int8, the same with one thread or two, one-line errors, and
the rule that picks them per CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_xl.model import dispatch, native
from transformer_xl.model.int8 import quantize_rows

needs_kernels = pytest.mark.skipif(not native.available(), reason=f"{native.unavailable()}")

SHAPES = [(20, 41), (1230, 410), (410, 2100), (7, 8), (33, 64)]


def _quantized(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 tiles and float32 row scales of ``w`` (the plain model's scheme), as the captured step packs them."""
    q, scale = quantize_rows(w)
    return native.tile(q[:, :w.size(1)], *native.TILE_Q8), F.pad(scale.float(), (0, -w.size(0) % 4))


@needs_kernels
@pytest.mark.parametrize("out, n_in", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 5])
def test_float_kernel_equals_f_linear_over_tiles_and_rows_as_stored(out, n_in, rows) -> None:
    torch.manual_seed(out + n_in + rows)
    w, b, x = torch.randn(out, n_in), torch.randn(out), torch.randn(rows, n_in)
    ref = F.linear(x, w, b)
    tol = 1e-5 * n_in ** 0.5 * ref.abs().max()
    assert (native.gemv(x, native.tile(w, *native.TILE_F32), out, b) - ref).abs().max() <= tol
    assert (native.gemv(x, w, out, b) - ref).abs().max() <= tol
    assert (native.gemv(x, w, out) - F.linear(x, w)).abs().max() <= tol


@needs_kernels
@pytest.mark.parametrize("n_in, out", [(1024, 256), (410, 16), (64, 1000), (7, 3)])
@pytest.mark.parametrize("rows", [1, 4])
def test_a_stored_in_by_out_matrix_is_x_times_it(n_in, out, rows) -> None:
    """``linear(x, W.t())`` over a stored ``W [in, out]`` (an adaptive softmax's projection, ``x @ W``): txl's
    column kernel, equal to the product; the columns split between threads give the same numbers as one."""
    torch.manual_seed(n_in + out + rows)
    x, w, b = torch.randn(rows, n_in), torch.randn(n_in, out), torch.randn(out)
    want = x @ w + b
    got = native.linear(x, w.t(), b)
    assert (got - want).abs().max() <= 1e-5 * n_in ** 0.5 * want.abs().max()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.linear(x, w.t(), b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, got)
    with pytest.raises(RuntimeError, match="w must be contiguous float32"):
        torch.ops.txl.gemv_t(x, w[:-1], None)


@needs_kernels
@pytest.mark.parametrize("out, n_in", SHAPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_int8_kernel_is_the_integer_product_of_the_activation_quantized_per_row(out, n_in, rows) -> None:
    """``x`` rounded per row to ``-127..127`` times ``max |x| / 127``, the products summed as integers, then scaled:
    computed here in float64 from the same numbers; and within the documented tolerance of the float product over
    the dequantized weights."""
    torch.manual_seed(out * n_in + rows)
    w, b, x = torch.randn(out, n_in), torch.randn(out), torch.randn(rows, n_in)
    x[0, 0] = 0.0
    tiles, scale = _quantized(w)
    got = native.gemv_q8(x, tiles, scale, out, b)
    q, s = quantize_rows(w)
    xs = x.abs().amax(1, keepdim=True).double() / 127
    xq = torch.round(x.double() / xs)
    assert xq.abs().max() <= 127
    ints = xq @ q[:, :n_in].double().t()  # exact in float64
    want = ints * xs * s[:out].double()[None] + b.double()
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    ref = F.linear(x, q[:, :n_in].float() * s[:out, None].float(), b)
    err = (got - ref).abs().max() / ref.abs().max()
    assert 0 < err <= native.INT8_ACTIVATION_TOLERANCE
    zero = native.gemv_q8(torch.zeros(1, n_in), tiles, scale, out, b)  # an all-zero row: scale 0, no division by it
    assert torch.equal(zero, b[None])


@needs_kernels
def test_every_thread_count_gives_the_same_numbers() -> None:
    """The rows are split between threads, never a row's sum: one thread and two give the same bits."""
    torch.manual_seed(0)
    w, x = torch.randn(33280, 410), torch.randn(1, 410)
    tiles, scale = _quantized(w)
    before = torch.get_num_threads()
    try:
        out = []
        for n in (1, 2):
            torch.set_num_threads(n)
            out.append((native.gemv(x, native.tile(w, 8, 8), 33280), native.gemv(x, w, 33280),
                        native.gemv_q8(x, tiles, scale, 33280)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*out))


@needs_kernels
def test_bad_input_is_refused_in_one_line() -> None:
    w, x = torch.randn(20, 41), torch.randn(2, 41)
    tiles = native.tile(w, 8, 8)
    for call, match in [
        (lambda: native.gemv(x.double(), tiles, 20), "x must be float32"),
        (lambda: native.gemv(x, tiles, 25), "out does not match"),
        (lambda: native.gemv(torch.randn(2, 80), tiles, 20), "more columns than w"),
        (lambda: native.gemv(x, native.tile(w, 4, 32), 20), r"w must be contiguous tiles \[O, I, 8, 8\]"),
        (lambda: native.gemv(x, w, 20, torch.randn(3)), "bias must be float32"),
        (lambda: native.gemv(x, torch.randn(20, 40), 20), "matching x"),
        (lambda: native.gemv_q8(x, *_quantized(w)[:1], torch.ones(3), 20), "scale must be"),
        (lambda: native.gemv_q8(x, tiles, torch.ones(20), 20), "int8|Char"),
    ]:
        with pytest.raises(RuntimeError, match=match):
            call()


def test_tiles_hold_the_matrix_with_zeros_beyond() -> None:
    w = torch.randn(20, 41)
    t = native.tile(w, 8, 8)
    assert t.shape == (3, 6, 8, 8) and torch.equal(t[1, 2, 3], w[11, 16:24])
    assert torch.equal(native.untile(t, (20, 41)), w)
    assert not native.untile(t, (24, 48))[20:].any() and not native.untile(t, (24, 48))[:, 41:].any()


@pytest.mark.parametrize("vendor, isa, wanted, expected", [
    ("AuthenticAMD", "AVX512", "", "native"),  # AMD: MKL's matrix-vector kernel on one core
    ("AuthenticAMD", "AVX2", "", "native"),
    ("GenuineIntel", "AVX2", "", "native"),  # AVX2: int8 widened to float is bound by arithmetic
    ("GenuineIntel", "AVX512", "", "compiled"),  # inductor's AVX-512 reductions
    ("GenuineIntel", "AVX512", "native", "native"),
    ("AuthenticAMD", "AVX2", "compiled", "compiled"),
])
def test_the_rule_picks_the_form_per_cpu(monkeypatch, vendor, isa, wanted, expected) -> None:
    native._cpu_products.cache_clear()
    monkeypatch.setattr(native, "vendor", lambda: vendor)
    monkeypatch.setattr(native, "available", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: isa)
    monkeypatch.setenv("TXL_DECODE_PRODUCTS", wanted)
    try:
        assert dispatch.decode_products("cpu") == expected
        assert dispatch.decode_products("meta") == "blas"  # not the CPU
        monkeypatch.setattr(native, "available", lambda: False)  # the kernels do not build: compiled, always
        native._cpu_products.cache_clear()
        assert dispatch.decode_products("cpu") == "compiled"
    finally:
        native._cpu_products.cache_clear()


def test_txl_native_0_turns_the_kernels_off_with_a_reason(monkeypatch) -> None:
    native.unavailable.cache_clear()
    native._cpu_products.cache_clear()
    monkeypatch.setenv("TXL_NATIVE", "0")
    try:
        assert native.unavailable() == "TXL_NATIVE=0 turns txl's native kernels off"
        assert not native.available() and dispatch.decode_products() == "compiled"
    finally:
        monkeypatch.delenv("TXL_NATIVE")
        native.unavailable.cache_clear()
        native._cpu_products.cache_clear()
        native.unavailable()


def test_linear_takes_the_kernel_at_a_few_rows_without_a_gradient_only(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(native, "products", lambda device="cpu": "native")
    monkeypatch.setattr(native, "gemv", lambda x, w, out, b=None: (calls.append(x.size(0)), F.linear(x, w, b))[1])
    w, b = torch.randn(20, 41), torch.randn(20)
    for shape, taken in [((1, 1, 41), True), ((4, 41), True), ((5, 41), False), ((2, 3, 41), False)]:
        calls.clear()
        x = torch.randn(*shape)
        assert torch.equal(native.linear(x, w, b), F.linear(x, w, b))
        assert bool(calls) == taken, shape
    calls.clear()
    native.linear(torch.randn(1, 41), torch.randn(41, 20)[:, ::2].t())  # neither it nor its transpose contiguous
    native.linear(torch.randn(1, 41), w.requires_grad_())  # a gradient is recorded: F.linear
    native.linear(torch.randn(1, 41).double(), w.detach().double())  # not float32
    assert calls == []


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bsz, slots", [(1, 16), (2, 48), (3, 656)])
def test_ring_attention_equals_the_softmax_written_out(dtype, bsz, slots) -> None:
    """``ring_attend`` against ``softmax(scale (qu . k_c + qv . p_{d(c)}) + bias) . v`` in float64 over the same
    (widened) ring: distances in any order, masked slots (``-inf``) and scores far apart (the polynomial exp)."""
    from transformer_xl.inference.decode import block_slots

    torch.manual_seed(slots + bsz)
    heads, e_dim = 3, 41
    keys, pos = torch.randn(bsz, heads, slots, e_dim).to(dtype), torch.randn(heads, slots, e_dim).to(dtype)
    vals = torch.randn(bsz, heads, e_dim, slots).to(dtype)
    qu, qv = 3 * torch.randn(bsz, heads, e_dim), 3 * torch.randn(bsz, heads, e_dim)
    by_slot = torch.randperm(slots)
    bias = torch.zeros(slots)
    bias[torch.randperm(slots)[:slots // 3]] = float("-inf")
    bias[0] = 0.0
    got = native.ring_attend(qu, qv, block_slots(keys), block_slots(pos), vals, by_slot, bias, 0.15)
    k64, p64, v64 = keys.double(), pos.double(), vals.double()
    score = torch.einsum("bhe,bhce->bhc", qu.double(), k64)
    score = score + torch.einsum("bhe,hce->bhc", qv.double(), p64)[..., by_slot]
    prob = torch.softmax(score * 0.15 + bias.double(), -1)
    want = torch.einsum("bhc,bhec->bhe", prob, v64)
    assert got.dtype == torch.float32 and got.shape == (bsz, heads, e_dim)
    assert (got.double() - want).abs().max() <= 2e-6 * max(1.0, want.abs().max())  # float32 sums: about 5e-7


@needs_kernels
def test_ring_attention_refuses_bad_shapes_in_one_line() -> None:
    from transformer_xl.inference.decode import block_slots

    ks, ps = block_slots(torch.randn(1, 2, 32, 8)), block_slots(torch.randn(2, 32, 8))
    vs, q, by, bias = torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8), torch.arange(32), torch.zeros(32)
    for args, match in [
        ((q, q, ks, ps[:1], vs, by, bias), "position keys must be"),
        ((q, q, ks, ps, vs[..., :16], by, bias), "values must be"),
        ((q, q, ks, ps.bfloat16(), vs, by, bias), "position keys must be"),
        ((q, q, ks, ps, vs, by[:16], bias), "by_slot and bias must be"),
        ((q, q, ks, ps, vs, by + 32, bias), "by_slot out of range"),
        ((q[:, :1], q, ks, ps, vs, by, bias), "queries must be"),
        ((q, q, ks.double(), ps.double(), vs.double(), by, bias), "float32 or bfloat16"),
    ]:
        with pytest.raises(RuntimeError, match=match):
            native.ring_attend(*args, 0.1)
