"""The fast paths of attention/positional/memory equal the plain formulas they replace.

* ``shift_padded`` on scores whose zero column comes from a zero key row == the paper's pad/view shift;
* ``attend`` without gradient (``scaled_dot_product_attention``) == with gradient (``baddbmm`` + softmax)
  == a plain ``softmax((q k^T + p) * scale + mask) v``, for every ``attn_type``;
* the fused path with a gradient (CUDA's training path; on the CPU the kernel's math fallback) == the plain
  formula, output and gradients of ``q, k, v`` and the position factors, with and without memory and dropout;
* the whole model under ``no_grad`` == with gradient;
* the memory update copies only the kept positions, as ``cat([mem, hid])[beg:end]``;
* the CPU ``Dropout`` keeps the distribution and scaling of ``nn.Dropout``;
* the fused ``relu_dropout`` of the feed-forward == ``ReLU`` then dropout with the same mask, values and
  gradients, keeping only its output for backward;
* ``recompute`` (attention) gives the same loss and gradients as the default path (dropout and dropatt on,
  every ``attn_type``) and keeps fewer bytes for backward;
* (GPU) a tiny model gives the same NLL on CUDA as on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import saved_bytes
from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.model.dispatch import FUSED, PLAIN, attend
from transformer_xl.model.fastpath import KEEP_BITS, MaskCache, keep_mask, mask_bias, relu_dropout, shift_padded
from transformer_xl.model.fastpath import CompactDropout as Dropout
from transformer_xl.model.memory import additive_mask, causal_mask
from transformer_xl.model.positional import PositionScores

V = 40
CPU = torch.device("cpu")


def _official_rel_shift(x: torch.Tensor) -> torch.Tensor:
    """The official ``_rel_shift`` (pad a zero column, view as [K+1, Q], drop a row, view back), batch-first."""
    *lead, q, k = x.shape
    padded = torch.cat([x.new_zeros(*lead, q, 1), x], dim=-1)
    return padded.view(*lead, k + 1, q)[..., 1:, :].reshape(*lead, q, k)


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (4, 0), (3, 5), (6, 6), (2, 9)])
def test_zero_key_row_shift_equals_official_shift(qlen: int, mlen: int) -> None:
    gen = torch.Generator().manual_seed(qlen * 7 + mlen)
    klen = qlen + mlen
    q = torch.randn(2, 3, qlen, 5, generator=gen)
    r = torch.randn(klen, 3, 5, generator=gen)  # [K, H, E]
    reference = _official_rel_shift(q @ r.permute(1, 2, 0))
    r_ext = torch.cat([r.new_zeros(1, 3, 5), r])  # [K+1, H, E]
    fast = shift_padded(q @ r_ext.permute(1, 2, 0))
    torch.testing.assert_close(fast, reference, rtol=1e-6, atol=1e-6)
    # the head-major layout the relative strategy uses gives the same view
    hm = torch.bmm(q.transpose(0, 1).reshape(3, 2 * qlen, 5), r_ext.permute(1, 2, 0)).view(3, 2, qlen, klen + 1)
    torch.testing.assert_close(shift_padded(hm).transpose(0, 1), reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("Q", [5, 1])  # 1: a generation step (two batched products over strided buffer views)
@pytest.mark.parametrize("with_p", [True, False])
def test_attend_paths_equal_plain_softmax(with_p: bool, Q: int) -> None:
    gen = torch.Generator().manual_seed(1)
    B, H, M, E = 2, 3, 4, 8
    K = Q + M
    q = torch.randn(B, H, Q, E, generator=gen)
    k, v = (torch.randn(B, H, K + 7, E, generator=gen)[:, :, 2:K + 2] for _ in range(2))  # views, as the cache's
    p = torch.randn(B, H, Q, K, generator=gen) if with_p else None
    mask = additive_mask(causal_mask(qlen=Q, mlen=M, mem_len=M, same_length=True, device=q.device), q.dtype)
    scale = E**-0.5
    plain = torch.softmax((q @ k.transpose(-1, -2) + (p if with_p else 0)) * scale + mask, -1) @ v
    with torch.no_grad():
        fused = attend(q, k, v, p, mask, scale=scale, dropatt=0.0)
    qg = q.clone().requires_grad_()
    explicit = attend(qg, k, v, p, mask, scale=scale, dropatt=0.0)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(explicit, plain, rtol=1e-5, atol=1e-6)


def _fused_and_plain_grads(Q: int, M: int, *, shaw: bool, same_length: bool, dropatt: float,
                           rows: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fused, plain) pairs: the outputs, then the gradients of ``q, k, v`` and of the position factors ``x, y``
    (and Shaw's ``d``), each path's dropout drawn from the same seed."""
    gen = torch.Generator().manual_seed(Q * 10 + M)
    B, H, E = 2, 3, 5
    K = Q + M
    leaves = [torch.randn(B, H, Q, E, generator=gen), torch.randn(B, H, K, E, generator=gen),
              torch.randn(B, H, K, E, generator=gen), torch.randn(B, H, Q, E, generator=gen),
              torch.randn(K, H, E, generator=gen)] + ([torch.randn(K, H, generator=gen)] if shaw else [])
    mask = additive_mask(causal_mask(qlen=Q, mlen=M, mem_len=max(2, M - 1), same_length=same_length,
                                     device=CPU), torch.float32)
    if rows:  # a mask per row [B, 1, Q, K]: row 1 loses its first key
        mask = mask.expand(B, 1, Q, K).clone()
        mask[1, 0, :, 0] = float("-inf")
        mask[1, 0, torch.arange(Q), M + torch.arange(Q)] = 0.0
    out_grad = torch.randn(B, H, Q, E, generator=gen)
    results = []
    for path in (FUSED, PLAIN):
        ts = [t.clone().requires_grad_(True) for t in leaves]
        torch.manual_seed(7)
        out = attend(*ts[:3], PositionScores(*ts[3:]), mask, scale=0.4, dropatt=dropatt, path=path)
        results.append([out.detach(), *torch.autograd.grad(out, ts, out_grad)])
    return list(zip(*results))


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("Q,M", [(4, 0), (4, 5), (1, 6)])
@pytest.mark.parametrize("shaw", [False, True])
def test_fused_path_with_a_gradient_equals_the_plain_one(shaw: bool, Q: int, M: int, same_length: bool) -> None:
    """``scaled_dot_product_attention`` with ``scale P + mask`` as a bias that needs a gradient (CUDA's training
    path, row 4 of ``choose``): on the CPU its math fallback gives the output and every gradient of the formula."""
    for fused, plain in _fused_and_plain_grads(Q, M, shaw=shaw, same_length=same_length, dropatt=0.0):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_fused_path_with_a_gradient_takes_a_mask_per_row() -> None:
    for fused, plain in _fused_and_plain_grads(4, 5, shaw=True, same_length=False, dropatt=0.0, rows=True):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_a_bias_that_needs_a_gradient_keeps_sdpa_off_kernels_that_drop_its_gradient(monkeypatch) -> None:
    """cuDNN's kernel (torch 2.11's first choice on H100/H200) returns no gradient for the bias, flash's takes no bias:
    with a gradient only the memory-efficient and math kernels are allowed; without one, every kernel as before."""
    import torch.nn.functional as F

    from transformer_xl.model import fastpath

    seen, real = [], F.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(fastpath.F, "scaled_dot_product_attention", sdpa)
    _fused_and_plain_grads(4, 3, shaw=False, same_length=False, dropatt=0.0)
    with torch.no_grad():
        q = torch.randn(1, 2, 3, 4)
        fastpath.attend_fused(q, q, q, torch.randn(1, 2, 3, 3), torch.zeros(3, 3), scale=0.5, dropatt=0.0)
    assert seen == [(False, False, True, True), (True, True, True, True)]


