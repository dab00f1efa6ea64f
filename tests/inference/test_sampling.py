"""Choosing the next token: greedy, temperature, top-k, top-p; impossible settings refused."""

from __future__ import annotations

import pytest
import torch

from transformer_xl import ConfigError
from transformer_xl.inference.sampling import check_sampling, choose_next, filter_logits


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]]).log_softmax(-1)
    kept = filter_logits(logits, top_k=2).isfinite()[0].tolist()
    assert kept == [False, True, True, False]
    p = logits.exp()[0]  # 0.09, 0.67, 0.24, 0.03
    kept = filter_logits(logits, top_p=float(p[1]) + 0.01).isfinite()[0].tolist()
    assert kept == [False, True, True, False]
    kept = filter_logits(logits, top_p=float(p[1]) - 0.01).isfinite()[0].tolist()
    assert kept == [False, True, False, False]




def test_choose_next_is_greedy_without_sampling_and_seeded_with() -> None:
    log_probs = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]).log()
    assert choose_next(log_probs, do_sample=False).tolist() == [1, 0]
    assert choose_next(log_probs, do_sample=True, temperature=0).tolist() == [1, 0]
    draws = [choose_next(log_probs, do_sample=True, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    again = [choose_next(log_probs, do_sample=True, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(draws, again))
    counts = torch.bincount(torch.cat([choose_next(log_probs[:1].expand(4000, -1), do_sample=True,
                                                   generator=torch.Generator().manual_seed(0))]), minlength=3)
    assert abs(counts[1].item() / 4000 - 0.6) < 0.03  # draws follow the distribution
    top1 = choose_next(log_probs, do_sample=True, top_k=1, generator=torch.Generator().manual_seed(3))
    assert top1.tolist() == [1, 0]  # top-k 1 is greedy


@pytest.mark.parametrize("kwargs, match", [
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"temperature": float("nan")}, "temperature"), ({"top_k": 1.5}, "top_k"),
])
def test_check_sampling_refuses_impossible_settings(kwargs, match) -> None:
    settings = {"max_new_tokens": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0, **kwargs}
    with pytest.raises(ConfigError, match=match):
        check_sampling(**settings)
