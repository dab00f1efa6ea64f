"""The one multi-head attention over ``[memory; segment]`` (paper Sec. 3.2-3.3), and the feed-forward block.

For layer ``n`` (paper, Sec. 3.3 "the computational procedure"):

    h~   = [SG(m^{n-1}) o h^{n-1}]                       keys/values see memory and segment
    q, k, v = h^{n-1} W_q,  h~ W_k,  h~ W_v
    A_ij = (q_i + u)^T k_j + P_ij                        P from the position strategy
    a    = Masked-Softmax(A / sqrt(d_head)) v
    o    = LayerNorm(Linear(a) + h^{n-1})                (post-LN; pre-LN: h + Linear(a) on LN input)

The position strategy (:mod:`txl.positional`) supplies ``u`` and ``P``; :func:`attend` adds the causal
mask, takes the softmax (with attention dropout) and applies it to the values. Parameter names
(``qkv_net``, ``r_net``, ``o_net``, ``layer_norm``, ``CoreNet``) are those of the official code.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``M`` memory length, ``K = M + Q``, ``D`` d_model,
``E`` d_head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from txl.positional import PositionalEncoding, PositionContext


def attend(q: Tensor, k: Tensor, v: Tensor, p: Tensor | None, mask_bias: Tensor, *, scale: float,
           dropatt: float) -> Tensor:
    """``Dropout(softmax(scale * (q k^T + p) + mask_bias)) v``: ``[B, H, Q, E]`` from ``q [B, H, Q, E]``,
    ``k, v [B, H, K, E]``, position scores ``p [B, H, Q, K]`` (or None) and ``mask_bias [Q, K]`` (0 / -inf).

    When a gradient is needed the scores are one ``baddbmm`` (``scale * p`` in, ``scale * q k^T`` added,
    the mask added in place) and an explicit softmax, so that autograd keeps only the probabilities of
    the ``[Q, K]`` tensors (the fused CPU kernel of ``scaled_dot_product_attention`` takes no gradient
    for an additive bias that needs one, and its fallback keeps three ``[Q, K]`` tensors). Without a
    gradient (evaluation, generation) ``scaled_dot_product_attention`` with the bias ``scale * p + mask``
    runs its fused kernel. ``tests/test_fastpath.py`` checks that both give the same result.
    """
    bsz, n_head, qlen, d_head = q.shape
    klen = k.size(2)
    if not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, p))):
        bias = mask_bias if p is None else torch.add(mask_bias, p, alpha=scale)  # [B, H, Q, K]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropatt, scale=scale)
    # Head-major batches [H*B, ...]: the position scores of the relative strategies come that way (a view).
    q3 = q.transpose(0, 1).reshape(n_head * bsz, qlen, d_head)  # [HB, Q, E]
    kt = k.transpose(0, 1).reshape(n_head * bsz, klen, d_head).transpose(1, 2)  # [HB, E, K]
    v3 = v.transpose(0, 1).reshape(n_head * bsz, klen, d_head)  # [HB, K, E]
    mask_bias = mask_bias.to(q.dtype)
    if p is None:
        scores = torch.baddbmm(mask_bias, q3, kt, alpha=scale)  # [HB, Q, K]
    else:
        p3 = p.transpose(0, 1).reshape(n_head * bsz, qlen, klen).to(q.dtype)  # [HB, Q, K]
        scores = torch.baddbmm(p3, q3, kt, beta=scale, alpha=scale).add_(mask_bias)  # [HB, Q, K]
    prob = F.dropout(scores.softmax(-1), dropatt, training=dropatt > 0)  # [HB, Q, K]
    return torch.bmm(prob, v3).view(n_head, bsz, qlen, d_head).transpose(0, 1)  # [B, H, Q, E]


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same distribution and scaling) that keeps a 1-byte mask for backward on the CPU.

    PyTorch's CPU dropout draws a float noise tensor with ``bernoulli_`` and keeps it (4 bytes per
    element); comparing ``rand`` against ``p`` is faster there and the boolean mask is a quarter of the
    size. Other devices use ``F.dropout`` (their fused kernel already keeps a boolean mask).
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or self.p >= 1.0 or x.device.type != "cpu":
            return F.dropout(x, self.p, self.training, self.inplace)
        keep = torch.rand_like(x) >= self.p
        return x * keep * (1.0 / (1.0 - self.p))


class _ReluDropout(torch.autograd.Function):
    """``Dropout(ReLU(h))`` that keeps only its output for backward (see :func:`relu_dropout`)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: Tensor, p: float) -> Tensor:
        keep = torch.rand_like(h) >= p  # the same Bernoulli(1 - p) keep mask as nn.Dropout
        ctx.scale = 1.0 / (1.0 - p)
        out = h.clamp_min(0.0).mul_(keep).mul_(ctx.scale)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        (out,) = ctx.saved_tensors
        # d out / d h = keep * scale * [h > 0], and out > 0 exactly where keep and h > 0.
        return torch.ops.aten.threshold_backward(grad, out, 0.0).mul_(ctx.scale), None