def test_fused_path_with_a_gradient_and_attention_dropout_equals_the_plain_one() -> None:
    """With ``dropatt``: the CPU's fallback draws its mask with ``dropout`` as the plain path does, so from the same
    seed both drop the same probabilities (on CUDA the kernel draws its own: the statistics are what match)."""
    pairs = _fused_and_plain_grads(6, 5, shaw=True, same_length=False, dropatt=0.3)
    for fused, plain in pairs:
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    undropped = _fused_and_plain_grads(6, 5, shaw=True, same_length=False, dropatt=0.0)
    assert not torch.allclose(pairs[0][0], undropped[0][0])  # the dropout did drop


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
@pytest.mark.parametrize("same_length", [False, True])
def test_model_no_grad_equals_grad_path(attn_type: int, same_length: bool) -> None:
    torch.manual_seed(0)
    cfg = TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=5,
                    attn_type=attn_type, same_length=same_length, clamp_len=3 if same_length else -1,
                    pre_lnorm=attn_type == 2, init_std=0.3)
    model = TransformerXLLM(cfg).eval()
    x = torch.randint(0, V, (3, 4), generator=torch.Generator().manual_seed(2))
    mems = model(x).mems
    with_grad = model(x, x, mems)
    with torch.no_grad():
        without = model(x, x, mems)
    torch.testing.assert_close(without.nll, with_grad.nll, rtol=1e-5, atol=1e-5)
    for a, b in zip(without.mems, with_grad.mems):
        torch.testing.assert_close(a, b)


