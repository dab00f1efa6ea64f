"""Choosing the next token: greedy, or a draw after temperature, top-k, nucleus (top-p) and min-p filtering; and
the penalties against repetitive text that change the log-probabilities before either.

* ``repetition_penalty`` (Keskar et al. 2019, "CTRL", as applied to log-probabilities, which are all <= 0):
  the log-probability of every id already in the text is multiplied by it (> 1: those ids become less likely).
* ``no_repeat_ngram_size`` N: an id that would complete an N-gram the text already holds is forbidden.
* ``min_p`` (Nguyen et al. 2024): a draw keeps only the ids whose probability is at least ``min_p`` times the
  most likely one's (after temperature).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_xl.errors import ConfigError, check_int


@dataclass(frozen=True)
class Penalties:
    """Penalties against repetition (see the module docstring); the defaults change nothing."""

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    def __post_init__(self) -> None:
        rp = self.repetition_penalty
        if not isinstance(rp, (int, float)) or isinstance(rp, bool) or not math.isfinite(rp) or rp <= 0:
            raise ConfigError(f"repetition_penalty must be a finite number > 0 (1 = off), got {rp!r}")
        check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, 0)

    @property
    def active(self) -> bool:
        """Whether they change anything."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0


def check_sampling(*, max_new_tokens: int, temperature: float, top_k: int, top_p: float, min_p: float = 0.0) -> None:
    """Raise a one-line :class:`ConfigError` for impossible decoding settings."""
    check_int("max_new_tokens", max_new_tokens, 0)
    check_int("top_k", top_k, 0)
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
    if not isinstance(min_p, (int, float)) or not 0.0 <= min_p <= 1.0:
        raise ConfigError(f"min_p must be in [0, 1] (0 = off), got {min_p!r}")


def penalize(log_probs: Tensor, history: Sequence[Sequence[int]] | Tensor, penalties: Penalties) -> Tensor:
    """``log_probs`` ``[B, V]`` with the penalties applied for the text ``history`` of every row (a new tensor;
    ``log_probs`` itself when they are off)."""
    if not penalties.active:
        return log_probs
    rows = history.tolist() if isinstance(history, Tensor) else [list(h) for h in history]
    out = log_probs.clone()
    if penalties.repetition_penalty != 1.0:
        for b, ids in enumerate(rows):
            if ids:
                seen = torch.tensor(sorted(set(ids)), device=out.device)
                out[b, seen] = out[b, seen] * penalties.repetition_penalty
    n = penalties.no_repeat_ngram_size
    if n > 0:
        for b, ids in enumerate(rows):
            banned = _ngram_completions(ids, n)
            if banned:
                out[b, torch.tensor(sorted(banned), device=out.device)] = float("-inf")
    return out


def _ngram_completions(ids: list[int], n: int) -> set[int]:
    """The ids that would make the last ``n - 1`` ids of ``ids`` plus themselves an ``n``-gram seen before."""
    if len(ids) < n:
        return set()
    prefix = tuple(ids[len(ids) - n + 1:]) if n > 1 else ()
    return {ids[i + n - 1] for i in range(len(ids) - n + 1) if tuple(ids[i:i + n - 1]) == prefix}


# ---------------------------------------------------------------------------------------------- sampling
def filter_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Tensor:
    """Set to ``-inf`` what top-k, nucleus (top-p) and then min-p filtering remove; ``logits`` is ``[B, V]``.

    Top-p keeps the smallest set of most likely ids whose probability reaches ``top_p`` (at least one); min-p
    keeps the ids at least ``min_p`` times as likely as the most likely one.
    """
    if 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more likely ids
        remove_sorted = before >= top_p
        remove_sorted[:, 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    if min_p > 0.0:
        log_probs = torch.log_softmax(logits, dim=-1)  # [B, V]
        floor = log_probs.max(dim=-1, keepdim=True).values + math.log(min_p)  # [B, 1]
        logits = logits.masked_fill(log_probs < floor, float("-inf"))
    return logits


def choose_next(log_probs: Tensor, *, do_sample: bool, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, min_p: float = 0.0, generator: torch.Generator | None = None) -> Tensor:
    """Next ids ``[B]`` from log-probabilities ``[B, V]``: argmax, or a draw after temperature/top-k/top-p/min-p."""
    if not do_sample or temperature == 0:
        return log_probs.argmax(dim=-1)
    logits = filter_logits(log_probs.float() / temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    probs = torch.softmax(logits, dim=-1)
    if generator is not None and generator.device != probs.device:
        probs_cpu = probs.cpu()
        return torch.multinomial(probs_cpu, 1, generator=generator)[:, 0].to(probs.device)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
