"""Evaluation with memory: every token of a split scored once, in nats (ppl = exp, bpc = / ln 2)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch

from txl.model import TransformerXLLM

_LENGTHS = ("tgt_len", "ext_len", "mem_len", "clamp_len", "same_length")


@torch.no_grad()
def evaluate(model: TransformerXLLM, data: np.ndarray, *, batch_size: int, tgt_len: int, mem_len: int | None = None,
             ext_len: int | None = None, clamp_len: int | None = None, same_length: bool | None = None,
             max_tokens: int | None = None, device: Any = None, offsets: np.ndarray | None = None,
             autocast: Any = None) -> dict[str, float]:
    """Mean NLL (nats) over ``data`` with each token scored once and memory carried; lengths are restored."""
    from txl.data import LMOrderedIterator, LMShuffledIterator

    saved = {k: getattr(model.config, k) for k in _LENGTHS}
    new = dict(tgt_len=tgt_len, mem_len=mem_len, ext_len=ext_len, clamp_len=clamp_len, same_length=same_length)
    model.reset_length(**{k: v for k, v in new.items() if v is not None})
    ext = model.config.ext_len
    if max_tokens is not None:
        data = data[: max_tokens + 1]
    if offsets is not None:  # sentence streams (One Billion Word)
        it: Any = LMShuffledIterator(data, offsets, batch_size, tgt_len, ext, device=device)
    else:
        it = LMOrderedIterator(data, min(batch_size, max(1, (len(data) - 1) // 2)), tgt_len, ext, device=device)
    was_training = model.training
    model.eval()
    total, count, mems = 0.0, 0, None
    try:
        for batch in it:
            with autocast or contextlib.nullcontext():
                out = model(batch.input_ids, batch.targets, mems)
            mems = out.mems
            total += out.nll.double().sum().item()
            count += out.nll.numel()
    finally:
        model.train(was_training)
        model.reset_length(**saved)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "bpc": loss / math.log(2), "tokens": count}
