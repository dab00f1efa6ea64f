"""Position-encoding strategies: the one place where ``attn_type`` is read (paper Sec. 3.3, Table 6).

Every strategy feeds the single :class:`transformer_xl.model.attention.MultiHeadAttention`. The attention score of
query ``i`` and key ``j`` (paper Sec. 3.3, terms (a)-(d)) is written

    A_ij = (q_i + u)^T k_j  +  P_ij

and a strategy supplies the global content bias ``u`` (:meth:`content_bias`) and the position term
``P`` (:meth:`position_scores`), or instead adds absolute embeddings to the layer inputs
(:meth:`embed`, :meth:`layer_inputs`):

====  ===========================  =====================================================================
type  strategy                     what it contributes
====  ===========================  =====================================================================
0     :class:`RelativeSinusoid`    ``u = r_w_bias``; ``P_ij = (q_i + v)^T W_kR R_{i-j}`` (terms b + d),
                                   sinusoid ``R``, computed for all distances and re-aligned with the
                                   shift trick of Appendix B
1     :class:`RelativeLearned`     Shaw et al.: ``u = r_w_bias[l]``, ``P_ij = q_i^T E_{i-j} + b_{i-j}``
                                   with learned per-layer ``r_emb``/``r_bias``
2     :class:`AbsoluteSinusoid`    Vaswani et al.: sinusoid added to the word embeddings
3     :class:`AbsoluteLearned`     Al-Rfou et al.: learned absolute embeddings added at every layer
====  ===========================  =====================================================================

Distances follow the official code: position rows are ordered ``klen-1, ..., 1, 0`` and clamped at
``clamp_len``. Parameter names (``r_w_bias``, ``r_r_bias``, ``r_emb``, ``r_bias``) are the official ones.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``M`` memory length, ``K = M + Q`` key length,
``D`` d_model, ``E`` d_head.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_xl.errors import ConfigError
from transformer_xl.model.config import TXLConfig
from transformer_xl.model.fastpath import CompactDropout
from transformer_xl.model.segment import Segment


def rel_shift(x: Tensor) -> Tensor:
    """Re-align scores computed for distances ``K-1..0`` so that ``out[..., i, j]`` uses distance ``M+i-j``.

    ``x[..., i, r]`` holds the score of query ``i`` against relative-position row ``r`` (distance
    ``K-1-r``). The paper's linear-cost trick (Appendix B): pad one zero column in front, read the
    ``[Q, K+1]`` buffer as ``[K+1, Q]``, drop its first row and read the rest as ``[Q, K]``. Entries
    with ``j > M + i`` (future keys) hold unrelated values and must be masked by the caller. The fast paths
    run the same shift as a view (:func:`transformer_xl.model.fastpath.shift_padded`).
    """
    *lead, q, k = x.shape
    padded = F.pad(x, (1, 0))  # [..., Q, K+1]
    return padded.view(*lead, k + 1, q)[..., 1:, :].reshape(*lead, q, k)  # [..., K, Q] read as [..., Q, K]


class PositionScores(NamedTuple):
    """The relative position term ``P = rel_shift(x y^T + d)``, ``[B, H, Q, K]``, as its factors: ``x [B, H, Q, E]``
    a row per query, ``y [K, H, E]`` a key per distance ``K-1, ..., 0``, ``d [K, H]`` a bias per distance or None.
    :meth:`dense` is the paper's formula; :func:`transformer_xl.model.dispatch.attend` forms ``P`` where it is read
    (whole, in blocks, or unshifted for one query)."""

    x: Tensor
    y: Tensor
    d: Tensor | None = None

    def dense(self) -> Tensor:
        """``P`` whole: the scores of every query against every distance, re-aligned by :func:`rel_shift`."""
        scores = torch.einsum("bhqe,khe->bhqk", self.x, self.y)  # [B, H, Q, K], column r: distance K-1-r
        if self.d is not None:
            scores = scores + self.d.t()[None, :, None, :]  # + d_r: [1, H, 1, K]
        return rel_shift(scores)  # [B, H, Q, K], column j: distance M+i-j


def sinusoid(pos_seq: Tensor, inv_freq: Tensor) -> Tensor:
    """``[len(pos_seq), D]`` embedding ``[sin(p * f), cos(p * f)]`` (Vaswani et al.), as the official code."""
    angles = torch.outer(pos_seq, inv_freq)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class PositionalEncoding(nn.Module):
    """Base strategy: contributes nothing. Subclasses override the hooks they need."""

    #: Whether the attention layer needs a ``W_kR`` projection (``r_net``) of the position table.
    needs_r_net: bool = False
    #: Whether queries are projected from the pre-LayerNorm'ed input (see ``MultiHeadAttention``).
    prenorm_query: bool = True
    #: True when :meth:`layer_inputs` returns the memory unchanged, so that the keys/values projected
    #: from a memory position do not depend on where it sits (they can be cached between segments).
    memory_position_free: bool = True

    def __init__(self, cfg: TXLConfig) -> None:
        super().__init__()
        self.n_layer, self.n_head, self.d_head = cfg.n_layer, cfg.n_head, cfg.d_head

    def table(self, klen: int, clamp_len: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """The position table ``[K, D]`` the layers share (:attr:`Segment.table`), or None."""
        return None

    def embed(self, word_emb: Tensor, seg: Segment) -> Tensor:
        """Input of the first layer before dropout, ``[B, Q, D]``."""
        return word_emb

    def layer_inputs(self, layer: int, h: Tensor, mem: Tensor | None, seg: Segment) -> tuple[Tensor, Tensor | None]:
        """Layer ``layer``'s input and memory with any absolute embedding added (new tensors)."""
        return h, mem

    def content_bias(self, layer: int) -> Tensor | None:
        """Global content bias ``u`` of term (c), ``[H, E]``, or None."""
        return None

    def position_scores(self, layer: int, q: Tensor, r_net: nn.Module | None,
                        seg: Segment) -> PositionScores | None:
        """Position term ``P`` of the score (unscaled) as its factors (:class:`PositionScores`), or None."""
        return None