def test_cached_mask_bias_equals_fresh_mask() -> None:
    cpu = torch.device("cpu")
    for same_length in (False, True):
        for mem_len in (3, 6):
            fresh = additive_mask(causal_mask(qlen=4, mlen=6, mem_len=mem_len, same_length=same_length,
                                              device=cpu), torch.float32)
            cached = mask_bias(qlen=4, mlen=6, mem_len=mem_len, same_length=same_length, device=cpu,
                               dtype=torch.float32)
            assert torch.equal(fresh, cached)


def test_mask_cache_is_bounded_in_bytes() -> None:
    cache = MaskCache(max_bytes=4 * 100 * (101 + 102))  # room for a [100, 101] and a [100, 102] float mask
    cpu = torch.device("cpu")
    for mlen in (0, 1, 2, 200):
        cache.get(qlen=100, mlen=mlen, mem_len=0, same_length=False, device=cpu, dtype=torch.float32)
        assert cache.nbytes <= cache.max_bytes
    assert len(cache._masks) == 2 and cache.nbytes == 4 * 100 * (101 + 102)  # the newest two that fit
    big = cache.get(qlen=100, mlen=200, mem_len=0, same_length=False, device=cpu, dtype=torch.float32)
    assert big.shape == (100, 300)  # too large to keep, still returned


def test_dropout_keeps_distribution_and_scale() -> None:
    torch.manual_seed(0)
    x = torch.ones(200_000, requires_grad=True)
    drop = Dropout(0.25)
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.01
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.75))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # gradient = mask * scale
    assert torch.equal(drop.eval()(x), x)


