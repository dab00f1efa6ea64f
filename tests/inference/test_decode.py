"""The pieces of the captured step: packed weights, int8 linear maps, input embedding and the fused softmax."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_model
from transformer_xl.inference.decode import (
    INT8_UNROLL,
    ROW_BLOCK,
    SUM_ROWS,
    Linear,
    block_rows,
    block_slots,
    embed,
    head_log_probs,
    linear,
    pack,
    pack_linear,
    ring_slots,
    spec_of,
    supported,
    unblock_rows,
)
from transformer_xl.model.int8 import quantize_rows


@pytest.mark.parametrize("overrides, fused", [
    ({"cutoffs": [10, 25]}, True),
    ({"cutoffs": [10, 25], "div_val": 2, "tie_projs": [False, True, True]}, False),
    ({}, False),  # no clusters: one matrix, nothing to fuse
])
def test_embedding_and_head_equal_the_model(overrides, fused) -> None:
    model = tiny_model(0, n_token=40, d_model=32, d_head=16, **overrides)
    weights = pack(model)
    spec = spec_of(model, weights["head"], mem_len=4, same_length=False)
    assert bool(spec.head_sizes) == fused
    tok = torch.arange(40)  # every word, every cluster
    with torch.no_grad():
        assert (embed(spec, weights["emb"], tok) - model.word_emb(tok)).abs().max() <= 1e-6
        h = torch.randn(5, 32)
        assert (head_log_probs(spec, weights["head"], h) - model.log_prob(h)).abs().max() <= 1e-5


@pytest.mark.parametrize("overrides", [{}, {"cutoffs": [10, 25], "div_val": 2, "tie_projs": [False, True, False]},
                                       {"cutoffs": [10, 25], "div_val": 1}])
def test_int8_packs_every_matrix_a_step_multiplies_as_int8(overrides) -> None:
    """With ``int8=True`` every packed matrix (attention, feed-forward, the input projections, the head and its
    clusters' projections) is int8 with its scales; without it, none is."""
    from torch.utils._pytree import tree_leaves

    model = tiny_model(0, n_token=40, d_model=32, d_head=16, **overrides)
    for int8 in (True, False):
        maps = [x for x in tree_leaves(pack(model, int8=int8), is_leaf=lambda x: isinstance(x, Linear))
                if isinstance(x, Linear)]
        assert len(maps) > 4 * model.config.n_layer
        assert {m.weight.dtype for m in maps} == ({torch.int8} if int8 else {torch.float32})
        assert all((m.scale is not None) == int8 for m in maps)


def test_int8_linear_is_close_and_reads_int8() -> None:
    torch.manual_seed(0)
    w, b, x = torch.randn(64, 48), torch.randn(64), torch.randn(3, 48)
    packed = pack(tiny_model(0), int8=True)["layers"][0]["ff1"]
    assert packed.weight.dtype == torch.int8 and packed.scale.dtype == torch.bfloat16
    q = pack_linear(w, b, int8=True)
    ref = F.linear(x, w, b)
    err = (linear(x, q) - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.02
    assert (linear(x, pack_linear(w, b, int8=False)) - ref).abs().max() <= 1e-5 * ref.abs().max()
    # the scales are bf16 numbers before the weights are divided by them: q * scale is the weight the step uses
    deq = unblock_rows(q.weight, 64).float() * q.scale.reshape(-1)[:64, None].float()
    assert (deq - w).abs().max() <= q.scale.float().max() / 2 + 1e-6
    assert (linear(x, q) - F.linear(x, deq, b)).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("int8", [False, True])
def test_row_blocks_hold_the_matrix_in_lanes_and_zero_rows_beyond(int8) -> None:
    w = torch.randn(20, 41)
    lin = pack_linear(w, None, int8=int8)
    width = 44 if int8 else 41  # int8: the input width padded to a multiple of INT8_UNROLL (zero columns)
    assert width % (INT8_UNROLL if int8 else 1) == 0
    assert lin.weight.shape == (2, width, ROW_BLOCK) and lin.shape == (20, 41)  # rows 16 k .. 16 k + 15 in block k
    rows = unblock_rows(lin.weight, 20)
    assert torch.equal(lin.weight[1, :, 3], rows[ROW_BLOCK + 3]) and not lin.weight[1, :, 4:].any()
    assert not rows[:, 41:].any()
    if int8:
        assert torch.equal(rows[:, :41], quantize_rows(w)[0][:, :41]) and lin.scale.shape == (2, ROW_BLOCK)
        assert not lin.scale[1, 4:].float().any()
    else:
        assert torch.equal(rows, w)
    assert lin.padding_bytes == (2 * ROW_BLOCK * width - 20 * 41) * lin.weight.element_size()
    assert block_rows(torch.randn(32, 5)).shape == (2, 5, ROW_BLOCK)  # a multiple already: no zero rows
    assert pack_linear(torch.randn(32, 5), None, int8=False).padding_bytes == 0


def test_many_rows_take_one_matrix_product_or_one_pass_per_sum_rows_with_the_same_result(monkeypatch) -> None:
    torch.manual_seed(0)
    w, b, x = torch.randn(20, 41), torch.randn(20), torch.randn(2 * SUM_ROWS + 1, 41)
    for int8 in (False, True):
        lin = pack_linear(w, b, int8=int8)
        one_by_one = torch.cat([linear(r[None], lin) for r in x])
        assert (linear(x, lin) - one_by_one).abs().max() <= 1e-5  # eager: the unblocked matrix
        with monkeypatch.context() as m:  # as in a compiled step: passes of SUM_ROWS rows
            m.setattr(torch.compiler, "is_compiling", lambda: True)
            assert (linear(x, lin) - one_by_one).abs().max() <= 1e-5


def test_a_ring_holds_whole_slot_blocks() -> None:
    assert [ring_slots(m) for m in (1, 14, 15, 16, 640)] == [16, 16, 16, 32, 656]
    keys = torch.randn(2, 3, 32, 5)  # [B, H, C, E]
    blocks = block_slots(keys)
    assert blocks.shape == (2, 3, 2, 5, ROW_BLOCK) and torch.equal(blocks[1, 2, 1, :, 7], keys[1, 2, ROW_BLOCK + 7])


# aten._weight_int8pack_mm (torch 2.13, CPU: the plain model's int8 kernel) segfaults at batch >= 2, and returns
# garbage at batch 1, when the input width is not a multiple of 16. The captured step's int8 products are its own
# reductions, at any width; this runs in a child process, so that a regression to a kernel that needs padding fails
# this test instead of killing the test run.
_UNALIGNED = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from tests.helpers import generation_model
    from transformer_xl.inference.captured import CapturedDecoder
    from transformer_xl.inference.decode import linear, pack_linear
    from transformer_xl.inference.generate import generate
    torch.manual_seed(0)
    for k in (41, 410, 2100):
        w, b = torch.randn(410, k), torch.randn(410)
        lin = pack_linear(w, b, int8=True)
        for bsz in (1, 2, 3, 8):
            x = torch.randn(bsz, k)
            ref = F.linear(x, w, b)
            err = float((linear(x, lin) - ref).abs().max() / ref.abs().max())
            assert err < 0.02, (k, bsz, err)
    model = generation_model(0, d_model=40, n_head=4, d_head=10, d_inner=50, cutoffs=[10, 25])  # 40, 50: not 16s
    ids = torch.randint(0, 40, (3, 6), generator=torch.Generator().manual_seed(1))
    plain = generate(model, ids, max_new_tokens=6, mem_len=4, captured=False)
    dec = CapturedDecoder(model, batch=3, mem_len=4, int8=True, compile=False)
    cap = generate(model, ids, max_new_tokens=6, mem_len=4, captured=dec)
    assert float((cap.log_probs - plain.log_probs).abs().max()) < 0.15
    print("ok")
""")


def test_int8_kernel_never_sees_an_unaligned_width() -> None:
    done = subprocess.run([sys.executable, "-c", _UNALIGNED], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_supported_says_why_not() -> None:
    assert supported(tiny_model(0)) is None
    assert "attn_type 2" in supported(tiny_model(0, attn_type=2))
    assert supported(tiny_model(0, sample_softmax=1)) == "a sampled-softmax model (sample_softmax > 0)"
    assert supported(tiny_model(0, sample_softmax=0)) is None  # 0: the full softmax
    assert supported(tiny_model(0).quantize("int8")) == (
        "a quantized model (build the captured decoder from the float model with int8=True)")
