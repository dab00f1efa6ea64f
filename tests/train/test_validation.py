"""Validation and final-evaluation lengths (official train.py / eval.py) and the split scores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers import eval_model, tiny_config, tiny_train_config, token_data
from transformer_xl.data import Corpus
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.train import validation  # not `from ... import test_lengths`: pytest would collect it
from transformer_xl.train.validation import score_split, validation_lengths


def _train(tmp_path, **kw):
    return tiny_train_config(tmp_path / "run", **kw)


# ------------------------------------------------------------------ validation_lengths
@pytest.mark.parametrize("eval_tgt_len, want", [
    (None, dict(tgt_len=8, ext_len=0, mem_len=6)),  # the training lengths
    (8, dict(tgt_len=8, ext_len=0, mem_len=6)),
    (4, dict(tgt_len=4, ext_len=0, mem_len=10)),  # shorter segments, longer memory: 4 + 10 = 8 + 6 keys
    (2, dict(tgt_len=2, ext_len=0, mem_len=12)),
    (12, dict(tgt_len=12, ext_len=0, mem_len=2)),  # longer segments, shorter memory
])
def test_validation_with_memory_keeps_the_training_context(tmp_path, eval_tgt_len, want) -> None:
    m = tiny_config(tgt_len=8, mem_len=6)
    got = validation_lengths(m, _train(tmp_path, eval_tgt_len=eval_tgt_len))
    assert got == want
    assert got["tgt_len"] + got["mem_len"] == m.tgt_len + m.mem_len


def test_validation_with_memory_keeps_ext_len(tmp_path) -> None:
    got = validation_lengths(tiny_config(tgt_len=8, mem_len=6, ext_len=3), _train(tmp_path, eval_tgt_len=4))
    assert got == dict(tgt_len=4, ext_len=3, mem_len=10)


@pytest.mark.parametrize("ext_len, eval_tgt_len, want_ext", [
    (0, None, 0),
    (0, 4, 4),  # the 4 tokens the segment lost become extra context
    (2, 4, 6),
    (2, 8, 2),
    (0, 12, 0),  # a longer segment: no negative extra context
    (2, 9, 1),
])
def test_validation_without_memory_moves_the_difference_to_ext_len(tmp_path, ext_len, eval_tgt_len,
                                                                    want_ext) -> None:
    m = tiny_config(tgt_len=8, mem_len=0, ext_len=ext_len)
    got = validation_lengths(m, _train(tmp_path, eval_tgt_len=eval_tgt_len))
    assert got == dict(tgt_len=eval_tgt_len or 8, ext_len=want_ext, mem_len=0)


# ------------------------------------------------------------------ test_lengths
@pytest.mark.parametrize("eval_tgt_len", [None, 2, 4, 8, 12])
def test_final_evaluation_falls_back_to_the_validation_lengths(tmp_path, eval_tgt_len) -> None:
    m = tiny_config(tgt_len=8, mem_len=6)
    cfg = _train(tmp_path, eval_tgt_len=eval_tgt_len)
    got = validation.test_lengths(m, cfg)
    val = validation_lengths(m, cfg)
    assert got == dict(tgt_len=val["tgt_len"], mem_len=val["mem_len"], clamp_len=None, same_length=None)


@pytest.mark.parametrize("overrides, want", [
    (dict(test_tgt_len=2), dict(tgt_len=2, mem_len=12)),  # the official eval.py context rule
    (dict(test_tgt_len=2, eval_tgt_len=4), dict(tgt_len=2, mem_len=12)),  # test_tgt_len wins
    (dict(eval_tgt_len=4, test_mem_len=20), dict(tgt_len=4, mem_len=20)),  # an explicit memory is kept
    (dict(test_tgt_len=4, test_mem_len=0), dict(tgt_len=4, mem_len=0)),
    (dict(test_clamp_len=5, test_same_length=True), dict(tgt_len=8, mem_len=6, clamp_len=5, same_length=True)),
])
def test_final_evaluation_test_overrides(tmp_path, overrides, want) -> None:
    got = validation.test_lengths(tiny_config(tgt_len=8, mem_len=6), _train(tmp_path, **overrides))
    assert got == {"clamp_len": None, "same_length": None, **want}


def test_final_evaluation_without_memory(tmp_path) -> None:
    m = tiny_config(tgt_len=8, mem_len=0, attn_type=2)
    assert validation.test_lengths(m, _train(tmp_path, test_tgt_len=4))["mem_len"] == 0  # no memory appears
    assert validation.test_lengths(m, _train(tmp_path, test_tgt_len=4, test_mem_len=16))["mem_len"] == 16


# ------------------------------------------------------------------ score_split
@pytest.fixture
def corpus() -> Corpus:
    return Corpus.from_arrays("toy", {"train": token_data(300, seed=1), "valid": token_data(203, seed=2),
                                      "test": token_data(150, seed=3)}, n_token=50)


@pytest.mark.parametrize("lengths", [{}, dict(tgt_len=4, mem_len=12), dict(tgt_len=5, mem_len=0, ext_len=3)])
def test_score_split_is_evaluate_on_the_split(corpus, lengths) -> None:
    model = eval_model()
    got = score_split(model, corpus, "valid", 4, device="cpu", **lengths)
    want = evaluate(model, corpus.splits["valid"], batch_size=4, device="cpu", **lengths)
    assert got["loss"] == want.loss and got["tokens"] == want.tokens == (203 // 4 - 1) * 4
    assert got["ppl"] == pytest.approx(math.exp(want.loss), rel=1e-12)
    assert "bpc" not in got  # a word-level corpus: bits per character mean nothing
    assert got["batch_size"] == 4 and got["method"] == "memory"
    for key, value in lengths.items():
        assert got[key] == value
    other = score_split(model, corpus, "test", 4, device="cpu", **lengths)
    assert other["loss"] != got["loss"] and other["tokens"] == (150 // 4 - 1) * 4  # the split asked for


def test_score_split_max_tokens(corpus) -> None:
    model = eval_model()
    got = score_split(model, corpus, "valid", 4, device="cpu", max_tokens=80)
    want = evaluate(model, corpus.splits["valid"], batch_size=4, device="cpu", max_tokens=80)
    assert got["loss"] == want.loss and got["tokens"] == want.tokens == (81 // 4 - 1) * 4


@pytest.mark.parametrize("max_tokens, batch", [(5, 2), (3, 1), (1, 1), (21, 10)])
def test_score_split_shrinks_the_batch_for_a_short_cut(corpus, max_tokens, batch) -> None:
    """Every stream needs two tokens (one input, one target): a cut of max_tokens + 1 tokens gets fewer streams."""
    model = eval_model()
    got = score_split(model, corpus, "valid", 10, device="cpu", max_tokens=max_tokens)
    want = evaluate(model, corpus.splits["valid"], batch_size=batch, device="cpu", max_tokens=max_tokens)
    assert got["batch_size"] == batch and got["tokens"] == want.tokens > 0
    assert got["loss"] == want.loss and math.isfinite(got["loss"])


def test_score_split_of_a_char_level_corpus_and_sentence_streams(corpus) -> None:
    model = eval_model()
    chars = Corpus.from_arrays("chars", dict(corpus.splits), n_token=50, char_level=True)
    got = score_split(model, chars, "valid", 4, device="cpu")
    assert got["bpc"] == pytest.approx(got["loss"] / math.log(2), rel=1e-12)
    offsets = [*range(0, 203, 7), 203]
    chars.extras = {"valid.sent_offsets": np.asarray(offsets)}
    sent = score_split(model, chars, "valid", 2, device="cpu")
    want = evaluate(model, chars.splits["valid"], batch_size=2, device="cpu", offsets=np.asarray(offsets))
    assert sent["method"] == "memory-sentences" and sent["loss"] == want.loss and sent["tokens"] == want.tokens


# ------------------------------------------------------------------ final_evaluation
@pytest.mark.parametrize("char_level", [False, True])
def test_final_evaluation_names_the_metric_of_the_unit(tmp_path, corpus, char_level) -> None:
    """What results.json's ``final`` holds: perplexity for a word-level corpus (no bpc), bits per character too for a
    character-level one."""
    data = Corpus.from_arrays("toy", dict(corpus.splits), n_token=50, char_level=char_level)
    got = validation.final_evaluation(eval_model(), tmp_path / "no-best", data, _train(tmp_path), device="cpu")
    assert got["model"] == "last"
    for split in ("valid", "test"):
        assert got[split]["ppl"] == pytest.approx(math.exp(got[split]["loss"]), rel=1e-12)
        if char_level:
            assert got[split]["bpc"] == pytest.approx(got[split]["loss"] / math.log(2), rel=1e-12)
        else:
            assert "bpc" not in got[split]


def test_final_evaluation_says_what_it_scores_and_shows_its_progress(tmp_path, corpus, monkeypatch, capsys) -> None:
    """A line as it starts, and each split's evaluation with progress: lines when stderr is not a terminal (as
    training's progress: ``cfg.progress``), none with ``progress="off"``."""
    asked = []
    real = validation.evaluate

    def spy(*args, **kwargs):
        asked.append((kwargs["progress"], kwargs["desc"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(validation, "evaluate", spy)
    validation.final_evaluation(eval_model(), tmp_path / "no-best", corpus, _train(tmp_path), device="cpu")
    assert asked == [("lines", "final evaluation, valid: segment"), ("lines", "final evaluation, test: segment")]
    assert capsys.readouterr().err == ("txl train: final evaluation of the last model on the whole splits (valid 203 "
                                       "tokens, test 150 tokens)\n")
    asked.clear()
    got = validation.final_evaluation(eval_model(), tmp_path / "no-best", corpus, _train(tmp_path), device="cpu",
                                      progress="off")
    assert [mode for mode, _ in asked] == ["off", "off"] and capsys.readouterr().err == ""
    assert isinstance(got["minutes"], float) and got["minutes"] >= 0


@pytest.mark.parametrize("scored, max_tokens, split_tokens, want", [
    (1_990, 2_000, 217_646, "first 2,000 tokens"),
    (217_630, None, 217_646, "whole split, 217,630 tokens"),
    (190, 2_000, 203, "whole split, 190 tokens"),  # a cut longer than the split reads all of it
    (190, 202, 203, "whole split, 190 tokens"),
    (190, 201, 203, "first 201 tokens"),
    (245_550, None, None, "whole split, 245,550 tokens"),
])
def test_scope_says_what_a_score_covers(scored, max_tokens, split_tokens, want) -> None:
    assert validation.scope(scored, max_tokens, split_tokens) == want