@pytest.mark.parametrize("p", [0.1, 0.25, 0.9])
def test_keep_mask_is_bernoulli_in_every_lane_and_independent(p: float) -> None:
    torch.manual_seed(3)
    n = 400_000
    keep = keep_mask((n,), p, torch.device("cpu")).float()
    tol = 4 * (p * (1 - p) / (n // 4)) ** 0.5  # four standard errors of a lane's rate
    for lane in range(4):  # the four 16-bit pieces of one 64-bit draw
        assert abs(keep[lane::4].mean().item() - (1 - p)) < tol
    both = (keep[:-1] * keep[1:]).mean().item()  # neighbours (pieces of one draw, and across draws) independent
    assert abs(both - (1 - p) ** 2) < 2 * tol
    assert keep_mask((2, 3, 5), p, torch.device("cpu")).shape == (2, 3, 5)  # any numel, not only multiples of 4


def test_keep_mask_drops_with_p_rounded_to_16_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # the draw replaced by an enumeration: lane 0 of word i holds -2**15 + i, every 16-bit value once, so the count
    # dropped in lane 0 is exactly round(p * 2**16), for p in the middle and near the ends
    words = torch.arange(-(2**15), 2**15, dtype=torch.int64)
    monkeypatch.setattr(torch, "randint", lambda *a, **kw: words.clone())
    for p in (0.1, 0.5, 1e-6, 0.999999):
        dropped = (~keep_mask((4 * 2**16,), p, torch.device("cpu"))[::4]).sum().item()
        assert dropped == min(round(p * 2**KEEP_BITS), 2**KEEP_BITS - 1)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
def test_relu_dropout_equals_relu_then_dropout(p: float) -> None:
    h = torch.randn(64, 300, generator=torch.Generator().manual_seed(1), requires_grad=True)
    g = torch.randn(64, 300, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    out = relu_dropout(h, p, training=True)
    torch.manual_seed(5)
    keep = keep_mask(h.shape, p, h.device)  # the mask the fused op draws (same generator state)
    ref_h = h.detach().clone().requires_grad_(True)
    ref = torch.relu(ref_h) * keep * (1.0 / (1.0 - p))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    (out * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(h.grad, ref_h.grad, rtol=1e-7, atol=0)
    if p > 0:
        assert abs((out != 0).float().mean().item() - 0.5 * (1 - p)) < 0.02  # half positive, then kept
        # Only the output is kept for backward (shared with the next Linear): 4 bytes per element.
        kept: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            relu_dropout(h, p, training=True)
        assert [t.shape for t in kept] == [h.shape] and kept[0].dtype == h.dtype
    assert torch.equal(relu_dropout(h, p, training=False), torch.relu(h))


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_recompute_equals_default(attn_type: int) -> None:
    cfg = TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=8, mem_len=8,
                    attn_type=attn_type, dropout=0.2, dropatt=0.2, init_std=0.3, pre_lnorm=attn_type == 2,
                    **(dict(cutoffs=[10, 20], div_val=2) if attn_type in (0, 2) else {}))  # adaptive softmax too
    torch.manual_seed(0)
    plain = TransformerXLLM(cfg).train()
    fast = TransformerXLLM(cfg).train()
    fast.load_state_dict(plain.state_dict())
    fast.recompute(True)
    x = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(3))
    mems_p = mems_f = None
    for seg in range(3):
        torch.manual_seed(10 + seg)
        out_p = plain(x, x, mems_p)
        out_p.loss.backward()
        torch.manual_seed(10 + seg)
        out_f = fast(x, x, mems_f)
        out_f.loss.backward()
        torch.testing.assert_close(out_f.nll, out_p.nll, rtol=0, atol=0)
        for (name, a), b in zip(plain.named_parameters(), fast.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
        mems_p, mems_f = out_p.mems, out_f.mems
    saved_plain = saved_bytes(lambda: plain(x, x, mems_p))
    saved_fast = saved_bytes(lambda: fast(x, x, mems_f))
    assert saved_fast < saved_plain


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    torch.manual_seed(0)
    cfg = TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6,
                    cutoffs=[10, 20], div_val=2, init_std=0.3)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = TransformerXLLM(cfg).eval()
    gpu = TransformerXLLM(cfg).eval().cuda()
    gpu.load_state_dict(model.state_dict())
    x = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(3))
    mems_c = mems_g = None
    for _ in range(3):
        out_c, out_g = model(x, x, mems_c), gpu(x.cuda(), x.cuda(), mems_g)
        mems_c, mems_g = out_c.mems, out_g.mems
        torch.testing.assert_close(out_g.nll.cpu(), out_c.nll, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(gpu(x.cuda(), x.cuda(), mems_g).nll.cpu(),
                                       model(x, x, mems_c).nll, rtol=1e-4, atol=1e-4)




# ---------------------------------------------------------------------------------------------- compilation
def test_compile_unavailable_names_the_missing_compiler(monkeypatch) -> None:
    from transformer_xl.model import fastpath

    monkeypatch.setattr(fastpath.shutil, "which", lambda name: None)
    why = fastpath.compile_unavailable("cpu")
    assert why is not None and "C++ compiler" in why
    monkeypatch.setattr(fastpath.shutil, "which", lambda name: "/usr/bin/" + name)
    assert fastpath.compile_unavailable("cpu") is None


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_forward_compiles_whole_and_matches_eager(attn_type) -> None:
    """``torch.compile(fullgraph=True)`` traces training (dropout, recompute, memories, backward) and evaluation;
    the compiled fp32 NLL equals eager's to 1e-5 (eval mode, two segments)."""
    from transformer_xl.model.fastpath import compiled

    torch._dynamo.reset()
    cfg = TXLConfig(n_token=50, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.1, dropatt=0.1,
                    tgt_len=6, mem_len=6, attn_type=attn_type)
    torch.manual_seed(0)
    model = TransformerXLLM(cfg)
    fn = compiled(model)
    x, y = torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 6))
    model.train()
    model.recompute(True)
    out = fn(x, y, None)
    fn(x, y, out.mems).loss.backward()  # fullgraph: a graph break would raise
    model.recompute(False)
    model.eval()
    with torch.no_grad():
        eager, comp = model(x, y, None), fn(x, y, None)
        assert (eager.nll - comp.nll).abs().max().item() < 1e-5
        eager2, comp2 = model(x, y, eager.mems), fn(x, y, comp.mems)
        assert (eager2.nll - comp2.nll).abs().max().item() < 1e-5


