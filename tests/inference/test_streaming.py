"""Scoring a text as it is read: the records of :func:`score_text`, given while the lines still come, one record (and
one batch) held at a time, and a record over the token limit refused before the rest of it is read."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import eval_model, token_data, word_vocab
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.inference.lines import LineEncoder, split_lines
from transformer_xl.inference.score import score_ids, score_text
from transformer_xl.inference.streaming import StreamScorer, score_stream

TEXT = ("the game began\nthe first season of the game was well known\n\n\nit was the game\n"
        "the the the the the the the the the the the game\n\nwell\n")


@pytest.mark.parametrize(("mem_len", "same_length", "clamp_len"), [(0, False, -1), (8, False, 3), (20, True, -1)])
def test_a_stream_fed_piece_by_piece_is_scored_as_score_ids_scores_it_whole(mem_len, same_length, clamp_len) -> None:
    model = eval_model()
    ids = token_data(61, seed=3).tolist()
    whole = score_ids(model, [ids], mem_len=mem_len, same_length=same_length, clamp_len=clamp_len)[0].log_probs
    for cuts in ([1, 8, 9, 16, 17, 40], list(range(1, 61)), [30]):
        scorer = StreamScorer(model, ids[:1], mem_len=mem_len, same_length=same_length, clamp_len=clamp_len)
        got = [scorer.feed(ids[a:b]) for a, b in zip([1, *cuts], [*cuts, 61])] + [scorer.finish()]
        np.testing.assert_array_equal(np.concatenate(got), whole)  # the same segments: bit for bit


def _both(model, enc_text, enc_stream, text, **kw):
    return score_text(model, enc_text, text, **kw), list(score_stream(model, enc_stream, iter(split_lines(text)), **kw))


@pytest.mark.parametrize(("documents", "memory"), [(False, "carry"), (True, "carry"), (False, "reset"),
                                                   (True, "reset")])
def test_the_records_are_score_texts(documents, memory) -> None:
    """Bit for bit while a batch holds the whole text (and always without documents, with memory carried); up to
    float rounding when the batches differ from ``score_text``'s (which sorts all streams by length)."""
    vocab = word_vocab()
    model = eval_model(n_token=len(vocab))
    want, got = _both(model, LineEncoder(vocab), LineEncoder(vocab), TEXT, documents=documents, memory=memory)
    assert [r.to_dict() for r in got] == [r.to_dict() for r in want]
    want, got = _both(model, LineEncoder(vocab), LineEncoder(vocab), TEXT, documents=documents, memory=memory,
                      batch_size=2, mem_len=5)
    assert [r.text for r in got] == [r.text for r in want] and [r.tokens for r in got] == [r.tokens for r in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.log_probs, w.log_probs, rtol=0, atol=2e-6)


class Pulled:
    """Lines handed out one at a time, counting how many were taken."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.taken = lines, 0

    def __iter__(self):
        for line in self.lines:
            self.taken += 1
            yield line


def test_records_are_given_while_the_lines_still_come() -> None:
    vocab = word_vocab()
    model = eval_model(n_token=len(vocab), tgt_len=4)
    lines = Pulled(split_lines(TEXT))
    seen = [(rec.text, lines.taken) for rec in score_stream(model, LineEncoder(vocab), lines, documents=True,
                                                            waiting=lambda: True)]
    assert seen == [("the game began\nthe first season of the game was well known", 3),
                    ("it was the game\n" + TEXT.split("\n")[5], 7), ("well", 8)]
    lines = Pulled(split_lines(TEXT))
    seen = [(rec.text, lines.taken) for rec in score_stream(model, LineEncoder(vocab), lines)]
    # one stream read 4 tokens at a time, a line given once the segment with its last token is read: the first
    # line's 4 tokens fill the first segment; the second's last 2 wait for the blank lines' <eos> (lines 3 and 4)
    assert seen[:3] == [("the game began", 1), ("the first season of the game was well known", 4), ("", 4)]
    assert seen[-1] == ("well", 8)


def test_a_record_over_the_limit_is_refused_before_the_rest_is_read() -> None:
    vocab = word_vocab()
    model = eval_model(n_token=len(vocab))
    lines = Pulled(["the game"] + ["the game was"] * 1000)
    with pytest.raises(DataError, match=r"^in: the document of lines 1-3 has more than 10 tokens; split it \(blank "
                                        r"lines end a document\) or raise the limit \(--max-document-tokens\)$"):
        list(score_stream(model, LineEncoder(vocab), lines, documents=True, max_document_tokens=10, name="in"))
    assert lines.taken == 3
    lines = Pulled(["the game", "", "the game was well known"])
    with pytest.raises(DataError, match=r"^the text: line 3 has more than 5 tokens"):
        list(score_stream(model, LineEncoder(vocab), lines, memory="reset", max_document_tokens=5))
    assert [r.n_tokens for r in score_stream(model, LineEncoder(vocab), ["the game was"], max_document_tokens=4)] == [4]


def test_nothing_but_whitespace_is_nothing_to_score() -> None:
    vocab = word_vocab()
    model = eval_model(n_token=len(vocab))
    for documents in (False, True):
        with pytest.raises(DataError, match=r"^nothing to score: in is empty$"):
            list(score_stream(model, LineEncoder(vocab), [" ", "", "\t"], documents=documents, name="in"))


def test_a_stream_growing_past_the_machine_is_refused_at_the_segment_that_would_exceed_it(monkeypatch) -> None:
    """What a stream's buffers take grows with each segment until its memory is full: the machine's memory is
    checked at every such segment, not at the first only, so the one that would not fit is refused before it runs."""
    from transformer_xl.inference import budget

    model = eval_model(n_token=50)
    tgt, mem = model.config.tgt_len, 40 * model.config.tgt_len

    def need(positions: int) -> int:
        return budget.scoring_bytes(model.config, rows=1, positions=positions, tgt_len=tgt, mem_len=mem)["total"]

    assert need(5 * tgt + 1) < need(6 * tgt + 1)
    asked = []
    monkeypatch.setattr(budget, "SMALL", 0)
    monkeypatch.setattr(budget, "available_bytes", lambda device: asked.append(device) or need(5 * tgt + 1))
    scorer = StreamScorer(model, [0], mem_len=mem)
    ids = np.random.default_rng(0).integers(0, 50, 6 * tgt).tolist()
    for k in range(5):  # five segments fit
        assert scorer.feed(ids[k * tgt:(k + 1) * tgt]).shape == (tgt,)
    assert len(asked) == 5
    with pytest.raises(ConfigError, match=rf"\(1 stream of up to {6 * tgt + 1:,} tokens, .* needs .* but cpu has"):
        scorer.feed(ids[5 * tgt:])
    assert scorer.pos == 5 * tgt  # the sixth segment was not read
