"""Choosing the next token: greedy, temperature, top-k, top-p; impossible settings refused."""

from __future__ import annotations

import pytest
import torch

from transformer_xl import ConfigError
from transformer_xl.inference.sampling import Penalties, check_sampling, choose_next, filter_logits, penalize


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


def test_min_p_keeps_ids_at_least_min_p_times_the_most_likely() -> None:
    log_probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert filter_logits(log_probs, min_p=0.3).isfinite()[0].tolist() == [True, True, True, False]
    assert filter_logits(log_probs, min_p=0.61).isfinite()[0].tolist() == [True, False, False, False]
    assert filter_logits(log_probs, min_p=0.0).isfinite().all()
    gen = torch.Generator().manual_seed(0)
    draws = {int(choose_next(log_probs, do_sample=True, min_p=0.5, generator=gen)) for _ in range(200)}
    assert draws == {0, 1}  # 0.15 / 0.5 < 0.5: only the two most likely are ever drawn


def test_repetition_penalty_scales_the_log_probabilities_of_seen_ids() -> None:
    log_probs = torch.tensor([[0.4, 0.35, 0.25]]).log()
    out = penalize(log_probs, [[0, 0]], Penalties(repetition_penalty=2.0))
    assert out[0, 0] == pytest.approx(2 * float(log_probs[0, 0])) and torch.equal(out[0, 1:], log_probs[0, 1:])
    assert int(choose_next(out, do_sample=False)) == 1  # the seen id lost its lead
    assert penalize(log_probs, [[0]], Penalties()) is log_probs  # off: untouched
    softer = penalize(log_probs, [[0]], Penalties(repetition_penalty=0.5))
    assert softer[0, 0] > log_probs[0, 0]  # below 1: favoured


def test_no_repeat_ngram_forbids_exactly_the_completions_of_a_seen_ngram() -> None:
    log_probs = torch.zeros(2, 6)
    history = [[1, 2, 3, 1, 2], [4, 4]]
    out = penalize(log_probs, history, Penalties(no_repeat_ngram_size=3))
    assert out[0].isinf().tolist() == [False, False, False, True, False, False]  # 1 2 3 was seen: 3 is forbidden
    assert not out[1].isinf().any()  # too short for a trigram
    bigram = penalize(log_probs, history, Penalties(no_repeat_ngram_size=2))
    assert bigram[0].isinf().nonzero()[:, 0].tolist() == [3] and bigram[1].isinf().nonzero()[:, 0].tolist() == [4]
    unigram = penalize(log_probs, history, Penalties(no_repeat_ngram_size=1))
    assert unigram[0].isinf().nonzero()[:, 0].tolist() == [1, 2, 3]


@pytest.mark.parametrize("kw, match", [({"repetition_penalty": 0.0}, "repetition_penalty"),
                                       ({"repetition_penalty": float("inf")}, "repetition_penalty"),
                                       ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size")])
def test_impossible_penalties_are_refused(kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        Penalties(**kw)
    with pytest.raises(ConfigError, match="min_p"):
        check_sampling(max_new_tokens=1, temperature=1.0, top_k=0, top_p=1.0, min_p=1.5)
