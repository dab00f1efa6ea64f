"""The score of every prompt token after the tokens before it, and its most likely alternatives, read segment by
segment: what a completion with ``echo`` and ``logprobs`` returns for its prompt (``txl serve``).

The prompt is read as :func:`transformer_xl.inference.generate.advance` reads it (segments of ``tgt_len`` carrying
the memories, paper Sec. 3.2), so the scores are those the whole table of log-probabilities would give. Of each
segment's table (``L x V`` floats) only the log-probability of each next id and the ``top`` best ids and values
are kept; the table is dropped before the next segment is read. The memory a prompt of ``T`` tokens needs is the
model's, one segment's table (``tgt_len x V x 4`` bytes, about twice that while an adaptive softmax assembles it),
and ``T x (1 + top)`` numbers: never the ``T x V`` table (8.8 GB for 8,192 tokens of WikiText-103's 267,735 words).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_xl.inference.generate import advance
from transformer_xl.model import TransformerXLLM


@dataclass
class ScoredPrompt:
    """A prompt read with its scores (see the module docstring)."""

    log_probs: list[float | None]  # of each id after the ids before it (natural log); None for the first
    top: list[list[tuple[int, float]] | None]  # the most likely ids there and their log-probabilities; None first
    next_log_probs: Tensor  # [V] after the last id (its own storage: no view of a larger table)
    mems: list[Tensor]  # the memories after the last id


def score_prompt(model: TransformerXLLM, ids: Sequence[int], *, before: Sequence[int] = (), top: int = 0,
                 mems: list[Tensor] | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                 prompt_chunk: int | None = None) -> ScoredPrompt:
    """Read ``before`` (ids chosen but not yet read, e.g. a session's last token) and then ``ids`` after ``mems``;
    score every id of ``ids`` but the first, and keep the ``top`` most likely ids of each of those positions
    (``top`` 0: empty lists). Lengths as :func:`~transformer_xl.inference.generate.advance`."""
    text = [*before, *ids]
    skip = len(before)  # position t predicts text[t + 1]; the scored positions are skip .. len(text) - 2
    log_probs: list[float | None] = [None]
    best: list[list[tuple[int, float]] | None] = [None]

    def keep(start: int, table: Tensor) -> None:  # table [1, L, V]: positions start .. start + L - 1
        lo, hi = max(start, skip), min(start + table.size(1), len(text) - 1)
        if lo >= hi:
            return
        rows = table[0, lo - start:hi - start]  # [n, V]
        following = torch.tensor(text[lo + 1:hi + 1], device=rows.device)
        log_probs.extend(rows.gather(1, following[:, None])[:, 0].tolist())
        if top:
            values, where = rows.topk(min(top, rows.size(1)), dim=1)  # [n, k] each, most likely first
            best.extend(list(zip(i, v)) for i, v in zip(where.tolist(), values.tolist()))
        else:
            best.extend([] for _ in range(hi - lo))

    last, new_mems = advance(model, [text], mems=mems, mem_len=mem_len, clamp_len=clamp_len,
                             prompt_chunk=prompt_chunk, each_segment=keep)
    return ScoredPrompt(log_probs, best, last[0], new_mems)
