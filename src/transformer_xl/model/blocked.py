"""Evaluation attention over a long memory in blocks, and the relative position term kept as its factors.

The relative encodings' position term is a shifted product (paper Appendix B,
:class:`transformer_xl.model.positional.PositionScores`):

    P = shift(X Y^T + d)        X: a row per query, [H, B*Q, E]; Y: the position keys, zero row in front,
                                [H, E, K+1]; d: a bias per distance, [H, K+1] (Shaw et al.) or none

:class:`ShiftedScores` holds ``X``, ``Y`` and ``d`` in the layout the fast paths read. :func:`attend_blocked` forms
``P`` block by block over the batch, each block written next to the causal mask by one ``baddbmm`` and read back at
once by the fused ``scaled_dot_product_attention``; :meth:`ShiftedScores.dense` forms it whole. Which runs is
decided by :func:`transformer_xl.model.dispatch.choose`. Formed whole, ``P`` is 56 MB per layer at the ``char``
case's ``mem_len`` 1,600 (``B`` 8, ``H`` 8, ``Q`` 128): above glibc's 32 MiB ``mmap`` threshold, so every
allocation of it is fresh pages that fault in, and the product writes it to DRAM for the attention to read back;
that is where evaluation lost its utilisation at long memories (``docs/performance.md``). A block is a few MB: it
comes from the heap, stays in cache between its product and the attention, and the mask costs no pass of its own.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``K`` key length, ``E`` d_head.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_xl.model.fastpath import l2_bytes_of_core, shift_padded, zero_row_in_front

#: Bytes of ``P`` formed at once by :func:`attend_blocked` (a block of whole batch rows, or of heads of one) with one
#: CPU thread: the core's L2 (:func:`one_thread_block_bytes`), at least this. Measured with ``char`` at ``mem_len``
#: 1,600, one thread, CPU time (``benchmarks/blocked_eval_ab.py``): on an AMD EPYC with 1 MiB of L2 a core, 1 MiB
#: blocks ran 1.3x faster than 8 MiB ones and 1.9x faster than ``P`` whole; on an AMX Xeon with 2 MiB, 2 MiB blocks
#: ran 8 % faster than 1 MiB ones (4 MiB: 14 %; 16 MiB no better than 1 MiB), and held to AVX2 kernels 5 % (8 %).
BLOCK_BYTES_ONE_THREAD = 1 << 20
#: ... with several threads: every operation on a block is a parallel region whose barrier waits for the slowest
#: thread, so blocks are larger than one core's L2: on the quiet 2-core EPYC (2 threads, ``char``, mem 1,600,
#: ``benchmarks/blocked_eval_ab.py``, two runs) 2 and 4 MiB blocks ran 1.66-2.04x ``P`` whole, 16 MiB 1.44-1.61x;
#: beside other processes 1-2 MiB blocks fell below ``P`` whole (a descheduled thread costs each barrier a time
#: slice). 4 MiB keeps both the barriers few and each block far under glibc's ``mmap`` threshold (32 MiB).
BLOCK_BYTES_THREADS = 4 << 20


def one_thread_block_bytes(l2_bytes: int | None = None) -> int:
    """The block of one thread: the core's L2 (``l2_bytes``, default
    :func:`~transformer_xl.model.fastpath.l2_bytes_of_core`) between :data:`BLOCK_BYTES_ONE_THREAD` and
    :data:`BLOCK_BYTES_THREADS` (an unknown L2, 0: the former)."""
    l2 = l2_bytes_of_core() if l2_bytes is None else l2_bytes
    return min(max(BLOCK_BYTES_ONE_THREAD, l2), BLOCK_BYTES_THREADS)


class ShiftedScores(NamedTuple):
    """``P = shift(x y^T + d)``, ``[B, H, Q, K]``, kept as its factors (module docstring)."""

    x: Tensor  # [H, B*Q, E]: a row per query, head-major
    y: Tensor  # [H, E, K+1]: position keys for distances K..0, the first (distance K) a zero row
    bsz: int
    d: Tensor | None = None  # [H, K+1]: a bias per distance (zero first), or None

    @classmethod
    def of(cls, x: Tensor, y: Tensor, d: Tensor | None = None) -> ShiftedScores:
        """The factors of ``P = rel_shift(x y^T + d)`` (:class:`transformer_xl.model.positional.PositionScores`:
        ``x [B, H, Q, E]``, ``y [K, H, E]``, ``d [K, H]``) in this layout: ``x`` head-major, a zero row in front of
        ``y`` and ``d`` (their products then carry the column the shift pads, :func:`shift_padded`)."""
        bsz, n_head, qlen, d_head = x.shape
        x_rows = x.transpose(0, 1).reshape(n_head, bsz * qlen, d_head)  # [H, B*Q, E]
        y_keys = zero_row_in_front(y).permute(1, 2, 0)  # [H, E, K+1]
        return cls(x_rows, y_keys, bsz, None if d is None else zero_row_in_front(d).t())  # d: [H, K+1]

    def dense(self) -> Tensor:
        """``P`` whole, ``[B, H, Q, K]``: one matmul per head over the ``B*Q`` rows (a ``[B, H]``-batched one
        would expand ``y`` over ``B``), the shift as a view (head-major in memory)."""
        n_head, rows, _ = self.x.shape
        padded = torch.bmm(self.x, self.y).view(n_head, self.bsz, rows // self.bsz, -1)  # [H, B, Q, K+1]
        if self.d is not None:
            padded = padded + self.d[:, None, None, :]
        return shift_padded(padded).transpose(0, 1)  # [B, H, Q, K]


def padded_mask(mask_bias: Tensor, rows: int) -> Tensor:
    """The mask in the layout of the shift's input: ``[Q, K] -> [rows * Q, K+1]`` (``rows`` copies), such that
    ``shift_padded(t + padded)`` is ``shift_padded(t) + mask_bias`` for any ``[..., Q, K+1]`` blocks ``t``
    (the shift reads the flat ``[Q, K+1]`` block from element ``Q`` on; the first ``Q`` are never read)."""
    qlen, klen = mask_bias.shape
    one = torch.cat([mask_bias.new_zeros(qlen), mask_bias.reshape(-1)]).view(qlen, klen + 1)  # [Q, K+1]
    return one.repeat(rows, 1)  # [rows*Q, K+1]


def attend_blocked(q: Tensor, k: Tensor, v: Tensor, p: ShiftedScores, mask_bias: Tensor, *, scale: float,
                   block_bytes: int) -> Tensor:
    """``softmax(scale (q k^T + P) + mask_bias) v``, ``[B, H, Q, E]``, without a gradient or dropout, ``P`` made
    a block of at most ``block_bytes`` at a time (:func:`block_bytes`): whole batch rows, or heads of one row when a
    row is larger.

    Per block: ``bias = padded_mask + scale x y^T`` (one ``baddbmm``; Shaw's ``d`` added in place), shifted as a
    view, is the additive mask of ``scaled_dot_product_attention``, whose CPU kernel goes over the keys in
    tiles with an online softmax and never forms the probabilities.
    """
    bsz, n_head, qlen, _ = q.shape
    klen = k.size(2)
    row_bytes = qlen * (klen + 1) * q.element_size()  # one [Q, K+1] block of one head
    rows = max(1, min(bsz, block_bytes // (n_head * row_bytes)))  # batch rows per block
    heads = n_head if rows > 1 or n_head * row_bytes <= block_bytes else max(1, block_bytes // row_bytes)
    mask = padded_mask(mask_bias, rows)  # [rows*Q, K+1]
    out = q.new_empty(bsz, n_head, qlen, v.size(3))  # [B, H, Q, E]
    for b0 in range(0, bsz, rows):
        b1 = min(bsz, b0 + rows)
        x = p.x[:, b0 * qlen:b1 * qlen]  # [H, b*Q, E]
        for h0 in range(0, n_head, heads):
            h1 = min(n_head, h0 + heads)
            bias = torch.baddbmm(mask[:(b1 - b0) * qlen], x[h0:h1], p.y[h0:h1], alpha=scale)  # [h, b*Q, K+1]
            bias = bias.view(h1 - h0, b1 - b0, qlen, klen + 1)  # [h, b, Q, K+1]
            if p.d is not None:
                bias.add_(p.d[h0:h1, None, None, :], alpha=scale)
            bias = shift_padded(bias).transpose(0, 1).to(q.dtype)  # [b, h, Q, K]
            out[b0:b1, h0:h1] = F.scaled_dot_product_attention(q[b0:b1, h0:h1], k[b0:b1, h0:h1], v[b0:b1, h0:h1],
                                                               attn_mask=bias, scale=scale)
    return out
