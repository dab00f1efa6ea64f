"""Incremental generation against from-scratch recomputation, continuation, seeded sampling, argument checks."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.helpers import generation_model
from transformer_xl import ConfigError, TransformerXLLM
from transformer_xl.inference.generate import choose_next, generate, reference_generate, stream

V = 40


def _model(seed: int = 0, **overrides) -> TransformerXLLM:
    return generation_model(seed, train=True, n_token=V, **overrides)


def _prompt(b: int = 2, p: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, p), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("overrides", [
    {},
    {"attn_type": 1},
    {"cutoffs": [10, 25], "div_val": 2, "tie_projs": [False, True, True]},
    {"pre_lnorm": True, "untie_r": True, "clamp_len": 3},
])
def test_greedy_matches_full_recompute_when_memory_covers_everything(overrides) -> None:
    """mem_len >= total length: every position sees its whole past, so one plain forward over the
    whole context per step (no memory) is the exact reference."""
    model = _model(**overrides)
    ids, n = _prompt(p=8), 20
    out = generate(model, ids, max_new_tokens=n, mem_len=ids.size(1) + n)
    ref_ids, ref_lp = reference_generate(model, ids, n, mode="full", mem_len=ids.size(1) + n)
    assert torch.equal(out.new_tokens, ref_ids)
    assert (out.log_probs - ref_lp).abs().max() <= 1e-5
    assert torch.equal(out.sequences[:, :ids.size(1)], ids)
    # sampling with the same seed draws the same tokens: a varied sequence, not a greedy attractor
    kw = dict(do_sample=True, temperature=1.5, seed=5, mem_len=ids.size(1) + n)
    out = generate(model, ids, max_new_tokens=n, **kw)
    ref_ids, ref_lp = reference_generate(model, ids, n, mode="full", **kw)
    assert torch.equal(out.new_tokens, ref_ids) and len(set(ref_ids[0].tolist())) > 5
    assert (out.log_probs - ref_lp).abs().max() <= 1e-5


@pytest.mark.parametrize("overrides", [{}, {"attn_type": 1}, {"attn_type": 2}, {"attn_type": 3},
                                       {"same_length": True}])
def test_greedy_matches_replay_with_short_memory(overrides) -> None:
    """mem_len much shorter than the text: the reference replays the whole history from empty memories
    with the same segmentation at every step, so each position attends to the same keys."""
    model = _model(**overrides)
    ids, n = _prompt(p=8), 12
    out = generate(model, ids, max_new_tokens=n, mem_len=4)
    ref_ids, ref_lp = reference_generate(model, ids, n, mode="replay", mem_len=4)
    assert torch.equal(out.new_tokens, ref_ids)
    assert (out.log_probs - ref_lp).abs().max() <= 1e-5
    kw = dict(do_sample=True, temperature=1.5, seed=5, mem_len=4)
    out = generate(model, ids, max_new_tokens=n, **kw)
    ref_ids, ref_lp = reference_generate(model, ids, n, mode="replay", **kw)
    assert torch.equal(out.new_tokens, ref_ids) and len(set(ref_ids[0].tolist())) > 5
    assert (out.log_probs - ref_lp).abs().max() <= 1e-5
    if model.config.attn_type in (0, 1):  # absolute positions: a full forward is not the same model
        _, full_lp = reference_generate(model, ids, n, mode="full", **{**kw, "mem_len": 100})
        assert (full_lp - ref_lp).abs().max() > 1e-3  # the short memory really limits what is seen


def test_continue_from_returned_memories_equals_one_run() -> None:
    model = _model()
    ids = _prompt()
    whole = generate(model, ids, max_new_tokens=20, mem_len=8)
    first = generate(model, ids, max_new_tokens=10, mem_len=8)
    second = generate(model, first.sequences[:, -1:], max_new_tokens=10, mem_len=8, mems=first.mems)
    assert torch.equal(torch.cat([first.new_tokens, second.new_tokens], 1), whole.new_tokens)
    assert torch.allclose(torch.cat([first.log_probs, second.log_probs], 1), whole.log_probs, atol=1e-5)


def test_stream_from_memories_matches_replay_and_restores_the_model() -> None:
    """stream continuing from memories of a context == the from-scratch replay of context + prompt (an oracle
    that shares neither the memories nor the incremental loop), token by token with the same seeded draws."""
    model = _model()
    model.train()
    context, prompt = _prompt(p=10), _prompt(p=3, seed=4)  # the context fills two segments of tgt_len 5
    mems = [m.clone() for m in generate(model, context, max_new_tokens=1).mems]  # memories of the context only
    saved = [m.clone() for m in mems]
    steps = list(stream(model, prompt, max_new_tokens=6, mems=mems, do_sample=True, temperature=1.5, seed=3))
    ref_ids, ref_lp = reference_generate(model, torch.cat([context, prompt], 1), 6, mode="replay", do_sample=True,
                                         temperature=1.5, seed=3)
    assert torch.equal(torch.stack([s.tokens for s in steps], 1), ref_ids) and len(set(ref_ids[0].tolist())) > 2
    assert (torch.stack([s.log_probs for s in steps], 1) - ref_lp).abs().max() <= 1e-5
    assert [s.index for s in steps] == list(range(6))
    assert all(torch.equal(a, b) for a, b in zip(mems, saved))  # input memories untouched
    assert model.training and model.config.mem_len == 6 and model.config.ext_len == 0
    assert steps[-1].mems[0].shape == (2, 6, 32)


def test_sampling_is_seeded_and_filters_reduce_to_greedy() -> None:
    model = _model()
    ids = _prompt()
    greedy = generate(model, ids, max_new_tokens=10).new_tokens
    a = generate(model, ids, max_new_tokens=10, do_sample=True, seed=7).new_tokens
    b = generate(model, ids, max_new_tokens=10, do_sample=True, seed=7).new_tokens
    assert torch.equal(a, b)
    for kw in ({"top_k": 1}, {"top_p": 1e-6}, {"temperature": 0.0}, {"temperature": 1e-4}):
        assert torch.equal(generate(model, ids, max_new_tokens=10, do_sample=True, seed=1, **kw).new_tokens,
                           greedy), kw
    g = torch.Generator().manual_seed(0)
    draws = {int(choose_next(torch.tensor([[0.0, -1.0, -9.0, -9.0]]).log_softmax(-1), do_sample=True,
                             generator=g)) for _ in range(200)}
    assert draws >= {0, 1}


def test_stop_tokens_finish_rows_and_pad() -> None:
    model = _model()
    ids = _prompt()
    free = generate(model, ids, max_new_tokens=15).new_tokens
    stop_id = int(free[0, 3])
    out = generate(model, ids, max_new_tokens=15, stop_token_ids=[stop_id], pad_token_id=0)
    row = out.new_tokens[0].tolist()
    k = row.index(stop_id)
    assert row[:k + 1] == free[0, :k + 1].tolist() and set(row[k + 1:]) <= {0}
    assert out.finished[0] and (out.log_probs[0, k + 1:] == 0).all()
    one = generate(model, ids[:1], max_new_tokens=15, stop_token_ids=[stop_id])
    assert one.new_tokens.size(1) == k + 1  # a batch whose rows all stopped ends early


def test_bad_inputs() -> None:
    model = _model()
    with pytest.raises(ConfigError, match="empty"):
        generate(model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ConfigError, match="lie in"):
        generate(model, [[1, V]])
    with pytest.raises(ConfigError, match="mem_len 0"):
        generate(_model(mem_len=0), [1, 2])
    assert generate(model, [1, 2, 3], max_new_tokens=0).sequences.tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("kwargs, match", [
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"mem_len": 0}, "mem_len"),
    ({"stop_token_ids": [V]}, "stop_token_ids"),
])
def test_bad_arguments_are_one_line_config_errors(kwargs, match) -> None:
    model = _model()
    with pytest.raises(ConfigError, match=match):
        generate(model, _prompt(), **kwargs)


def test_interleaved_generations_do_not_disturb_each_other_or_the_caller() -> None:
    """Between two steps the model is back in the caller's mode with gradients on: two streams over one model
    (one greedy, one sampled) give what each gives alone, and a model in training mode stays in it."""
    model = _model()
    model.train()
    ids = _prompt()
    alone_a = generate(model, ids, max_new_tokens=6).sequences
    alone_b = generate(model, ids[:, :5], max_new_tokens=6, do_sample=True, seed=3).sequences
    a = stream(model, ids, max_new_tokens=6)
    b = stream(model, ids[:, :5], max_new_tokens=6, do_sample=True, seed=3)
    first_a = next(a).tokens
    assert torch.is_grad_enabled() and model.training
    toks_b = [s.tokens for s in b]
    toks_a = [first_a] + [s.tokens for s in a]
    assert torch.equal(torch.stack(toks_a, 1), alone_a[:, ids.size(1):])
    assert torch.equal(torch.stack(toks_b, 1), alone_b[:, 5:])
    assert torch.is_grad_enabled() and model.training


def test_advance_is_the_step_of_generation() -> None:
    from transformer_xl.inference.generate import advance

    model = generation_model()
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    log_probs, mems = advance(model, prompt)
    out = generate(model, prompt, max_new_tokens=2)
    assert int(log_probs.argmax()) == int(out.new_tokens[0, 0])
    step, _ = advance(model, out.new_tokens[:, :1], mems=mems)  # one token over the memories
    assert int(step.argmax()) == int(out.new_tokens[0, 1])
    assert float(step[0, out.new_tokens[0, 1]]) == pytest.approx(float(out.log_probs[0, 1]), abs=1e-5)
    every, _ = advance(model, prompt, every_position=True)
    assert every.shape == (1, 7, model.config.n_token)
    torch.testing.assert_close(every[:, -1], log_probs)
    with pytest.raises(ConfigError, match="mems must be"):
        advance(model, prompt, mems=mems[:1])


def test_penalties_apply_to_greedy_generation() -> None:
    model = generation_model()
    prompt = torch.tensor([[3, 1, 4, 1]])
    plain = generate(model, prompt, max_new_tokens=20).new_tokens[0].tolist()
    assert len(set(itertools.pairwise(plain))) < len(plain) - 1  # this model repeats bigrams
    no_rep = generate(model, prompt, max_new_tokens=20, no_repeat_ngram_size=2).sequences[0].tolist()
    assert len(set(itertools.pairwise(no_rep))) == len(no_rep) - 1  # no bigram twice, prompt included
    penalized = generate(model, prompt, max_new_tokens=20, repetition_penalty=50.0).new_tokens[0].tolist()
    assert len(set(penalized)) > len(set(plain))