@pytest.mark.slow
def test_adaptive_model_compiles_whole_and_matches_eager() -> None:
    """With adaptive clusters (the per-cluster gathers of :func:`fastpath.cluster_nll`/``cluster_embed``) one
    training forward is one graph without a break, training and evaluation compile with ``fullgraph=True``, and the
    compiled fp32 NLL and gradients equal eager's to 1e-5 (training with the same dropout masks, then evaluation
    over two segments)."""
    from transformer_xl.model.fastpath import compiled

    torch._dynamo.reset()
    cfg = TXLConfig(n_token=60, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.1, dropatt=0.1,
                    tgt_len=6, mem_len=6, cutoffs=[10, 30], div_val=2, d_embed=32)
    torch.manual_seed(0)
    model = TransformerXLLM(cfg).train()
    x = torch.tensor([[0, 5, 12, 29, 31, 59], [3, 40, 11, 1, 2, 50]])
    y = torch.tensor([[5, 12, 29, 31, 59, 7], [40, 11, 1, 2, 50, 8]])  # every cluster hit
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        explained = torch._dynamo.explain(model)(x, y, model(x, y).mems)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    fn = compiled(model)
    torch.manual_seed(1)
    eager = model(x, y, None)
    torch.manual_seed(1)
    comp = fn(x, y, None)  # the same dropout masks as eager (ATen's generator, fallback_random)
    assert (eager.nll - comp.nll).abs().max().item() < 1e-5
    comp.loss.backward()  # the compiled backward through the gathers
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    eager.loss.backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-4)
    model.eval()
    with torch.no_grad():
        eager, comp = model(x, y, None), fn(x, y, None)
        eager2, comp2 = model(x, y, eager.mems), fn(x, y, comp.mems)
        assert (eager2.nll - comp2.nll).abs().max().item() < 1e-5
        only_head = torch.zeros_like(y)  # no tail word: empty gathers, the same graph
        assert (fn(x, only_head, eager.mems).nll - model(x, only_head, eager.mems).nll).abs().max().item() < 1e-5


def test_compiling_lets_dynamo_keep_a_graph_per_model_of_the_process() -> None:
    """Every model compiles the same ``forward``: with dynamo's default of 8 graphs per function, a process that
    compiles more models or shapes (``txl bench --variants`` over three cases) failed its next fullgraph compile."""
    from transformer_xl.model import fastpath

    model = TransformerXLLM(TXLConfig(n_token=10, n_layer=1, n_head=1, d_model=4, d_head=4, d_inner=4, tgt_len=2,
                                      mem_len=2))
    with torch._dynamo.config.patch(recompile_limit=8):
        fastpath.compiled(model)  # compiles lazily: nothing runs here
        assert torch._dynamo.config.recompile_limit == fastpath.GRAPHS_PER_FUNCTION
    with torch._dynamo.config.patch(recompile_limit=200):
        fastpath.allow_graphs()
        assert torch._dynamo.config.recompile_limit == 200  # never lowered


@pytest.mark.parametrize("capability", [None, "avx2", "default"])
def test_compiling_keys_inductors_cache_by_the_instruction_set_this_process_picks(monkeypatch, capability) -> None:
    """inductor's vector width set from the ISA the process picks (ATEN_CPU_CAPABILITY included), so that it keys
    the on-disk graph cache: a graph generated for one width and run at another gave NaN or a corrupted heap
    (the subprocess test in tests/inference/test_captured.py)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list

    from transformer_xl.model import fastpath

    if capability == "avx2" and not any("avx2" in str(isa) for isa in valid_vec_isa_list()):
        pytest.skip("not an AVX2 CPU")
    if capability is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    with inductor_config.patch({"cpp.simdlen": None}):
        picked = pick_vec_isa()
        fastpath.allow_graphs()
        assert inductor_config.cpp.simdlen == picked.bit_width() and str(pick_vec_isa()) == str(picked)
        assert inductor_config.cpp.simdlen == {None: picked.bit_width(), "avx2": 256, "default": 0}[capability]
    with inductor_config.patch({"cpp.simdlen": 128}):
        fastpath.allow_graphs()
        assert inductor_config.cpp.simdlen == 128  # the user's own setting kept


@pytest.mark.slow
def test_nine_models_compile_in_one_process() -> None:
    from transformer_xl.model.fastpath import compiled

    x = torch.randint(0, 10, (2, 3))
    for i in range(9):  # nine forward graphs of one function: one past dynamo's default limit
        model = TransformerXLLM(TXLConfig(n_token=10, n_layer=1, n_head=2, d_model=8 + 4 * i, d_head=4, d_inner=8,
                                          tgt_len=3, mem_len=3)).eval()
        with torch.no_grad():
            assert compiled(model)(x, x).loss.isfinite().all()
