"""Prompt scores read segment by segment: the numbers of the whole table, without ever holding it."""

from __future__ import annotations

import weakref

import pytest
import torch

from tests.helpers import generation_model
from transformer_xl import ConfigError
from transformer_xl.inference.generate import advance
from transformer_xl.inference.prompt_scores import score_prompt

V = 40


@pytest.fixture(scope="module")
def model():
    return generation_model(n_token=V, mem_len=8)  # tgt_len 5


def _whole_table(model, text: list[int], mems=None) -> torch.Tensor:
    """``[T, V]``: every position's log-probabilities, read at once (the reference)."""
    return advance(model, [text], mems=mems, every_position=True)[0][0]


@pytest.mark.parametrize("before", [[], [7], [7, 8, 9, 10, 11, 12]])  # none, a session's pending id, a segment
def test_scores_and_top_ids_are_those_of_the_whole_table(model, before) -> None:
    ids = [(5 * i + 3) % V for i in range(17)]  # 17 + len(before) positions: several segments of 5
    context = advance(model, [[1, 2, 3, 4]])[1]  # a session's memory
    table = _whole_table(model, [*before, *ids], mems=context)
    out = score_prompt(model, ids, before=before, top=3, mems=context)
    rows = table[len(before):-1]  # position t predicts the id at t + 1
    assert out.log_probs[0] is None and out.top[0] is None and len(out.log_probs) == len(out.top) == len(ids)
    assert out.log_probs[1:] == pytest.approx(rows.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist(), abs=1e-6)
    values, where = rows.topk(3, dim=1)
    assert [[i for i, _ in t] for t in out.top[1:]] == where.tolist()
    torch.testing.assert_close(torch.tensor([[v for _, v in t] for t in out.top[1:]]), values)
    torch.testing.assert_close(out.next_log_probs, table[-1])
    assert out.next_log_probs.untyped_storage().nbytes() == V * 4  # its own storage, no view of a larger table
    reference = advance(model, [[*before, *ids]], mems=context)[1]
    assert all(torch.equal(a, b) for a, b in zip(out.mems, reference))


def test_no_top_ids_asked_for_and_a_one_token_prompt(model) -> None:
    out = score_prompt(model, [3, 1, 4], top=0)
    assert out.top == [None, [], []] and out.log_probs[0] is None and len(out.log_probs) == 3
    one = score_prompt(model, [3], top=2)
    assert (one.log_probs, one.top) == ([None], [None])
    torch.testing.assert_close(one.next_log_probs, advance(model, [3])[0][0])
    wide = score_prompt(model, [3, 1], top=V + 5)  # more than the vocabulary: all of it
    assert len(wide.top[1]) == V


def test_one_segment_table_at_a_time(model, monkeypatch) -> None:
    """Every table the model makes is gone before the next is made, and none covers more than a segment."""
    made: list[weakref.ref] = []
    alive_at_call: list[int] = []
    log_prob = model.log_prob

    def watched(hidden: torch.Tensor) -> torch.Tensor:
        alive_at_call.append(sum(r() is not None for r in made))
        out = log_prob(hidden)
        assert out.shape[:-1].numel() <= model.config.tgt_len
        made.append(weakref.ref(out))
        return out

    monkeypatch.setattr(model, "log_prob", watched)
    score_prompt(model, list(range(23)), top=2)
    assert len(alive_at_call) == 5 and alive_at_call == [0] * 5
    with pytest.raises(ConfigError, match="not both"):
        advance(model, [1, 2], every_position=True, each_segment=lambda start, table: None)