class _SinusoidTable(PositionalEncoding):
    def __init__(self, cfg: TXLConfig) -> None:
        super().__init__(cfg)
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, cfg.d_model, 2.0) / cfg.d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def sinusoid_rows(self, klen: int, clamp_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """Sinusoid rows ``[K, D]`` for distances ``K-1, ..., 0`` (clamped at ``clamp_len`` when > 0)."""
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=device, dtype=self.inv_freq.dtype)
        if clamp_len > 0:
            pos_seq = pos_seq.clamp(max=clamp_len)
        return sinusoid(pos_seq, self.inv_freq.to(device)).to(dtype)

    def table(self, klen: int, clamp_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        return self.sinusoid_rows(klen, clamp_len, dtype, device)  # [K, D]


class RelativeSinusoid(_SinusoidTable):
    """attn_type 0, Transformer-XL (paper Sec. 3.3): terms (b)+(d) with ``W_kR R`` and biases ``u``, ``v``."""

    needs_r_net = True

    def __init__(self, cfg: TXLConfig) -> None:
        super().__init__(cfg)
        shape = (cfg.n_layer, cfg.n_head, cfg.d_head) if cfg.untie_r else (cfg.n_head, cfg.d_head)
        self.untie_r = cfg.untie_r
        self.r_w_bias = nn.Parameter(torch.zeros(shape))  # u, term (c)
        self.r_r_bias = nn.Parameter(torch.zeros(shape))  # v, term (d)
        self.drop = CompactDropout(cfg.dropout)  # the official code applies dropout to R

    def table(self, klen: int, clamp_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        return self.drop(super().table(klen, clamp_len, dtype, device))

    def content_bias(self, layer: int) -> Tensor:
        return self.r_w_bias[layer] if self.untie_r else self.r_w_bias

    def position_scores(self, layer: int, q: Tensor, r_net: nn.Module | None, seg: Segment) -> PositionScores:
        assert r_net is not None
        v = self.r_r_bias[layer] if self.untie_r else self.r_r_bias  # [H, E]
        n_head, d_head = q.size(1), q.size(3)

        def rows(n: int) -> Tensor:
            return self.sinusoid_rows(n, seg.lengths.clamp_len, seg.dtype, seg.device)

        r_k = seg.position_keys(layer, r_net, rows).view(seg.klen, n_head, d_head)  # W_kR R: [K, H, E]
        return PositionScores(q + v[:, None, :], r_k)  # P = rel_shift((q + v) (W_kR R)^T): terms (b) + (d)


class RelativeLearned(PositionalEncoding):
    """attn_type 1, Shaw et al. (2018): learned per-layer relative embeddings ``r_emb`` and biases ``r_bias``."""

    def __init__(self, cfg: TXLConfig) -> None:
        super().__init__(cfg)
        self.r_emb = nn.Parameter(torch.zeros(cfg.n_layer, cfg.max_klen, cfg.n_head, cfg.d_head))
        self.r_w_bias = nn.Parameter(torch.zeros(cfg.n_layer, cfg.n_head, cfg.d_head))
        self.r_bias = nn.Parameter(torch.zeros(cfg.n_layer, cfg.max_klen, cfg.n_head))

    def content_bias(self, layer: int) -> Tensor:
        return self.r_w_bias[layer]

    def position_scores(self, layer: int, q: Tensor, r_net: nn.Module | None, seg: Segment) -> PositionScores:
        r_emb, r_bias = self.r_emb[layer], self.r_bias[layer]  # [R, H, E], [R, H]
        clamp_len, klen = seg.lengths.clamp_len, seg.klen
        if clamp_len > 0:
            r_emb, r_bias = r_emb[-clamp_len:], r_bias[-clamp_len:]
        if klen > r_emb.size(0):  # distances beyond the table reuse its farthest row (official)
            pad = klen - r_emb.size(0)
            r_emb = torch.cat([r_emb[:1].expand(pad, -1, -1), r_emb], 0)
            r_bias = torch.cat([r_bias[:1].expand(pad, -1), r_bias], 0)
        else:
            r_emb, r_bias = r_emb[-klen:], r_bias[-klen:]
        return PositionScores(q, r_emb, r_bias)  # P = rel_shift(q E^T + b): [B, H, Q, K]


class AbsoluteSinusoid(_SinusoidTable):
    """attn_type 2, Vaswani et al.: the sinusoid is added to the input (and, as officially, to the memory).

    As in the official code, the segment's tokens take positions ``Q-1..0`` of the table and the
    first layer's memory gets positions ``K-1..Q`` added on top of what it already holds.
    """

    prenorm_query = False
    memory_position_free = False  # absolute embeddings of its positions are added to the memory

    def embed(self, word_emb: Tensor, seg: Segment) -> Tensor:
        assert seg.table is not None
        return word_emb + seg.table[-seg.qlen:]

    def layer_inputs(self, layer: int, h: Tensor, mem: Tensor | None, seg: Segment) -> tuple[Tensor, Tensor | None]:
        if layer == 0 and mem is not None and seg.mlen > 0:
            assert seg.table is not None
            mem = mem + seg.table[: seg.mlen]
        return h, mem


class AbsoluteLearned(PositionalEncoding):
    """attn_type 3, Al-Rfou et al. (2018): learned absolute embeddings ``r_emb`` added before every layer.

    The table has ``max_klen`` rows, right-aligned: the segment uses the last ``Q`` rows and the memory
    the ``M`` rows before them (the farthest row repeated where the table is too short), as officially.
    """

    prenorm_query = False
    memory_position_free = False  # absolute embeddings of its positions are added to the memory

    def __init__(self, cfg: TXLConfig) -> None:
        super().__init__(cfg)
        self.r_emb = nn.Parameter(torch.zeros(cfg.n_layer, cfg.max_klen, cfg.n_head, cfg.d_head))

    def layer_inputs(self, layer: int, h: Tensor, mem: Tensor | None, seg: Segment) -> tuple[Tensor, Tensor | None]:
        table = self.r_emb[layer].flatten(1)  # [R, H*E] = [R, D]
        qlen, mlen = seg.qlen, seg.mlen
        if qlen > table.size(0) or (mlen > 0 and qlen >= table.size(0)):
            raise ConfigError(f"attn_type 3 learned {table.size(0)} positions (tgt_len+ext_len+mem_len at "
                              f"construction); a segment of {qlen} tokens with {mlen} memory does not fit")
        if mem is not None and mlen > 0:
            cur = table[:-qlen]
            if cur.size(0) < mlen:
                cur = torch.cat([cur[:1].expand(mlen - cur.size(0), -1), cur], 0)
            else:
                cur = cur[-mlen:]
            mem = mem + cur
        return h + table[-qlen:], mem


def build_positional(cfg: TXLConfig) -> PositionalEncoding:
    """The strategy for ``cfg.attn_type`` (the only place ``attn_type`` is read)."""
    strategies = {0: RelativeSinusoid, 1: RelativeLearned, 2: AbsoluteSinusoid, 3: AbsoluteLearned}
    if cfg.attn_type not in strategies:
        raise ConfigError(f"unknown attn_type {cfg.attn_type}")
    return strategies[cfg.attn_type](cfg)
