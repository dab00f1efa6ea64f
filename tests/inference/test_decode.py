"""The pieces of the captured step: packed weights, int8 linear maps, input embedding and the fused softmax."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_model
from transformer_xl.inference.decode import (
    SUM_ROWS,
    block_slots,
    embed,
    head_log_probs,
    linear,
    ring_slots,
    spec_of,
    supported,
)
from transformer_xl.inference.packing import ROW_BLOCK, pack, pack_linear
from transformer_xl.model import native


@pytest.mark.parametrize("overrides, fused", [
    ({"cutoffs": [10, 25]}, True),
    ({"cutoffs": [10, 25], "div_val": 2, "tie_projs": [False, True, True]}, False),
    ({}, False),  # no clusters: one matrix, nothing to fuse
    ({"cutoffs": [20], "div_val": 2}, False),  # two input clusters: each word from its own table only
    ({"cutoffs": [20]}, True),  # one tail cluster, fused with the head
])
def test_embedding_and_head_equal_the_model(overrides, fused) -> None:
    model = tiny_model(0, n_token=40, d_model=32, d_head=16, **overrides)
    weights = pack(model)
    spec = spec_of(model, weights["head"], mem_len=4, same_length=False)
    assert bool(spec.head_sizes) == fused
    cfg = model.config
    assert (spec.n_layer, spec.n_head, spec.d_head, spec.mem_len) == (cfg.n_layer, cfg.n_head, cfg.d_head, 4)
    tok = torch.arange(40)  # every word, every cluster
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning (a softmax's implicit dimension, deprecated, gives one)
        assert (embed(spec, weights["emb"], tok) - model.word_emb(tok)).abs().max() <= 1e-6
        h = torch.randn(5, 32)
        assert (head_log_probs(spec, weights["head"], h) - model.log_prob(h)).abs().max() <= 1e-5


@pytest.mark.parametrize("products", ["compiled", "native"])
def test_many_rows_take_one_matrix_product_or_one_pass_per_sum_rows_with_the_same_result(monkeypatch, products) -> None:
    """Eagerly, more than SUM_ROWS rows take one matrix product (``F.linear``) and up to SUM_ROWS rows the sums;
    in a compiled step every row count takes the sums (passes of SUM_ROWS rows)."""
    torch.manual_seed(0)
    w, b, x = torch.randn(20, 41), torch.randn(20), torch.randn(2 * SUM_ROWS + 1, 41)
    products_seen: list[int] = []
    matrix_product = F.linear
    monkeypatch.setattr(F, "linear", lambda *a, **k: (products_seen.append(a[0].size(0)), matrix_product(*a, **k))[1])
    if products == "native" and (why := native.unavailable()):
        pytest.skip(why)
    for int8 in (False, True):
        lin = pack_linear(w, b, int8=int8, products=products)
        one_by_one = torch.cat([linear(r[None], lin) for r in x])
        assert (linear(x[:SUM_ROWS], lin) - one_by_one[:SUM_ROWS]).abs().max() <= 1e-5  # eager, SUM_ROWS: sums
        assert products_seen == []
        # eager, more: the unblocked matrix (txl's int8 kernel quantizes the activation, the matrix product not)
        tol = native.INT8_ACTIVATION_TOLERANCE * one_by_one.abs().max() if int8 and products == "native" else 1e-5
        assert (linear(x, lin) - one_by_one).abs().max() <= tol
        assert products_seen == [2 * SUM_ROWS + 1]
        products_seen.clear()
        with monkeypatch.context() as m:  # as in a compiled step: passes of SUM_ROWS rows
            m.setattr(torch.compiler, "is_compiling", lambda: True)
            assert (linear(x, lin) - one_by_one).abs().max() <= 1e-5
        assert products_seen == []


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
    from transformer_xl.inference.decode import linear
    from transformer_xl.inference.packing import pack_linear
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
    assert supported(tiny_model(0, sample_softmax=0)) is None  # 0, as -1: the full softmax
    assert "attn_type 2" in supported(tiny_model(0, attn_type=2))
    for k in (1, 10):
        assert supported(tiny_model(0, sample_softmax=k)) == "a sampled-softmax model (sample_softmax > 0)"
    assert supported(tiny_model(0).quantize("int8")) == ("a quantized model (build the captured decoder from the float "
                                                          "model with int8=True)")


def _step_against_the_plain_one(model, mem_len: int, prompt_len: int = 8, n: int = 14) -> None:
    """Greedy generation through the captured step (run eagerly) equals the plain step: tokens, log-probabilities."""
    from transformer_xl.inference.captured import CapturedDecoder
    from transformer_xl.inference.generate import generate

    ids = torch.randint(0, model.config.n_token, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    plain = generate(model, ids, max_new_tokens=n, mem_len=mem_len, captured=False)
    dec = CapturedDecoder(model, batch=2, compile=False, mem_len=mem_len)
    cap = generate(model, ids, max_new_tokens=n, mem_len=mem_len, captured=dec)
    assert torch.isfinite(cap.log_probs).all()
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-4 * max(1.0, plain.log_probs.abs().max().item())


def test_a_ring_with_one_slot_beyond_the_memory_reads_it_as_empty() -> None:
    """mem_len 14: 15 slots in use and one more in the ring's block of 16, always empty; past 16 positions its
    distance (the position plus one) is clamped to the last row of the position keys that exists."""
    from tests.helpers import generation_model

    assert ring_slots(14) == 16
    _step_against_the_plain_one(generation_model(0, n_token=40), mem_len=14, prompt_len=8, n=14)


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_the_step_uses_the_models_layer_norm_epsilon(pre_lnorm) -> None:
    """Layer norms with an epsilon other than PyTorch's default (1e-5): the step normalizes as the model does."""
    from tests.helpers import generation_model

    model = generation_model(0, n_token=40, pre_lnorm=pre_lnorm)
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = 0.5
    _step_against_the_plain_one(model, mem_len=6)


