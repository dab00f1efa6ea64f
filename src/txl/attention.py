"""The one multi-head attention over ``[memory; segment]`` (paper Sec. 3.2-3.3), and the feed-forward block.

For layer ``n`` (paper, Sec. 3.3 "the computational procedure"):

    h~   = [SG(m^{n-1}) o h^{n-1}]                       keys/values see memory and segment
    q, k, v = h^{n-1} W_q,  h~ W_k,  h~ W_v
    A_ij = (q_i + u)^T k_j + P_ij                        P from the position strategy
    a    = Masked-Softmax(A / sqrt(d_head)) v
    o    = LayerNorm(Linear(a) + h^{n-1})                (post-LN; pre-LN: h + Linear(a) on LN input)

The position strategy (:mod:`txl.positional`) supplies ``u`` and ``P``; masking and (optionally)
attention dropout happen inside ``torch.nn.functional.scaled_dot_product_attention`` with ``P`` and the
causal mask passed as one additive bias. Parameter names (``qkv_net``, ``r_net``, ``o_net``,
``layer_norm``, ``CoreNet``) are those of the official code.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``M`` memory length, ``K = M + Q``, ``D`` d_model,
``E`` d_head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from txl.positional import PositionalEncoding, PositionContext


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
        self.drop = nn.Dropout(dropout)
        self.pre_lnorm = pre_lnorm

    def forward(self, x: Tensor, mem: Tensor | None, *, layer: int, pos: PositionalEncoding,
                ctx: PositionContext, mask_bias: Tensor) -> Tensor:
        """``x``: ``[B, Q, D]``; ``mem``: ``[B, M, D]`` or None; ``mask_bias``: ``[Q, K]`` (0 / -inf)."""
        bsz, qlen, _ = x.shape
        cat = x if mem is None or mem.size(1) == 0 else torch.cat([mem, x], dim=1)  # [B, K, D]
        cat_in = self.layer_norm(cat) if self.pre_lnorm else cat
        hd = self.n_head * self.d_head
        w_q, w_kv = self.qkv_net.weight[:hd], self.qkv_net.weight[hd:]
        # Queries only for the segment. Under pre-LN the official absolute-position attention projects
        # queries from the un-normalized input; the relative ones from the normalized one.
        q_in = cat_in[:, -qlen:] if pos.prenorm_query else x
        q = F.linear(q_in, w_q).view(bsz, qlen, self.n_head, self.d_head).transpose(1, 2)  # [B, H, Q, E]
        k, v = F.linear(cat_in, w_kv).view(bsz, -1, 2, self.n_head, self.d_head).permute(2, 0, 3, 1, 4)
        # k, v: [B, H, K, E]
        bias = mask_bias  # [Q, K]
        p = pos.position_scores(layer, q, self.r_net, ctx)  # [B, H, Q, K] or None
        if p is not None:
            bias = p * self.scale + bias
        u = pos.content_bias(layer)  # [H, E] or None
        q_u = q if u is None else q + u[:, None, :]
        attn = F.scaled_dot_product_attention(
            q_u, k, v, attn_mask=bias.to(q.dtype), dropout_p=self.dropatt if self.training else 0.0,
            scale=self.scale,
        )  # [B, H, Q, E]
        out = self.drop(self.o_net(attn.transpose(1, 2).reshape(bsz, qlen, hd)))  # [B, Q, D]
        return x + out if self.pre_lnorm else self.layer_norm(x + out)


class PositionwiseFF(nn.Module):
    """Position-wise feed-forward block: ``Linear -> ReLU -> Dropout -> Linear -> Dropout`` with residual."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool) -> None:
        super().__init__()
        self.CoreNet = nn.Sequential(
            nn.Linear(d_model, d_inner), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(d_inner, d_model), nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model)
        self.pre_lnorm = pre_lnorm

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_lnorm:
            return x + self.CoreNet(self.layer_norm(x))
        return self.layer_norm(x + self.CoreNet(x))


class DecoderLayer(nn.Module):
    """Attention over ``[memory; segment]`` followed by the feed-forward block."""

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float, pre_lnorm: bool, pos_proj: bool) -> None:
        super().__init__()
        self.dec_attn = MultiHeadAttention(n_head, d_model, d_head, dropout, dropatt, pre_lnorm, pos_proj)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm)

    def forward(self, x: Tensor, mem: Tensor | None, *, layer: int, pos: PositionalEncoding,
                ctx: PositionContext, mask_bias: Tensor) -> Tensor:
        return self.pos_ff(self.dec_attn(x, mem, layer=layer, pos=pos, ctx=ctx, mask_bias=mask_bias))
