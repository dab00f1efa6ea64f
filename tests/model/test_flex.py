"""FlexAttention with the position term as its ``score_mod`` (:mod:`transformer_xl.model.flex`): its forward equals
the plain formula on the CPU (eagerly; torch 2.13 runs no FlexAttention backward on a CPU), the model's switch
reaches :func:`~transformer_xl.model.dispatch.choose` and changes nothing on the CPU; on CUDA (marked ``gpu``) its
gradients and those of the fused path equal the plain path's."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model
from transformer_xl.model import dispatch, flex
from transformer_xl.model.dispatch import FLEX, FUSED, PLAIN, SHIFTED, attend
from transformer_xl.model.memory import additive_mask, causal_mask
from transformer_xl.model.positional import PositionScores

CPU = torch.device("cpu")


def _inputs(Q: int, M: int, *, shaw: bool, same_length: bool = False, E: int = 4, device: torch.device = CPU,
            seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, H, K = 2, 3, Q + M
    q, x = (torch.randn(B, H, Q, E, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, H, K, E, generator=gen) for _ in range(2))
    y, d = torch.randn(K, H, E, generator=gen), torch.randn(K, H, generator=gen) if shaw else None
    mem_len = max(2, M - 2) if same_length else M  # same_length: every query sees mem_len keys once it can
    mask = additive_mask(causal_mask(qlen=Q, mlen=M, mem_len=mem_len, same_length=same_length, device=CPU),
                         torch.float32)
    to = dict(device=device)
    return q.to(**to), k.to(**to), v.to(**to), PositionScores(x.to(**to), y.to(**to), None if d is None else
                                                              d.to(**to)), mask.to(**to)


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("Q,M", [(4, 0), (4, 5), (6, 3), (1, 5)])
@pytest.mark.parametrize("shaw", [False, True])
def test_flex_forward_equals_the_plain_path(shaw: bool, Q: int, M: int, same_length: bool) -> None:
    """``U`` read at column ``j + Q-1-i`` (clamped past ``K-1``) with the mask as a block mask is ``rel_shift``."""
    q, k, v, p, mask = _inputs(Q, M, shaw=shaw, same_length=same_length)
    want = attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, plain=True)
    got = attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, path=FLEX)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_flex_takes_the_position_term_whole_or_none_and_a_mask_per_row() -> None:
    q, k, v, p, mask = _inputs(4, 5, shaw=True)
    rows = mask.expand(2, 1, *mask.shape).clone()
    rows[1, 0, :, :3] = float("-inf")  # row 1 loses its first three keys
    for pos, m in ((p.dense(), mask), (None, mask), (p, rows)):
        want = attend(q, k, v, pos, m, scale=0.5, dropatt=0.0, plain=True)
        torch.testing.assert_close(attend(q, k, v, pos, m, scale=0.5, dropatt=0.0, path="flex"), want,
                                   rtol=1e-5, atol=1e-6)


def test_the_block_mask_is_reused_for_the_same_unchanged_mask() -> None:
    mask = additive_mask(causal_mask(qlen=4, mlen=3, mem_len=3, same_length=False, device=CPU), torch.float32)
    first = flex.block_mask(mask, 4, 7)
    assert flex.block_mask(mask, 4, 7) is first
    mask[0, 1] = float("-inf")  # changed in place: made anew
    assert flex.block_mask(mask, 4, 7) is not first
    assert flex.block_mask(mask.clone(), 4, 7) is not first


def test_flex_has_no_dropout() -> None:
    q, k, v, p, mask = _inputs(4, 5, shaw=False)
    with pytest.raises(ValueError, match="no dropout"):
        attend(q, k, v, p, mask, scale=0.5, dropatt=0.1, path=FLEX)


def test_the_model_switch_reaches_choose_and_leaves_the_cpu_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TransformerXLLM.flex_attention()`` sets ``flex`` for :func:`choose`; CPU training still takes the shifted
    path and gives the loss and gradients it gave without the switch."""
    runs, real = [], dispatch.choose
    for enabled in (False, True):
        model = tiny_model(train=True, dropatt=0.0, d_head=16)  # a head FlexAttention takes
        model.flex_attention(enabled)
        seen: list[tuple[bool, dispatch.Path]] = []
        monkeypatch.setattr(dispatch, "choose",
                            lambda _s=seen, **kw: _s.append((kw["flex"], real(**kw).path)) or real(**kw))
        x = torch.randint(0, model.config.n_token, (2, 4), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(2)
        out = model(x, x, model(x).mems)
        out.loss.backward()
        assert seen and all(s == (enabled, SHIFTED) for s in seen[-model.config.n_layer:])
        runs.append((out.loss.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=0, atol=0)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_flex_is_left_off_for_heads_it_does_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention's kernels take heads of a power of two from 16: other models (WT103 base's 41, PTB's 40) keep
    the default path with the switch on."""
    assert [e for e in (8, 15, 16, 24, 32, 40, 41, 64, 72, 80, 128) if flex.supports_head_dim(e)] == [16, 32, 64, 128]
    seen, real = [], dispatch.choose
    monkeypatch.setattr(dispatch, "choose", lambda **kw: seen.append(kw["flex"]) or real(**kw))
    for e in (8, 16, 24):
        q, k, v, p, mask = _inputs(3, 2, shaw=False, E=e)
        attend(q, k, v, p, mask, scale=0.5, dropatt=0.0, flex=True)
    assert seen == [False, True, False]


def test_flex_computes_in_the_type_of_its_keys_and_values() -> None:
    """Under autocast the query is float32 (``q + u``, ``u`` a float32 parameter) and the keys and values bf16: the
    query is cast to their type (FlexAttention has no autocast rule; it would compute in float32, or refuse)."""
    q, k, v, p, mask = _inputs(4, 3, shaw=False, E=16)
    low = PositionScores(p.x.bfloat16(), p.y.bfloat16())
    out = flex.attend_flex(q, k.bfloat16(), v.bfloat16(), low, mask, scale=0.25)
    assert out.dtype is torch.bfloat16
    ref = attend(q, k, v, p, mask, scale=0.25, dropatt=0.0, plain=True)
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)


# ---------------------------------------------------------------------------------------------- CUDA
def _grads(path: dispatch.Path, q, k, v, p: PositionScores, mask, out_grad) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, *(t for t in p if t is not None))]
    pos = PositionScores(*leaves[3:5], leaves[5] if len(leaves) > 5 else None)
    out = attend(*leaves[:3], pos, mask, scale=0.5, dropatt=0.0, path=path)
    return [out.detach(), *torch.autograd.grad(out, leaves, out_grad)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shaw,same_length,Q,M", [(False, False, 8, 0), (True, True, 8, 13)])
def test_cuda_flex_and_fused_gradients_equal_the_plain_ones(shaw: bool, same_length: bool, Q: int, M: int) -> None:
    """Output and gradients of ``q, k, v`` and the position factors ``x, y, d`` (fp32, TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v, p, mask = _inputs(Q, M, shaw=shaw, same_length=same_length, E=16, device=torch.device("cuda"))
    out_grad = torch.randn_like(q)
    want = _grads(PLAIN, q, k, v, p, mask, out_grad)
    for path in (FUSED, FLEX):
        for got, ref in zip(_grads(path, q, k, v, p, mask, out_grad), want):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attn_type", [0, 1])
def test_cuda_training_with_flex_equals_the_reference_model(attn_type: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model with ``flex_attention()`` trains on FlexAttention (and without it on the fused path) with the
    reference model's loss and gradients."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = tiny_model(train=True, attn_type=attn_type, dropatt=0.0, dropout=0.0, d_head=16).cuda()
    ref.reference()
    x = torch.randint(0, ref.config.n_token, (2, 4), generator=torch.Generator().manual_seed(1)).cuda()
    real = dispatch.choose
    for enabled, path in ((False, FUSED), (True, FLEX)):
        model = tiny_model(train=True, attn_type=attn_type, dropatt=0.0, dropout=0.0, d_head=16).cuda()
        model.flex_attention(enabled)
        seen: list[dispatch.Path] = []
        monkeypatch.setattr(dispatch, "choose", lambda _s=seen, **kw: _s.append(real(**kw).path) or real(**kw))
        outs = []
        for m in (model, ref):
            m.zero_grad()
            out = m(x, x, m(x).mems)
            out.loss.backward()
            outs.append((out.loss.detach(), [t.grad for t in m.parameters()]))
        assert path in seen
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
        for a, b in zip(outs[0][1], outs[1][1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
