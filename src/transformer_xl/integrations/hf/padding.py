"""Which tokens of a padded batch are real: ``attention_mask`` checked against what a Transformer-XL memory allows.

A row may be padded on the right (a shorter sentence in a batch: its tokens come first) and, while its memory holds
no real token yet, on the left (batched ``generate``'s prompts). Padding *between* real tokens is refused: relative
positions count every position, so a token after a gap would stand farther from the tokens before it than it
does alone. Padding ids (the tokenizer's ``<pad>``, one past the vocabulary) are read as id 0 by the embedding;
they are masked wherever ``attention_mask`` marks them, and otherwise (rows ``generate`` has finished and fills
with padding) only their own row, already complete, sees them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_xl.errors import ConfigError
from transformer_xl.integrations.hf.cache import TransfoXLMemory


def real_tokens(input_ids: Tensor, attention_mask: Tensor | None, memory: TransfoXLMemory, *, n_token: int,
                pad_id: int | None) -> tuple[Tensor, Tensor | None]:
    """``(ids the model reads, [B, T] bool real tokens or None when every token is real)``; a one-line
    :class:`ConfigError` (a ValueError) for ids out of the vocabulary or a mask the memory cannot honour."""
    bsz, qlen = input_ids.shape
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.size(0) != bsz
                                       or attention_mask.size(1) < qlen):
        raise ConfigError(f"attention_mask must be [batch={bsz}, length>={qlen}] (the tokens read so far and "
                         f"these), got {tuple(attention_mask.shape)}")
    real = None if attention_mask is None else attention_mask[:, -qlen:].to(device=input_ids.device).bool()
    ids = input_ids if pad_id is None else input_ids.masked_fill(input_ids == pad_id, 0)
    outside = (ids < 0) | (ids >= n_token)
    if bool((outside if real is None else outside & real).any()):
        bad = input_ids[outside if real is None else outside & real]
        raise ConfigError(f"token id {int(bad[0])} is outside the model's vocabulary of {n_token}")
    ids = ids.masked_fill(outside, 0)  # masked padding of another id
    if real is None or bool(real.all()):
        return ids, None
    count = real.sum(1)
    first = real.int().argmax(1)
    last = qlen - 1 - real.flip(1).int().argmax(1)
    gaps = (count > 0) & (last - first + 1 != count)
    if bool(gaps.any()):
        raise ConfigError(f"row {int(gaps.nonzero()[0])} of attention_mask has padding between real tokens: pad on "
                         "the left or on the right only")
    remembered = _remembers(memory, bsz, ids.device)
    front = (count > 0) & (first > 0) & remembered
    if bool(front.any()):
        raise ConfigError(f"row {int(front.nonzero()[0])} is padded on the left after text in its memory: left "
                         "padding is for the first segment of a text (pad on the right to continue one)")
    return ids, real


def _remembers(memory: TransfoXLMemory, bsz: int, device: torch.device) -> Tensor:
    """``[B]``: whether each row's memory holds a real token."""
    if memory.memory_length == 0:
        return torch.zeros(bsz, dtype=torch.bool, device=device)
    return memory.key_mask(bsz, device).any(1)
