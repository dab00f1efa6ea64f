"""The one multi-head attention over ``[memory; segment]`` (paper Sec. 3.2-3.3), and the feed-forward block.

For layer ``n`` (paper, Sec. 3.3 "the computational procedure"):

    h~   = [SG(m^{n-1}) o h^{n-1}]                       keys/values see memory and segment
    q, k, v = h^{n-1} W_q,  h~ W_k,  h~ W_v
    A_ij = (q_i + u)^T k_j + P_ij                        terms (a)+(c), and P = (b)+(d) from the strategy
    a    = Masked-Softmax(A / sqrt(d_head)) v
    o    = LayerNorm(Linear(a) + h^{n-1})                (post-LN; pre-LN: h + Linear(a) on LN input)
    h^n  = LayerNorm(o + FF(o))                          FF = Linear -> ReLU -> Dropout -> Linear -> Dropout

With the relative encoding of Sec. 3.3 the score is the sum of four terms,

    A_ij = q_i^T k_j  +  q_i^T W_kR R_{i-j}  +  u^T k_j  +  v^T W_kR R_{i-j}
              (a)              (b)              (c)            (d)

so ``P_ij = (q_i + v)^T W_kR R_{i-j}``, computed for all distances and re-aligned by the shift of Appendix B
(:func:`transformer_xl.model.positional.rel_shift`). The position strategy (:mod:`transformer_xl.model.positional`)
supplies ``u`` and ``P``. Each step is called by
what it computes from :mod:`transformer_xl.model.dispatch`, the one module that chooses how it runs (the masked
softmax: :func:`~transformer_xl.model.dispatch.attend`, whose :func:`~transformer_xl.model.dispatch.choose` holds the
decision table). Parameter names (``qkv_net``, ``r_net``, ``o_net``, ``layer_norm``, ``CoreNet``) are those of the
official code.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``M`` memory length, ``K = M + Q``, ``D`` d_model,
``E`` d_head.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from transformer_xl.model.dispatch import apply_linear, attend, feed_forward, project_rows, recompute
from transformer_xl.model.fastpath import CompactDropout, ReLUDropout
from transformer_xl.model.segment import Segment


class MultiHeadAttention(nn.Module):
    """Multi-head attention of layer ``index`` over memory and segment, the position terms from ``seg.pos``."""

    def __init__(self, index: int, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float,
                 pre_lnorm: bool, pos_proj: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.index, self.n_head, self.d_head, self.dropatt = index, n_head, d_head, dropatt
        self.scale = 1.0 / math.sqrt(d_head)
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)  # rows: W_q; W_k; W_v
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False) if pos_proj else None  # W_kR
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.drop = CompactDropout(dropout)
        self.pre_lnorm = pre_lnorm
        # TransformerXLLM.recompute: the [Q, K] scores and probabilities are recomputed in backward.
        self.recompute = False
        # TransformerXLLM.reference: the formulas as written, no fast path.
        self.plain = False
        # TransformerXLLM.flex_attention: FlexAttention may run (training on CUDA without attention dropout).
        self.flex = False

    def _kv(self, x: Tensor) -> Tensor:
        """``[W_k; W_v] x``: ``[B, T, D] -> [B, T, 2*H*E]``."""
        return project_rows(self.qkv_net, x, slice(self.n_head * self.d_head, None))

    def _q_kv(self, x: Tensor, h: Tensor, prenorm_query: bool) -> tuple[Tensor, Tensor]:
        """Queries ``[B, Q, H*E]`` and keys/values ``[B, Q, 2*H*E]`` of the segment: one ``[W_q; W_k; W_v] x``
        (as the official code), or, for the absolute encodings under pre-LN, queries from ``h``."""
        he = self.n_head * self.d_head
        if prenorm_query or x is h:
            q, kv = apply_linear(self.qkv_net, x).split([he, 2 * he], dim=-1)  # [B, Q, 3*H*E] (backward: one cat)
            return q, kv
        return project_rows(self.qkv_net, h, slice(None, he)), self._kv(x)

    def _memory_kv(self, mem: Tensor) -> Tensor:
        """Keys/values of the memory, projected on their own (they need no gradient, so backward skips them)."""
        return self._kv(self.layer_norm(mem) if self.pre_lnorm else mem)  # [B, M, 2*H*E]

    def forward(self, h: Tensor, mem: Tensor | None, seg: Segment) -> Tensor:
        """``h``: ``[B, Q, D]``; ``mem``: ``[B, M, D]`` or None. Returns ``[B, Q, D]``."""
        out = self.branch(h, mem, seg)  # [B, Q, D]
        return h + out if self.pre_lnorm else self.layer_norm(h + out)

    def branch(self, h: Tensor, mem: Tensor | None, seg: Segment) -> Tensor:
        """The residual branch ``Dropout(Linear(a))``, ``[B, Q, D]``, before it is added to ``h`` (under pre-LN its
        input is ``LayerNorm(h)``); :mod:`transformer_xl.model.sequence` combines it with ``h`` by a gate."""
        bsz, qlen, _ = h.shape
        x = self.layer_norm(h) if self.pre_lnorm else h  # [B, Q, D]
        # Queries only for the segment. Under pre-LN the official absolute-position attention projects
        # queries from the un-normalized input, the relative ones from the normalized one.
        q, kv = self._q_kv(x, h, seg.pos.prenorm_query)  # [B, Q, H*E], [B, Q, 2*H*E]
        q = q.reshape(bsz, qlen, self.n_head, self.d_head).transpose(1, 2)  # [B, H, Q, E]
        # h~ = [SG(m); h]: keys and values of memory and segment [B, H, K, E] (views of the cache's buffers
        # with an inference cache)
        k, v = seg.keys_values(self.index, mem, kv, self.n_head, self._memory_kv)
        a = recompute(self.recompute, self._attend, q, k, v, seg)  # [B, H, Q, E]
        out = apply_linear(self.o_net, a.transpose(1, 2).reshape(bsz, qlen, -1))  # [B, Q, D]
        if self.training:
            out = self.drop(out)
        return out

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, seg: Segment) -> Tensor:
        """Scores (a)-(d), masked softmax and values: ``[B, H, Q, E]`` from ``q [B, H, Q, E]``, ``k, v``."""
        u = seg.pos.content_bias(self.index)  # [H, E] or None, term (c)
        q_u = q if u is None else q + u[:, None, :]  # terms (a) + (c) use q + u
        p = seg.pos.position_scores(self.index, q, self.r_net, seg)  # (b) + (d): P [B, H, Q, K] as its factors, or None
        # Dropout(Masked-Softmax((q + u)^T k + P) / sqrt(E)) v
        return attend(q_u, k, v, p, seg.mask_bias, scale=self.scale, dropatt=self.dropatt if self.training else 0.0,
                      plain=self.plain, flex=self.flex)


class PositionwiseFF(nn.Module):
    """Position-wise feed-forward block: ``Linear -> ReLU -> Dropout -> Linear -> Dropout`` with residual."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool, eps: float = 1e-5) -> None:
        super().__init__()
        # Official names: CoreNet.0 and CoreNet.3 are the two Linear layers; ReLU and its dropout (1, 2)
        # run as one op that keeps only its output for backward (fastpath.ReLUDropout, dispatch module table).
        self.CoreNet = nn.Sequential(
            nn.Linear(d_model, d_inner), ReLUDropout(dropout), nn.Identity(),
            nn.Linear(d_inner, d_model), CompactDropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.pre_lnorm = pre_lnorm

    def forward(self, h: Tensor) -> Tensor:
        out = self.branch(h)  # [B, Q, D]
        return h + out if self.pre_lnorm else self.layer_norm(h + out)

    def branch(self, h: Tensor) -> Tensor:
        """The residual branch ``CoreNet(h)`` (of ``LayerNorm(h)`` under pre-LN), before it is added to ``h``."""
        return feed_forward(self.CoreNet, self.layer_norm(h) if self.pre_lnorm else h, self.training)


class DecoderLayer(nn.Module):
    """Attention over ``[memory; segment]`` followed by the feed-forward block."""

    def __init__(self, index: int, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float,
                 dropatt: float, pre_lnorm: bool, pos_proj: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.dec_attn = MultiHeadAttention(index, n_head, d_model, d_head, dropout, dropatt, pre_lnorm, pos_proj,
                                           eps)
        self.pos_ff = PositionwiseFF(d_model, d_inner, dropout, pre_lnorm, eps)

    def forward(self, h: Tensor, mem: Tensor | None, seg: Segment) -> Tensor:
        """The layer output ``[B, Q, D]``."""
        return self.pos_ff(self.dec_attn(h, mem, seg))
