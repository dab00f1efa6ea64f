"""The one multi-head attention over ``[memory; segment]`` (paper Sec. 3.2-3.3), and the feed-forward block.

For layer ``n`` (paper, Sec. 3.3 "the computational procedure"):

    h~   = [SG(m^{n-1}) o h^{n-1}]                       keys/values see memory and segment
    q, k, v = h^{n-1} W_q,  h~ W_k,  h~ W_v
    A_ij = (q_i + u)^T k_j + P_ij                        terms (a)+(c), and P = (b)+(d) from the strategy
    a    = Masked-Softmax(A / sqrt(d_head)) v
    o    = LayerNorm(Linear(a) + h^{n-1})                (post-LN; pre-LN: h + Linear(a) on LN input)
    h^n  = LayerNorm(o + FF(o))                          FF = Linear -> ReLU -> Dropout -> Linear -> Dropout

The position strategy (:mod:`transformer_xl.model.positional`) supplies ``u`` and ``P``; the masked softmax with
attention dropout is :func:`transformer_xl.model.blocked.attend` (``P`` whole, or in blocks when it comes as its
factors and no gradient is needed). Parameter names (``qkv_net``, ``r_net``,
``o_net``, ``layer_norm``, ``CoreNet``) are those of the official code.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``M`` memory length, ``K = M + Q``, ``D`` d_model,
``E`` d_head.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_xl.model.blocked import attend
from transformer_xl.model.fastpath import CompactDropout, ReLUDropout, recomputed
from transformer_xl.model.segment import Segment


class MultiHeadAttention(nn.Module):
    """Multi-head attention of layer ``index`` over memory and segment, the position terms from ``seg.pos``."""

    def __init__(self, index: int, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float,
                 pre_lnorm: bool, pos_proj: bool) -> None:
        super().__init__()
        self.index, self.n_head, self.d_head, self.dropatt = index, n_head, d_head, dropatt
        self.scale = 1.0 / math.sqrt(d_head)
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)  # rows: W_q; W_k; W_v
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False) if pos_proj else None  # W_kR
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.drop = CompactDropout(dropout)
        self.pre_lnorm = pre_lnorm
        # TransformerXLLM.recompute: the [Q, K] scores and probabilities are recomputed in backward.
        self.recompute = False

    def _project(self, x: Tensor, rows: slice) -> Tensor:
        """Rows ``rows`` of ``[W_q; W_k; W_v] x``: a slice of the weight, or of the output of an int8 projection
        (:mod:`transformer_xl.model.int8`), which runs whole."""
        if isinstance(self.qkv_net, nn.Linear):
            return F.linear(x, self.qkv_net.weight[rows])
        return self.qkv_net(x)[..., rows]

    def _kv(self, x: Tensor) -> Tensor:
        """``[W_k; W_v] x``: ``[B, T, D] -> [B, T, 2*H*E]``."""
        return self._project(x, slice(self.n_head * self.d_head, None))

    def _q_kv(self, x: Tensor, h: Tensor, prenorm_query: bool) -> tuple[Tensor, Tensor]:
        """Queries ``[B, Q, H*E]`` and keys/values ``[B, Q, 2*H*E]`` of the segment: one ``[W_q; W_k; W_v] x``
        (as the official code), or, for the absolute encodings under pre-LN, queries from ``h``."""
        he = self.n_head * self.d_head
        if prenorm_query or x is h:
            q, kv = self.qkv_net(x).split([he, 2 * he], dim=-1)  # [B, Q, 3*H*E] in two (its backward: one cat)
            return q, kv
        return self._project(h, slice(None, he)), self._kv(x)

    def _memory_kv(self, mem: Tensor) -> Tensor:
        """Keys/values of the memory, projected on their own (they need no gradient, so backward skips them)."""
        return self._kv(self.layer_norm(mem) if self.pre_lnorm else mem)  # [B, M, 2*H*E]

    def forward(self, h: Tensor, mem: Tensor | None, seg: Segment) -> Tensor:
        """``h``: ``[B, Q, D]``; ``mem``: ``[B, M, D]`` or None. Returns ``[B, Q, D]``."""
        bsz, qlen, _ = h.shape
        x = self.layer_norm(h) if self.pre_lnorm else h  # [B, Q, D]
        # Queries only for the segment. Under pre-LN the official absolute-position attention projects
        # queries from the un-normalized input, the relative ones from the normalized one.
        q, kv = self._q_kv(x, h, seg.pos.prenorm_query)  # [B, Q, H*E], [B, Q, 2*H*E]
        q = q.reshape(bsz, qlen, self.n_head, self.d_head).transpose(1, 2)  # [B, H, Q, E]
        # h~ = [SG(m); h]: keys and values of memory and segment [B, H, K, E] (views of the cache's buffers
        # with an inference cache)
        k, v = seg.keys_values(self.index, mem, kv, self.n_head, self._memory_kv)
        a = recomputed(self.recompute, self._attend, q, k, v, seg)  # [B, H, Q, E]
        out = self.o_net(a.transpose(1, 2).reshape(bsz, qlen, -1))  # [B, Q, D]
        if self.training:
            out = self.drop(out)
        return h + out if self.pre_lnorm else self.layer_norm(h + out)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, seg: Segment) -> Tensor:
        """Scores (a)-(d), masked softmax and values: ``[B, H, Q, E]`` from ``q [B, H, Q, E]``, ``k, v``."""
        u = seg.pos.content_bias(self.index)  # [H, E] or None, term (c)
        q_u = q if u is None else q + u[:, None, :]  # terms (a) + (c) use q + u
        p = seg.pos.position_scores(self.index, q, self.r_net, seg)  # [B, H, Q, K], its factors or None: (b) + (d)
        return attend(q_u, k, v, p, seg.mask_bias, scale=self.scale, dropatt=self.dropatt if self.training else 0.0)


class PositionwiseFF(nn.Module):
    """Position-wise feed-forward block: ``Linear -> ReLU -> Dropout -> Linear -> Dropout`` with residual."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool) -> None:
        super().__init__()
        # Official names: CoreNet.0 and CoreNet.3 are the two Linear layers; ReLU and its dropout (1, 2)
        # run as one op that keeps only its output for backward (fastpath.ReLUDropout).
        self.CoreNet = nn.Sequential(
            nn.Linear(d_model, d_inner), ReLUDropout(dropout), nn.Identity(),
            nn.Linear(d_inner, d_model), CompactDropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model)
        self.pre_lnorm = pre_lnorm

    def _core(self, x: Tensor) -> Tensor:
        """``CoreNet(x)``; in eval mode its two linear layers and a ReLU only (the dropouts and the identity are
        no-ops there, and a generation step at batch 1 pays for every module call)."""
        if self.training:
            return self.CoreNet(x)
        core = self.CoreNet
        return core[3](F.relu(core[0](x)))

    def forward(self, h: Tensor) -> Tensor:
        if self.pre_lnorm:
            return h + self._core(self.layer_norm(h))
        return self.layer_norm(h + self._core(h))


class DecoderLayer(nn.Module):
    """Attention over ``[memory; segment]`` followed by the feed-forward block."""

    def __init__(self, index: int, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float, pre_lnorm: bool, pos_proj: bool) -> None:
        super().__init__()
        self.dec_attn = MultiHeadAttention(index, n_head, d_model, d_head, dropout, dropatt, pre_lnorm, pos_proj)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm)

    def forward(self, h: Tensor, mem: Tensor | None, seg: Segment) -> Tensor:
        """The layer output ``[B, Q, D]``."""
        return self.pos_ff(self.dec_attn(h, mem, seg))