def test_large_attention_scores_stay_finite() -> None:
    """Query and key weights scaled up until the attention scores reach the hundreds (heads far apart): the softmax
    subtracts each head's own largest score, so no exponential overflows or underflows to zero as a whole."""
    from tests.helpers import generation_model

    model = generation_model(0, n_token=40)
    with torch.no_grad():
        for layer in model.layers:
            w = layer.dec_attn.qkv_net.weight
            w[: 2 * w.size(0) // 3] *= 12.0  # queries and keys; the values as they were
    _step_against_the_plain_one(model, mem_len=6)


@pytest.mark.parametrize("d_head", [8, 32])
def test_heads_narrower_or_wider_than_a_slot_block(d_head) -> None:
    """Heads of 8 or 32 dimensions (a slot block holds 16 slots, whatever the head's width): the position keys are
    blocked by slots, not by dimensions."""
    from tests.helpers import generation_model

    _step_against_the_plain_one(generation_model(0, n_token=40, d_head=d_head), mem_len=6)


def test_a_float_matrix_as_packed_off_the_cpu_is_one_product_with_its_bias() -> None:
    """A :class:`Linear` holding the plain ``[out, in]`` matrix (what :func:`pack_linear` keeps off the CPU, for
    BLAS) is ``x W^T + b``, the bias included."""
    from transformer_xl.inference.packing import Linear

    torch.manual_seed(0)
    w, b, x = torch.randn(20, 41), torch.randn(20), torch.randn(3, 41)
    assert torch.allclose(linear(x, Linear(w, None, b, (20, 41), "blas")), F.linear(x, w, b), atol=1e-6)


def test_int8_packs_every_matrix_of_the_model_as_int8() -> None:
    """``pack(int8=True)``: every matrix a step reads (attention, feed-forward, input projections, softmax heads and
    their projections) int8 with row scales."""
    from transformer_xl.inference.packing import Linear

    model = tiny_model(0, n_token=40, d_model=32, d_head=16, cutoffs=[10, 25], div_val=2,
                       tie_projs=[False, False, True])
    packed = pack(model, int8=True)

    def linears(x) -> list:
        if isinstance(x, Linear):
            return [x]
        if isinstance(x, dict):
            x = list(x.values())
        return [lin for item in x for lin in linears(item)] if isinstance(x, (list, tuple)) else []

    assert all(isinstance(proj, Linear) for _, proj in packed["emb"])  # div_val 2: every input cluster projected
    assert any(proj is not None for proj, _ in packed["head"])
    found = {name: linears(packed[name]) for name in ("layers", "emb", "head")}
    assert len(found["layers"]) == 4 * model.config.n_layer and found["emb"] and found["head"]
    for name, lins in found.items():
        assert all(lin.weight.dtype == torch.int8 and lin.scale is not None for lin in lins), name
    fused = pack(tiny_model(0, n_token=40, d_model=32, d_head=16, cutoffs=[10, 25]), int8=True)["head"]
    assert len(fused) == 1 and fused[0][1].weight.dtype == torch.int8  # the one matrix of the fused softmax


def test_off_the_cpu_a_float_matrix_is_kept_as_it_is_with_its_bias_and_shape() -> None:
    """``pack_linear`` of a float matrix on another device (here PyTorch's shape-only "meta" device) keeps the plain
    ``[out, in]`` matrix for BLAS, with its bias and the map's shape."""
    w, b = torch.randn(20, 41, device="meta"), torch.randn(20, device="meta")
    lin = pack_linear(w, b, int8=False)
    assert lin.weight.shape == (20, 41) and lin.bias is not None and lin.bias.shape == (20,)
    assert lin.scale is None and lin.shape == (20, 41)


@pytest.mark.parametrize("same_length", [False, True])
def test_the_step_keeps_the_tf_codes_memory(same_length) -> None:
    """tf_memory (the released TensorFlow models): the prompt starts from mem_len zero states and, under same_length,
    every query sees mem_len + 1 keys, all of a full ring; the captured step equals the plain one."""
    from tests.helpers import generation_model

    _step_against_the_plain_one(generation_model(0, n_token=40, tf_memory=True, same_length=same_length), mem_len=6)
