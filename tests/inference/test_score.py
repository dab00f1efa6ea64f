"""Scoring text: batched streams equal streams scored alone, each equal to the evaluation of the same tokens; how a
text becomes lines, documents and streams; the record's figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers import eval_model, token_data, word_vocab
from transformer_xl.data import Vocab
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.inference.score import ScoredText, score_ids, score_text, split_documents

LENGTHS = (1, 2, 5, 9, 8, 17, 4, 23, 16)  # around the segment length 8: shorter, equal, several segments


def _streams(n_token: int = 50) -> list[list[int]]:
    return [token_data(n, seed=n, n_token=n_token).tolist() for n in LENGTHS]


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("mem_len", [0, 8, 20])
def test_batched_streams_equal_streams_scored_alone(same_length: bool, mem_len: int) -> None:
    model = eval_model(same_length=same_length)
    streams = _streams()
    together = score_ids(model, streams, batch_size=4, mem_len=mem_len, same_length=same_length and mem_len > 0)
    for stream, got in zip(streams, together):
        alone = score_ids(model, [stream], batch_size=1, mem_len=mem_len, same_length=same_length and mem_len > 0)[0]
        assert got.log_probs.shape == (len(stream) - 1,)
        np.testing.assert_allclose(got.log_probs, alone.log_probs, rtol=0, atol=2e-6)


@pytest.mark.parametrize("same_length", [False, True])
def test_a_stream_scores_as_the_evaluation_with_one_stream(same_length: bool) -> None:
    """``evaluate(batch_size=1)`` reads the same segments with the same memory: every token but the first."""
    model = eval_model(same_length=same_length)
    data = token_data(61)
    got = score_ids(model, [data.tolist()], batch_size=3)[0].log_probs
    ref = evaluate(model, data, batch_size=1, return_nll=True)
    np.testing.assert_allclose(got, -ref.nll[1:], rtol=0, atol=1e-6)
    assert math.isclose(-got.mean(), ref.loss, rel_tol=0, abs_tol=1e-6)


def test_greedy_flags_the_most_likely_token() -> None:
    model = eval_model()
    seq = [3]
    with torch.no_grad():
        for _ in range(7):  # within one segment of 8: no memory in either reading
            out = model(torch.as_tensor([seq]), return_log_probs=True)
            seq.append(int(out.log_probs[0, -1].argmax()))
    scores = score_ids(model, [seq], greedy=True)[0]
    assert scores.is_greedy is not None and scores.is_greedy.all()
    seq[4] = (seq[4] + 1) % 50
    assert score_ids(model, [seq], greedy=True)[0].is_greedy.tolist()[3] is False
    assert score_ids(model, [seq])[0].is_greedy is None


def test_score_ids_refuses_ids_outside_the_vocabulary() -> None:
    with pytest.raises(DataError, match=r"\[0, 50\)"):
        score_ids(eval_model(), [[1, 2, 50]])


def _encoder_and_model():
    vocab = word_vocab()
    return LineEncoder(vocab), eval_model(n_token=len(vocab))


def test_lines_carry_reads_the_whole_text_as_one_stream() -> None:
    enc, model = _encoder_and_model()
    text = "the game began\n\nthe first season\nof the game\n"
    recs = score_text(model, enc, text)
    assert [r.text for r in recs] == ["the game began", "", "the first season", "of the game"]
    assert recs[1].tokens == ["<eos>"] and recs[0].tokens[-1] == "<eos>"
    stream = enc.start_ids() + enc.text_ids(text)
    ref = score_ids(model, [stream])[0].log_probs
    np.testing.assert_array_equal(np.concatenate([r.log_probs for r in recs]), ref)


def test_reset_scores_each_line_alone_and_documents_sum_their_lines() -> None:
    enc, model = _encoder_and_model()
    text = "the game began\nthe first season\n\n\nof the game\n"
    reset = score_text(model, enc, text, memory="reset", batch_size=2)
    assert [r.text for r in reset] == ["the game began", "the first season", "", "", "of the game"]
    for rec in reset:
        alone = score_ids(model, [enc.start_ids() + enc.line_ids(rec.text)])[0]
        np.testing.assert_allclose(rec.log_probs, alone.log_probs, rtol=0, atol=2e-6)
    docs = score_text(model, enc, text, documents=True)
    assert [d.text for d in docs] == ["the game began\nthe first season", "of the game"]
    first = score_text(model, enc, docs[0].text)  # the document's lines, carried: the same stream
    assert docs[0].tokens == first[0].tokens + first[1].tokens
    np.testing.assert_allclose(docs[0].log_probs, first[0].log_probs + first[1].log_probs, rtol=0, atol=2e-6)
    docs_reset = score_text(model, enc, text, documents=True, memory="reset")
    np.testing.assert_allclose(docs_reset[0].log_probs, reset[0].log_probs + reset[1].log_probs, rtol=0, atol=2e-6)


def test_split_documents_on_blank_lines() -> None:
    assert split_documents("\n\na\nb\n  \n\nc\n") == ["a\nb", "c"]
    assert split_documents("a\r\n\r\nb") == ["a", "b"]


def test_unknown_words_and_empty_text() -> None:
    enc, model = _encoder_and_model()
    rec = score_text(model, enc, "the zyzzyva game")[0]
    assert rec.tokens == ["the", "<unk>", "game", "<eos>"] and enc.unknown == 1
    with pytest.raises(DataError, match="empty"):
        score_text(model, enc, " \n\n")
    with pytest.raises(ConfigError, match="memory"):
        score_text(model, enc, "the game", memory="keep")
    no_unk = LineEncoder(Vocab(["<eos>", "aa", "bb"], eos="<eos>"))
    with pytest.raises(DataError, match="'cc' is not in the model's vocabulary"):
        no_unk.line_ids("aa cc")


def test_record_figures() -> None:
    rec = ScoredText("a b", tokens=["a", "b"], log_probs=[-1.0, -2.0])
    d = rec.to_dict()
    assert d["n_tokens"] == 2 and d["total_log_prob"] == -3.0 and math.isclose(d["ppl"], math.exp(1.5))
    assert d["surprisal_bits"] == [1 / math.log(2), 2 / math.log(2)] and "bpc" not in d
    char = ScoredText("ab", tokens=["a", "b"], log_probs=[-1.0, -2.0], char_level=True).to_dict()
    assert math.isclose(char["bpc"], 1.5 / math.log(2)) and "ppl" not in char
