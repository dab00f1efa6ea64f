"""The captured step's packed weights: row blocks of float or int8 numbers (in lanes, or four to a 32-bit word),
their padding, the form each class of CPU reads, and the int8 products over them against the float ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_model
from transformer_xl.inference.decode import linear
from transformer_xl.inference.packing import INT8_UNROLL, ROW_BLOCK, block_rows, pack, pack_linear, unblock_rows
from transformer_xl.model.int8 import quantize_rows


@pytest.mark.parametrize("words", [False, True])
def test_int8_linear_is_close_and_reads_int8(words) -> None:
    torch.manual_seed(0)
    w, b, x = torch.randn(64, 48), torch.randn(64), torch.randn(3, 48)
    packed = pack(tiny_model(0), int8=True, words=words, products="compiled")["layers"][0]["ff1"]
    assert packed.weight.dtype == torch.int8 and packed.scale.dtype == torch.bfloat16
    assert packed.weight.dim() == (4 if words else 3)
    q = pack_linear(w, b, int8=True, words=words, products="compiled")
    ref = F.linear(x, w, b)
    err = (linear(x, q) - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.02
    assert (linear(x, pack_linear(w, b, int8=False, products="compiled")) - ref).abs().max() <= 1e-5 * ref.abs().max()
    # the scales are bf16 numbers before the weights are divided by them: q * scale is the weight the step uses
    deq = unblock_rows(q.weight, 64).float() * q.scale.reshape(-1)[:64, None].float()
    assert (deq - w).abs().max() <= q.scale.float().max() / 2 + 1e-6
    assert (linear(x, q) - F.linear(x, deq, b)).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("int8, words", [(False, None), (True, False), (True, True)])
def test_row_blocks_hold_the_matrix_in_lanes_and_zero_rows_beyond(int8, words) -> None:
    w = torch.randn(20, 41)
    lin = pack_linear(w, None, int8=int8, words=words, products="compiled")
    width = 44 if int8 else 41  # int8: the input width padded to a multiple of INT8_UNROLL (zero columns)
    assert width % (INT8_UNROLL if int8 else 1) == 0
    rows = unblock_rows(lin.weight, 20)
    if words:  # 32-bit words: a row's weights of inputs 4 g .. 4 g + 3 side by side, rows 16 k .. 16 k + 15 in block k
        assert lin.weight.shape == (2, width // INT8_UNROLL, ROW_BLOCK, INT8_UNROLL) and lin.shape == (20, 41)
        assert torch.equal(lin.weight[1, :, 3].reshape(-1), rows[ROW_BLOCK + 3]) and not lin.weight[1, :, 4:].any()
        assert torch.equal(lin.weight[0, 2, 5], rows[5, 8:12])
        assert torch.equal(lin.weight.view(torch.int32)[0, 2, 5, 0],  # one word, little-endian: input 8 lowest
                           sum(rows[5, 8 + j].int() % 256 << 8 * j for j in range(4)).int())
    else:
        assert lin.weight.shape == (2, width, ROW_BLOCK) and lin.shape == (20, 41)  # rows 16 k .. 16 k + 15 in block k
        assert torch.equal(lin.weight[1, :, 3], rows[ROW_BLOCK + 3]) and not lin.weight[1, :, 4:].any()
    assert not rows[:, 41:].any()
    if int8:
        assert torch.equal(rows[:, :41], quantize_rows(w)[0][:, :41]) and lin.scale.shape == (2, ROW_BLOCK)
        assert not lin.scale[1, 4:].float().any()
    else:
        assert torch.equal(rows, w)
    assert lin.padding_bytes == (2 * ROW_BLOCK * width - 20 * 41) * lin.weight.element_size()
    assert block_rows(torch.randn(32, 5)).shape == (2, 5, ROW_BLOCK)  # a multiple already: no zero rows
    assert pack_linear(torch.randn(32, 5), None, int8=False, products="compiled").padding_bytes == 0


@pytest.mark.parametrize("isa, words", [("avx2", True), ("avx512", False), ("amx", False), ("neon", True)])
def test_the_int8_form_follows_the_width_of_the_compilers_vectors(monkeypatch, isa, words) -> None:
    """Words (32-bit loads, shifts) where the compiler's vectors are narrower than 512 bits, int8 lanes (masked loads)
    where they are 512 bits wide: each the faster on its class (benchmarks/int8_forms.py), fakes of each."""
    from torch._inductor import cpu_vec_isa

    width = {"avx2": 256, "avx512": 512, "amx": 512, "neon": 128}[isa]
    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: type("ISA", (), {"bit_width": lambda self: width})())
    from transformer_xl.inference import packing

    assert packing.int8_words() is words
    lin = pack(tiny_model(0), int8=True, products="compiled")["layers"][0]["qkv"]
    assert lin.weight.dim() == (4 if words else 3)


@pytest.mark.parametrize("int8", [False, True])
def test_native_tiles_hold_the_matrix_and_zeros_beyond(int8) -> None:
    """``products="native"``: txl's kernels' tiles (float32 8 x 8, int8 4 x 32 with float32 row scales), the same
    numbers as the row blocks, and the product over them equal to the float one (int8: within the activation's
    rounding)."""
    from transformer_xl.inference.packing import unpack
    from transformer_xl.model import native

    torch.manual_seed(0)
    w, b, x = torch.randn(20, 41), torch.randn(20), torch.randn(3, 41)
    lin = pack_linear(w, b, int8=int8, products="native")
    blocks = pack_linear(w, b, int8=int8, products="compiled")
    assert lin.form == "tiles" and blocks.form == "blocks"
    rows, cols = native.TILE_Q8 if int8 else native.TILE_F32
    assert lin.weight.shape == (-(-20 // rows), -(-41 // cols), rows, cols)
    assert torch.equal(unpack(lin), unpack(blocks))  # the same (dequantized) matrix
    assert not native.untile(lin.weight, (lin.weight.size(0) * rows, lin.weight.size(1) * cols))[20:].any()
    if int8:
        assert lin.scale.dtype == torch.float32 and lin.scale.shape == (20,)
    if native.available():
        ref = F.linear(x, unpack(lin), b)
        tol = native.INT8_ACTIVATION_TOLERANCE if int8 else 1e-6
        assert (linear(x, lin) - ref).abs().max() <= tol * ref.abs().max()
