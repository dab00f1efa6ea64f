"""Attention with the relative position term as FlexAttention's ``score_mod``: ``P`` is read unshifted.

The relative encodings' position term is ``P = rel_shift(U)`` (paper Appendix B) with the unshifted scores
``U = x y^T + d``, ``[B, H, Q, K]``, whose column ``r`` is distance ``K-1-r``
(:class:`~transformer_xl.model.positional.PositionScores`). Query ``i`` sits at key position ``M + i``
(``M = K - Q``, the memory length), so its score against key ``j`` is at distance ``M + i - j``, column
``j + Q - 1 - i`` of ``U``: the shift is an index, and :func:`attend_flex` hands FlexAttention
(``torch.nn.attention.flex_attention``)

    score_mod(s, b, h, i, j) = s + scale * U[b, h, i, min(j + Q-1-i, K-1)]      (s = scale * q_i . k_j)
    mask_mod(b, h, i, j)     = mask_bias[i, j] is finite                        (causal, same_length, padding)

The index is clamped for the keys the mask drops (``j > M + i``: past column ``K-1``; those scores are never
used). Compiled, FlexAttention generates one kernel that forms neither the shifted copy of ``U``, nor the ``[Q, K]``
content scores ``q k^T``, nor the probabilities, and skips the blocks the mask empties; ``U`` is the one ``[Q, K]``
tensor formed (and kept for backward, where the kernel accumulates its gradient at the same index).

FlexAttention has no dropout: the path is for ``dropatt == 0``. In torch 2.13 its forward runs on the CPU (eagerly:
unfused, the scores formed, which is what the tests check against the plain formula; or compiled), its backward
only on a GPU. :func:`transformer_xl.model.dispatch.choose` takes it only when it is switched on
(``TransformerXLLM.flex_attention``), with a gradient on CUDA.

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``K`` key length, ``E`` d_head.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from transformer_xl.model.fastpath import allow_graphs
from transformer_xl.model.positional import PositionScores

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def unshifted(p: PositionScores) -> Tensor:
    """``U = x y^T + d``, ``[B, H, Q, K]``, column ``r`` distance ``K-1-r``: the position scores before the shift."""
    u = torch.matmul(p.x, p.y.permute(1, 2, 0))  # [B, H, Q, E] @ [H, E, K] -> [B, H, Q, K]
    return u if p.d is None else u + p.d.t()[None, :, None, :]


def position_score_mod(p: PositionScores | Tensor | None, scale: float, qlen: int) -> ScoreMod | None:
    """The ``score_mod`` adding ``scale * P[b, h, i, j]``: from ``U`` at the shifted index for ``P`` as its factors
    (module docstring), from ``P`` itself when it is given whole ``[B, H, Q, K]``; None without a position term."""
    if p is None:
        return None
    if isinstance(p, Tensor):
        def whole(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score + scale * p[b, h, i, j]

        return whole
    u = unshifted(p)  # [B, H, Q, K]
    last = u.size(-1) - 1

    def shifted(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        column = torch.clamp(j + (qlen - 1) - i, 0, last)  # distance M+i-j; masked keys (j > M+i) clamped
        return score + scale * u[b, h, i, column]

    return shifted


#: The last mask given to :func:`block_mask` and its block mask (a layer's masks are one tensor from the cache of
#: :func:`~transformer_xl.model.fastpath.mask_bias`: every layer of a forward reuses the first one's).
_LAST: list[Any] = []


def block_mask(mask_bias: Tensor, qlen: int, klen: int) -> BlockMask:
    """FlexAttention's block mask of the additive ``mask_bias`` (0 / -inf; ``[Q, K]``, or ``[B, 1, Q, K]`` a mask
    per row): a key is kept where the mask is finite. Reused while the same tensor comes unchanged (eager only)."""
    compiling = torch.compiler.is_compiling()
    if not compiling and _LAST and _LAST[0] is mask_bias and _LAST[1] == mask_bias._version:
        return _LAST[2]
    keep = mask_bias.isfinite()
    if keep.dim() == 2:
        made = create_block_mask(lambda b, h, i, j: keep[i, j], None, None, qlen, klen, device=mask_bias.device)
    else:
        made = create_block_mask(lambda b, h, i, j: keep[b, 0, i, j], keep.size(0), None, qlen, klen,
                                 device=mask_bias.device)
    if not compiling:
        _LAST[:] = [mask_bias, mask_bias._version, made]
    return made


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    """``flex_attention`` compiled (static shapes, a graph per segment shape): eager FlexAttention forms the
    scores, so outside a compiled model the GPU runs it compiled."""
    allow_graphs()
    return torch.compile(flex_attention, dynamic=False)


def supports_head_dim(d_head: int) -> bool:
    """Whether FlexAttention's kernels take heads of ``d_head``: a power of two, at least 16 (the paper's WT103 base
    model's 41, or PTB's 40, are not: such a model keeps the default path with ``flex_attention()`` on)."""
    return d_head >= 16 and d_head & (d_head - 1) == 0


def attend_flex(q: Tensor, k: Tensor, v: Tensor, p: PositionScores | Tensor | None, mask_bias: Tensor, *,
                scale: float) -> Tensor:
    """``softmax(scale * (q k^T + P) + mask_bias) v``, ``[B, H, Q, E]``, by FlexAttention (module docstring):
    ``q [B, H, Q, E]`` (content bias added), ``k, v [B, H, K, E]``, ``P`` as its factors (read unshifted), whole, or
    None, ``mask_bias`` ``[Q, K]`` or ``[B, 1, Q, K]`` (0 / -inf). No dropout. Runs eagerly on the CPU (forward
    only in torch 2.13) and inside a compiled model, compiled elsewhere."""
    qlen, klen = q.size(2), k.size(2)
    q = q.to(k.dtype)  # under autocast q + u is float32 (u a float32 parameter), k and v the autocast type
    score_mod = position_score_mod(p, scale, qlen)
    mask = block_mask(mask_bias, qlen, klen)
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    if q.device.type == "cpu":
        with warnings.catch_warnings():  # eager on the CPU: the unfused reference is what is wanted there
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
