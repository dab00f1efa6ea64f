"""Recurrence: the memories (and the inference cache) carried over the segments of one rec, lengths as arguments."""

from __future__ import annotations

import pytest
import torch

from transformer_xl.model import Recurrence, eval_mode


def _segments(n: int = 4, qlen: int = 4, n_token: int = 50) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, n_token, (2, qlen), generator=gen) for _ in range(n)]


def test_stream_equals_carrying_the_memories_by_hand(tiny_model) -> None:
    model = tiny_model()
    lengths = model.config.lengths(mem_len=10, same_length=True)
    rec = Recurrence(model, lengths)
    mems = None
    with torch.no_grad():
        for x in _segments():
            ref = model(x, x, mems, lengths=lengths)
            mems = ref.mems
            out = rec(x, x)
            torch.testing.assert_close(out.nll, ref.nll, rtol=1e-5, atol=1e-6)
    assert rec.mems[0].size(1) == 10 and model.config.mem_len == 6  # the model itself is not changed


def test_the_cache_changes_nothing_but_the_work(tiny_model) -> None:
    model = tiny_model()
    cached, plain = Recurrence(model), Recurrence(model, inference_cache=False)
    assert plain.cache is None
    with torch.no_grad():
        for x in _segments():
            torch.testing.assert_close(cached(x, x).nll, plain(x, x).nll, rtol=1e-5, atol=1e-6)
    assert cached.cache is not None and cached.cache._k  # the keys/values were kept


def test_with_a_gradient_the_cache_stays_out(tiny_model) -> None:
    model = tiny_model(train=True)
    rec = Recurrence(model)
    for x in _segments(2):
        rec(x, x).loss.backward()  # an InferenceCache would refuse a gradient: the stream does not pass it
    assert rec.mems[0].size(1) == 6 and rec.cache._k == []


def test_reset_starts_the_text_over(tiny_model) -> None:
    model = tiny_model()
    rec = Recurrence(model)
    x = _segments(1)[0]
    with torch.no_grad():
        first = rec(x, x).nll
        rec(x, x)
        rec.reset()
        assert rec.mems == []
        torch.testing.assert_close(rec(x, x).nll, first)


def test_eval_mode_restores_the_mode_even_on_error(tiny_model) -> None:
    model = tiny_model(train=True)
    with eval_mode(model):
        assert not model.training
    assert model.training
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError("boom")
    assert model.training
