"""Segment-level recurrence: memory update and attention masks (paper Sec. 3.2).

The hidden states of the previous segment, ``m^{n-1}_tau = SG(h^{n-1}_{tau-1})``, are cached per layer
and prepended to the keys/values of the current segment (paper Eq. in Sec. 3.2:
``h~ = [SG(m) o h]``). Memories are *functional state*: they come in as an argument and leave as new,
detached tensors; the inputs are never modified.

Shapes are batch-first: a memory is ``[B, M, D]``; masks are ``[Q, K]`` with ``K = M + Q``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def kept_range(*, mlen: int, qlen: int, mem_len: int, ext_len: int) -> tuple[int, int]:
    """Positions ``[beg, end)`` of ``[memory; segment]`` that become the next memory (see :func:`update_mems`)."""
    end = mlen + max(0, qlen - ext_len)
    return max(0, end - mem_len), end


def update_mems(
    hids: list[Tensor], mems: list[Tensor], *, mlen: int, qlen: int, mem_len: int, ext_len: int
) -> list[Tensor]:
    """New memories from the cached inputs ``mems`` and this segment's hidden states ``hids``.

    Keeps positions ``[end - mem_len, end)`` of ``[mems; hids]`` with ``end = mlen + max(0, qlen - ext_len)``:
    the last ``ext_len`` positions of the segment are left out because the next segment re-reads them
    as its extended context. This is the computation the official ``_update_mems`` documents; note the
    official call site swaps ``qlen``/``mlen`` (``_update_mems(hids, mems, mlen, qlen)`` against the
    signature ``(hids, mems, qlen, mlen)``), which only matters when ``ext_len > 0`` and ``mlen < ext_len``
    (the first segment). We follow the documented intent, as Hugging Face's port does.
    """
    beg, end = kept_range(mlen=mlen, qlen=qlen, mem_len=mem_len, ext_len=ext_len)
    with torch.no_grad():  # copy only the kept positions: [mems[beg:]; hids[:end - mlen]]
        return [torch.cat([m[:, beg:], h[:, max(0, beg - mlen):end - mlen]], dim=1) for m, h in zip(mems, hids)]


def causal_mask(*, qlen: int, mlen: int, mem_len: int, same_length: bool, device: torch.device) -> Tensor:
    """Boolean ``[Q, K]`` mask, True where query ``i`` may NOT attend to key ``j``.

    Query ``i`` sits at key position ``mlen + i`` and sees keys ``j <= mlen + i``. With ``same_length``
    every query sees the same number of keys (``mem_len``, itself included) once that much context
    exists, exactly as the official mask:
    ``triu(ones, 1 + mlen) + tril(ones, -shift)`` with ``shift = qlen - (klen - mem_len)`` when
    ``klen > mem_len`` and ``shift = qlen`` otherwise.
    """
    klen = mlen + qlen
    ones = torch.ones(qlen, klen, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + mlen)
    if same_length:
        mask_len = klen - mem_len
        shift = qlen - mask_len if mask_len > 0 else qlen
        mask = mask | torch.tril(ones, diagonal=-shift)
    return mask


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``0`` where attention is allowed, ``-inf`` where it is masked (for ``scaled_dot_product_attention``)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))

