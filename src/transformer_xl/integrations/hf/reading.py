"""How :class:`~transformer_xl.integrations.hf.modeling.TransfoXLForCausalLM` reads a batch: in segments of
``tgt_len`` tokens over the memory of ``mem_len`` positions (paper Sec. 3.2), as ``txl score`` reads a text, with the
padding masked and kept out of the memory.

Rows padded on the left are first turned into rows padded on the right (:func:`left_aligned`): segments are cut
from a row's first position, so a row starting after ``k`` padding positions would otherwise have its segment
boundaries moved by ``k`` and, wherever the memory is cut, see another context than it sees alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_xl.errors import ConfigError
from transformer_xl.integrations.hf.cache import TransfoXLMemory
from transformer_xl.model import TransformerXLLM

#: The label transformers ignores in a loss.
IGNORE_INDEX = -100


@dataclass
class Reading:
    """What a batch read gave: the log-probabilities (None when not formed), the summed NLL of the valid targets
    and their count, and the memory after it."""

    log_probs: Tensor | None
    nll_sum: Tensor
    count: int
    mems: list[Tensor]
    mem_mask: Tensor | None


def targets_of(labels: Tensor, input_ids: Tensor, *, n_token: int, pad_id: int | None) -> Tensor:
    """``[B, T]`` targets from transformers' ``labels`` (the same shape as ``input_ids``): position ``t`` predicts
    ``labels[t + 1]``; the last position and every ``-100`` or padding label predict nothing (``-100``). Any other
    label outside the vocabulary is a one-line :class:`ConfigError`."""
    if labels.shape != input_ids.shape:
        raise ConfigError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got "
                          f"{tuple(labels.shape)}")
    if pad_id is not None:
        labels = labels.masked_fill(labels == pad_id, IGNORE_INDEX)
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= n_token))
    if bool(bad.any()):
        raise ConfigError(f"label {int(labels[bad][0])} is outside the model's vocabulary of {n_token} (and is not "
                          f"{IGNORE_INDEX}, which is ignored)")
    return torch.cat([labels[:, 1:], labels.new_full((labels.size(0), 1), IGNORE_INDEX)], dim=1)


def left_aligned(real: Tensor | None) -> Tensor | None:
    """``[B, T]`` gather indices that move each row's padding from its front to its end, or None when no row has
    padding in front."""
    if real is None:
        return None
    first = real.int().argmax(1)  # 0 for a row without padding in front (or without a real token)
    if not bool((first > 0).any()):
        return None
    return (torch.arange(real.size(1), device=real.device) + first[:, None]) % real.size(1)


def read(txl: TransformerXLLM, ids: Tensor, real: Tensor | None, targets: Tensor | None, memory: TransfoXLMemory,
         *, keep: int, form_log_probs: bool) -> Reading:
    """Read ``ids`` ``[B, T]`` after ``memory`` (not changed) in segments of ``tgt_len``; ``real`` marks the real
    tokens (None: all), ``targets`` the tokens to score (``-100``: none); log-probabilities are formed for the
    positions from ``keep`` on when ``form_log_probs``."""
    bsz, qlen = ids.shape
    lengths = txl.config.lengths()
    mems = memory.mems or []  # a fresh stream: the model's forward starts the memory (tf_memory: zero states)
    padded = real is not None or (memory.mask is not None and not bool(memory.mask.all()))
    mem_mask = memory.key_mask(bsz, ids.device) if padded else None
    log_probs: list[Tensor] = []
    nll_sum, count = torch.zeros((), dtype=torch.float32, device=ids.device), 0
    for beg in range(0, qlen, txl.config.tgt_len):
        part = ids[:, beg:beg + txl.config.tgt_len]
        end = beg + part.size(1)
        key_mask = None
        if padded:
            now = real[:, beg:end] if real is not None else torch.ones_like(part, dtype=torch.bool)
            key_mask = torch.cat([mem_mask, now], dim=1)
        tgt = valid = None
        if targets is not None:  # a padding position predicts nothing
            valid = targets[:, beg:end] != IGNORE_INDEX
            valid = valid if real is None else valid & real[:, beg:end]
            tgt = targets[:, beg:end].masked_fill(~valid, 0)
        out = txl(part, tgt, mems, lengths=lengths, key_mask=key_mask, return_log_probs=form_log_probs and end > keep)
        if out.log_probs is not None:
            log_probs.append(out.log_probs[:, max(0, keep - beg):])
        if valid is not None:
            nll_sum = nll_sum + torch.where(valid, out.nll, 0.0).sum()
            count += int(valid.sum())
        if lengths.mem_len > 0:
            mems, mem_mask = out.mems, (out.mem_mask if padded else None)
    return Reading(torch.cat(log_probs, dim=1) if log_probs else None, nll_sum, count,
                   mems if lengths.mem_len > 0 else [], mem_mask)
