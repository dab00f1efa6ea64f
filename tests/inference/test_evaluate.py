"""Evaluation with memory: the official eval.py scoring (every token once, streams in order), memory sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers import TINY
from tests.helpers import eval_model as _model
from tests.helpers import token_data as _data
from transformer_xl.errors import ConfigError
from transformer_xl.inference.evaluate import evaluate, memory_sweep

V = TINY["n_token"]


def _official_loop(model, data, batch_size, tgt_len, mem_len):
    """The official eval.py loop, written out: seq_len * loss.mean() summed, over sum(seq_len)."""
    n_step = len(data) // batch_size
    streams = torch.tensor(data[: n_step * batch_size]).view(batch_size, n_step)
    lengths = model.config.lengths(mem_len=mem_len)
    total, total_len, mems, i = 0.0, 0, None, 0
    with torch.no_grad():
        while i < n_step - 1:
            seq_len = min(tgt_len, n_step - 1 - i)
            out = model(streams[:, i : i + seq_len], streams[:, i + 1 : i + 1 + seq_len], mems, lengths=lengths)
            mems = out.mems
            total += seq_len * out.loss.item()
            total_len += seq_len
            i += seq_len
    return total / total_len


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_evaluate_matches_the_official_loop_and_counts_scored_tokens(batch_size) -> None:
    model, data = _model(), _data()
    res = evaluate(model, data, batch_size=batch_size, tgt_len=7, mem_len=5, return_nll=True)
    ref = _official_loop(_model(), data, batch_size, 7, 5)
    assert res.loss == pytest.approx(ref, rel=1e-6)
    n_step = len(data) // batch_size
    assert res.tokens == (n_step - 1) * batch_size
    assert res.unscored == len(data) - res.tokens
    # the tokens not scored: the first of every stream and the tail
    not_scored = set(np.nonzero(np.isnan(res.nll))[0].tolist())
    assert not_scored == {b * n_step for b in range(batch_size)} | set(range(n_step * batch_size, len(data)))
    assert np.nanmean(res.nll) == pytest.approx(res.loss, rel=1e-9)
    if batch_size == 1:
        assert not_scored == {0}


def test_per_token_nll_is_in_corpus_order() -> None:
    """Recurrence b of a batched evaluation scores what a batch-1 evaluation of that stream alone scores."""
    model, data = _model(), _data(120)
    res = evaluate(model, data, batch_size=4, tgt_len=6, mem_len=6, return_nll=True)
    n_step = 30
    for b in range(4):
        alone = evaluate(model, data[b * n_step : (b + 1) * n_step], batch_size=1, tgt_len=6, mem_len=6,
                         return_nll=True)
        np.testing.assert_allclose(res.nll[b * n_step + 1 : (b + 1) * n_step], alone.nll[1:], rtol=1e-5)


def test_evaluate_leaves_the_model_as_it_was() -> None:
    """Lengths are arguments: the model's config is the same object afterwards, and its train mode is back."""
    model = _model()
    model.train()
    before = model.config
    out = evaluate(model, _data(), batch_size=2, tgt_len=5, mem_len=20, clamp_len=4, same_length=True)
    assert model.config is before and model.training
    assert (out.settings["mem_len"], out.settings["clamp_len"], out.settings["same_length"]) == (20, 4, True)


def test_char_level_reports_bits_per_character() -> None:
    res = evaluate(_model(), _data(), batch_size=2, char_level=True)
    assert res.bpc == pytest.approx(res.loss / math.log(2))
    assert "bpc" in res.to_dict() and res.to_dict()["tokens"] == res.tokens


def test_memory_sweep_turns_same_length_off_without_memory() -> None:
    res = memory_sweep(_model(), _data(), [0, 4, 16], batch_size=2, tgt_len=4, same_length=True)
    assert [r.settings["mem_len"] for r in res] == [0, 4, 16]
    assert [r.settings["same_length"] for r in res] == [False, True, True]


def test_evaluate_sentence_streams_scores_every_predicted_token() -> None:
    """With sentence offsets (One Billion Word) the loss is the mean NLL over every target of the complete
    batches of the unshuffled sentence iterator, memory carried; ``max_tokens`` keeps whole sentences."""
    from transformer_xl.data import LMShuffledIterator

    model = _model()
    rng = np.random.default_rng(3)
    lengths = rng.integers(3, 12, 40)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    data = rng.integers(0, V, int(offsets[-1]))
    res = evaluate(model, data, batch_size=3, tgt_len=5, offsets=offsets)
    total, count, mems = 0.0, 0, None
    with torch.no_grad():
        for batch in LMShuffledIterator(data, offsets, 3, 5):
            out = model(batch.input_ids, batch.targets, mems)
            mems, total, count = out.mems, total + out.nll.double().sum().item(), count + out.nll.numel()
    assert res.tokens == count > 0 and res.settings["method"] == "memory-sentences"
    # float rounding only: the evaluation projects the memory once (inference cache), the loop again per segment
    assert math.isclose(res.loss, total / count, rel_tol=1e-6)
    cut = evaluate(model, data, batch_size=3, tgt_len=5, offsets=offsets, max_tokens=int(offsets[20]) - 1)
    assert 0 < cut.tokens < res.tokens
    with pytest.raises(ConfigError, match="return_nll"):
        evaluate(model, data, batch_size=3, offsets=offsets, return_nll=True)


def test_memory_sweep_turns_the_models_own_same_length_off_without_memory() -> None:
    model = _model(same_length=True)
    res = memory_sweep(model, _data(), [0, 8], batch_size=2, tgt_len=4)
    assert [r.settings["same_length"] for r in res] == [False, True]


@pytest.mark.parametrize("mode", ["lines", "off"])
def test_evaluate_reports_segments_as_lines_on_stderr(mode: str, monkeypatch, capsys) -> None:
    from transformer_xl.data import progress as P

    real = P.Progress

    def quick(*args, **kwargs):  # no waiting: a line every 10 % from the start
        return real(*args, **{**kwargs, "min_seconds": 0.0})

    monkeypatch.setattr(P, "Progress", quick)
    model = _model()
    data = np.random.default_rng(0).integers(0, model.config.n_token, 401)
    result = evaluate(model, data, batch_size=1, tgt_len=4, mem_len=4, progress=mode)
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    if mode == "off":
        assert lines == []
        return
    assert len(lines) == 10 and lines[-1].startswith("eval segment 100/100 (100%) | ")
    assert lines[0].startswith("eval segment 10/100 (10%) | ") and " tok/s | ETA " in lines[0]
    assert result.tokens == 400


def test_tf_memory_evaluates_the_same_with_and_without_the_inference_cache() -> None:
    """The TF code's zero first memory and same_length window through evaluate's cache of the memory's keys/values:
    the losses equal the plain forward's; and they differ from the PyTorch conventions' on the same weights."""
    from tests.helpers import tiny_model
    from transformer_xl.inference.evaluate import evaluate

    model = tiny_model(0, tf_memory=True, same_length=True, mem_len=6, tgt_len=4, clamp_len=5)
    data = torch.randint(0, model.config.n_token, (90,), generator=torch.Generator().manual_seed(0)).numpy()
    cached = evaluate(model, data, batch_size=2, inference_cache=True, return_nll=True)
    plain = evaluate(model, data, batch_size=2, inference_cache=False, return_nll=True)
    assert np.allclose(cached.nll, plain.nll, atol=1e-5, equal_nan=True)
    pytorch_like = tiny_model(0, same_length=True, mem_len=6, tgt_len=4, clamp_len=5)
    assert abs(evaluate(pytorch_like, data, batch_size=2).loss - plain.loss) > 1e-4