def relu_dropout(h: Tensor, p: float, training: bool) -> Tensor:
    """``Dropout(ReLU(h), p)`` of the feed-forward block, with what autograd keeps cut from 9 to 4 bytes per
    element: ``nn.ReLU`` keeps its output, ``Dropout`` its mask and the next ``Linear`` the dropped output;
    here the dropped output alone is kept (and shared with the ``Linear``), since its sign gives the
    gradient mask of both. Same distribution and scaling as ``nn.Dropout`` (tested); evaluation or
    ``p = 0`` is a plain ReLU."""
    if not training or p == 0.0:
        return F.relu(h)
    if p >= 1.0:
        return h * 0.0
    return _ReluDropout.apply(h, p)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with memory, parameterized by a position-encoding strategy."""

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float,
                 pre_lnorm: bool, pos_proj: bool) -> None:
        super().__init__()
        self.n_head, self.d_head, self.dropatt = n_head, d_head, dropatt
        self.scale = 1.0 / math.sqrt(d_head)
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)  # rows: W_q; W_k; W_v
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False) if pos_proj else None  # W_kR
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.drop = Dropout(dropout)
        self.pre_lnorm = pre_lnorm
        # Recompute the [Q, K] scores and probabilities in backward instead of keeping them
        # (TransformerXLLM.recompute): about 9 of 30 bytes per layer and token less, for ~5 % time.
        self.recompute = False

    def forward(self, x: Tensor, mem: Tensor | None, *, layer: int, pos: PositionalEncoding,
                ctx: PositionContext, mask_bias: Tensor, mem_kv: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x``: ``[B, Q, D]``; ``mem``: ``[B, M, D]`` or None; ``mask_bias``: ``[Q, K]`` (0 / -inf).

        ``mem_kv`` (inference only): the keys/values ``[B, M, 2*H*E]`` of ``mem`` projected by an earlier
        segment, used instead of projecting ``mem`` again. Returns the output ``[B, Q, D]`` and the
        keys/values of all ``K`` positions ``[B, K, 2*H*E]`` (what the next segment can reuse).
        """
        bsz, qlen, _ = x.shape
        hd = self.n_head * self.d_head
        w_q, w_kv = self.qkv_net.weight[:hd], self.qkv_net.weight[hd:]
        x_in = self.layer_norm(x) if self.pre_lnorm else x  # [B, Q, D]
        # Queries only for the segment. Under pre-LN the official absolute-position attention projects
        # queries from the un-normalized input; the relative ones from the normalized one.
        q = F.linear(x_in if pos.prenorm_query else x, w_q)  # [B, Q, H*E]
        q = q.view(bsz, qlen, self.n_head, self.d_head).transpose(1, 2)  # [B, H, Q, E]
        kv = F.linear(x_in, w_kv)  # [B, Q, 2*H*E]
        if mem is not None and mem.size(1) > 0:
            if mem_kv is None:
                # The memory is projected on its own: it needs no gradient, so backward skips its d(input).
                mem_in = self.layer_norm(mem) if self.pre_lnorm else mem  # [B, M, D]
                mem_kv = F.linear(mem_in, w_kv)  # [B, M, 2*H*E]
            kv = torch.cat([mem_kv, kv], dim=1)  # [B, K, 2*H*E]
        k, v = kv.view(bsz, -1, 2, self.n_head, self.d_head).permute(2, 0, 3, 1, 4)  # [B, H, K, E] each
        if self.recompute and torch.is_grad_enabled():
            attn = checkpoint(self._core, q, k, v, layer=layer, pos=pos, ctx=ctx, mask_bias=mask_bias,
                              use_reentrant=False)
        else:
            attn = self._core(q, k, v, layer=layer, pos=pos, ctx=ctx, mask_bias=mask_bias)  # [B, H, Q, E]
        out = self.drop(self.o_net(attn.transpose(1, 2).reshape(bsz, qlen, hd)))  # [B, Q, D]
        return (x + out if self.pre_lnorm else self.layer_norm(x + out)), kv

    def _core(self, q: Tensor, k: Tensor, v: Tensor, *, layer: int, pos: PositionalEncoding,
              ctx: PositionContext, mask_bias: Tensor) -> Tensor:
        """Scores (a)-(d), masked softmax and values: ``[B, H, Q, E]`` from ``q [B, H, Q, E]``, ``k, v``."""
        u = pos.content_bias(layer)  # [H, E] or None
        q_u = q if u is None else q + u[:, None, :]  # terms (a) + (c) use q + u
        p = pos.position_scores(layer, q, self.r_net, ctx)  # [B, H, Q, K] or None, terms (b) + (d)
        return attend(q_u, k, v, p, mask_bias, scale=self.scale, dropatt=self.dropatt if self.training else 0.0)


class PositionwiseFF(nn.Module):
    """Position-wise feed-forward block: ``Linear -> ReLU -> Dropout -> Linear -> Dropout`` with residual."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool) -> None:
        super().__init__()
        self.CoreNet = nn.Sequential(
            nn.Linear(d_model, d_inner), nn.ReLU(inplace=True), Dropout(dropout),
            nn.Linear(d_inner, d_model), Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model)
        self.pre_lnorm = pre_lnorm

    def core(self, x: Tensor) -> Tensor:
        """``CoreNet(x)``, with the ReLU and its dropout fused by :func:`relu_dropout`."""
        lin1, _, drop1, lin2, drop2 = self.CoreNet
        return drop2(lin2(relu_dropout(lin1(x), drop1.p, self.training)))

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_lnorm:
            return x + self.core(self.layer_norm(x))
        return self.layer_norm(x + self.core(x))


class DecoderLayer(nn.Module):
    """Attention over ``[memory; segment]`` followed by the feed-forward block."""

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float, pre_lnorm: bool, pos_proj: bool) -> None:
        super().__init__()
        self.dec_attn = MultiHeadAttention(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, pos_proj)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm)

    def forward(self, x: Tensor, mem: Tensor | None, *, layer: int, pos: PositionalEncoding,
                ctx: PositionContext, mask_bias: Tensor, mem_kv: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The layer output ``[B, Q, D]`` and the attention keys/values ``[B, K, 2*H*E]``."""
        out, kv = self.dec_attn(x, mem, layer=layer, pos=pos, ctx=ctx, mask_bias=mask_bias, mem_kv=mem_kv)
        return self.pos_ff(out), kv
