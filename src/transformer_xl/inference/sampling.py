"""Choosing the next token: greedy, or a draw after temperature, top-k and nucleus (top-p) filtering."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer_xl.errors import ConfigError, check_int


def check_sampling(*, max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    """Raise a one-line :class:`ConfigError` for impossible decoding settings."""
    check_int("max_new_tokens", max_new_tokens, 0)
    check_int("top_k", top_k, 0)
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")


# ---------------------------------------------------------------------------------------------- sampling
def filter_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set to ``-inf`` what top-k and then nucleus (top-p) filtering remove; ``logits`` is ``[B, V]``.

    Top-p keeps the smallest set of most likely ids whose probability reaches ``top_p`` (at least one).
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
    return logits


def choose_next(log_probs: Tensor, *, do_sample: bool, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Next ids ``[B]`` from log-probabilities ``[B, V]``: argmax, or a draw after temperature/top-k/top-p."""
    if not do_sample or temperature == 0:
        return log_probs.argmax(dim=-1)
    logits = filter_logits(log_probs.float() / temperature, top_k=top_k, top_p=top_p)
    probs = torch.softmax(logits, dim=-1)
    if generator is not None and generator.device != probs.device:
        probs_cpu = probs.cpu()
        return torch.multinomial(probs_cpu, 1, generator=generator)[:, 0].to(probs.device)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
