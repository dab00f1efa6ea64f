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



def episode_mask(*, reset: Tensor, valid: Tensor, mem_len: int, window: bool) -> tuple[Tensor, Tensor]:
    """The causal mask with episode boundaries, per row: boolean ``[B, Q, K]`` (True where query ``i`` may NOT attend
    key ``j``) and the keys' episode ids ``[B, K]``.

    ``reset [B, Q]`` is True where a step starts a new episode; ``valid [B, M]`` is True where a memory position
    belongs to the row's running episode. The queries' ids count the resets up to and including each step (0 until
    the first); valid memory positions have id 0, the others -1 (no query's). Query ``i`` sees key ``j`` when
    :func:`causal_mask` allows it and both have the same id, so no step attends across a boundary, inside the
    segment or through the memory. Every query sees at least itself. With ``window`` a query also sees at most the
    ``mem_len`` steps before it (``j >= M + i - mem_len``): what a step sees when steps run one at a time.
    """
    qlen, mlen = reset.size(1), valid.size(1)
    query_episode = reset.long().cumsum(1)  # [B, Q]
    memory_episode = torch.where(valid, 0, -1)  # [B, M]
    key_episode = torch.cat([memory_episode, query_episode], dim=1)  # [B, K]
    masked = causal_mask(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=False, device=reset.device)  # [Q, K]
    if window:
        masked = masked | torch.tril(torch.ones_like(masked), diagonal=mlen - mem_len - 1)  # j < M + i - mem_len
    return masked | (key_episode[:, None, :] != query_episode[:, :, None]), key_episode  # [B, Q, K], [B, K]


# ---------------------------------------------------------------------------------------------- padded rows
def padded_mask_bias(mask_bias: Tensor, key_mask: Tensor, *, mlen: int) -> Tensor:
    """The additive mask ``[B, 1, Q, K]`` of a batch whose rows hold padding: ``mask_bias [Q, K]`` (the causal mask
    of :func:`causal_mask`, as 0 / -inf) with every key that is padding (``key_mask [B, K]`` False) masked as well.

    A query always sees its own key, so that a padding query, whose every key may be padding, keeps a finite
    softmax (its output is never read); a real query never sees a padding key. Relative encodings depend only on
    the distance between a query and its keys, so with the padding masked a real token gets the value it gets in a
    batch of its row alone (up to float rounding).
    """
    qlen = mask_bias.size(0)
    pads = torch.zeros(key_mask.shape, dtype=mask_bias.dtype, device=mask_bias.device)
    pads.masked_fill_(~key_mask, float("-inf"))
    bias = mask_bias[None, None] + pads[:, None, None, :]  # [B, 1, Q, K]
    rows = torch.arange(qlen, device=mask_bias.device)
    bias[:, :, rows, mlen + rows] = 0.0  # the diagonal: query i is key mlen + i
    return bias


def update_padded_mems(hids: list[Tensor], mems: list[Tensor], key_mask: Tensor, *,
                       mem_len: int) -> tuple[list[Tensor], Tensor]:
    """New memories of a batch with padding, and which of their positions are real: ``([B, M', D] per layer,
    [B, M'] bool)`` with ``M' = min(mem_len, K)``.

    Each row keeps its last ``mem_len`` *real* positions of ``[mems; hids]``, in order and right-aligned, the padding
    moved in front of them (and masked by ``key_mask``'s successor): a row padded on the right (a shorter text in a
    batch) remembers its own last tokens, not the padding after them, so the next segment stands at distance 1
    from its last real token, as it does alone (paper Sec. 3.2's memory, per row)."""
    keep = min(mem_len, key_mask.size(1))
    order = torch.argsort(key_mask.to(torch.int8), dim=1, stable=True)[:, -keep:]  # padding first, order kept
    with torch.no_grad():
        new = []
        for m, h in zip(mems, hids):
            both = torch.cat([m, h], dim=1)
            new.append(both.gather(1, order[..., None].expand(-1, -1, both.size(-1))))
    return new, key_mask.gather(1, order)
