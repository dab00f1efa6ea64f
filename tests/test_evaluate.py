"""txl.evaluate: official eval.py scoring with memory, the vanilla sliding window, model loading, `txl eval`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from txl import TransformerXLLM, TXLConfig
from txl._cli import main
from txl.errors import CheckpointError, ConfigError
from txl.evaluate import (
    evaluate,
    evaluate_sliding_window,
    load_model,
    memory_sweep,
    parse_int_list,
    resolve_model_dir,
    sliding_window_nll,
)

V = 50


def _model(attn_type: int = 0, **kw) -> TransformerXLLM:
    base = dict(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=8,
                mem_len=8 if attn_type in (0, 1) else 0, attn_type=attn_type, init_std=0.3)
    base.update(kw)
    torch.manual_seed(0)
    return TransformerXLLM(TXLConfig(**base)).eval()


def _data(n: int = 203, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, n)


def _official_loop(model, data, batch_size, tgt_len, mem_len):
    """The official eval.py loop, written out: seq_len * loss.mean() summed, over sum(seq_len)."""
    n_step = len(data) // batch_size
    streams = torch.tensor(data[: n_step * batch_size]).view(batch_size, n_step)
    model.reset_length(tgt_len=tgt_len, mem_len=mem_len)
    total, total_len, mems, i = 0.0, 0, None, 0
    with torch.no_grad():
        while i < n_step - 1:
            seq_len = min(tgt_len, n_step - 1 - i)
            out = model(streams[:, i : i + seq_len], streams[:, i + 1 : i + 1 + seq_len], mems)
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
    """Stream b of a batched evaluation scores what a batch-1 evaluation of that stream alone scores."""
    model, data = _model(), _data(120)
    res = evaluate(model, data, batch_size=4, tgt_len=6, mem_len=6, return_nll=True)
    n_step = 30
    for b in range(4):
        alone = evaluate(model, data[b * n_step : (b + 1) * n_step], batch_size=1, tgt_len=6, mem_len=6,
                         return_nll=True)
        np.testing.assert_allclose(res.nll[b * n_step + 1 : (b + 1) * n_step], alone.nll[1:], rtol=1e-5)


def test_evaluate_restores_lengths_and_mode() -> None:
    model = _model()
    model.train()
    before = model.config
    evaluate(model, _data(), batch_size=2, tgt_len=5, mem_len=20, clamp_len=4, same_length=True)
    assert model.config == before and model.training


def test_char_level_reports_bits_per_character() -> None:
    res = evaluate(_model(), _data(), batch_size=2, char_level=True)
    assert res.bpc == pytest.approx(res.loss / math.log(2))
    assert "bpc" in res.to_dict() and res.to_dict()["tokens"] == res.tokens


def test_memory_sweep_turns_same_length_off_without_memory() -> None:
    res = memory_sweep(_model(), _data(), [0, 4, 16], batch_size=2, tgt_len=4, same_length=True)
    assert [r.settings["mem_len"] for r in res] == [0, 4, 16]
    assert [r.settings["same_length"] for r in res] == [False, True, True]


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_sliding_window_equals_one_forward_per_window(attn_type) -> None:
    model, data, window = _model(attn_type), _data(80), 8
    got = sliding_window_nll(model, data, window=window, first=1, last=60, rows=5)
    with torch.no_grad():
        model.reset_length(mem_len=0)
        naive = [model(torch.tensor(data[max(0, t - window) : t])[None], torch.tensor(data[t : t + 1])[None]).nll.item()
                 for t in range(1, 60)]
    np.testing.assert_allclose(got, naive, rtol=1e-5, atol=1e-6)


def test_sliding_window_sees_exactly_the_window() -> None:
    """Changing a token just outside the window changes nothing; just inside, the prediction changes."""
    model, data, window = _model(0), _data(60), 6
    t = 40
    a = sliding_window_nll(model, data, window=window, first=t, last=t + 1)
    outside, inside = data.copy(), data.copy()
    outside[t - window - 1] = (outside[t - window - 1] + 1) % V
    inside[t - window] = (inside[t - window] + 1) % V
    assert sliding_window_nll(model, outside, window=window, first=t, last=t + 1)[0] == a[0]
    assert sliding_window_nll(model, inside, window=window, first=t, last=t + 1)[0] != a[0]


def test_sliding_window_errors_and_whole_split() -> None:
    model = _model(3, tgt_len=8)
    with pytest.raises(ConfigError, match="learned 8 positions"):
        sliding_window_nll(model, _data(), window=9)
    res = evaluate_sliding_window(_model(2), _data(40), window=8, return_nll=True)
    assert res.tokens == 39 and res.unscored == 1 and np.isnan(res.nll[0])


def test_parse_int_list() -> None:
    assert parse_int_list("0, 128,512") == [0, 128, 512]
    for bad in ("1,x", "", "-1"):
        with pytest.raises(ConfigError):
            parse_int_list(bad, "--mem-len")


def test_resolve_and_load_model_dirs(tmp_path) -> None:
    model = _model()
    model.save_pretrained(tmp_path / "run" / "checkpoints" / "step_00000010")
    assert resolve_model_dir(tmp_path / "run").name == "step_00000010"
    model.save_pretrained(tmp_path / "run" / "best")
    assert resolve_model_dir(tmp_path / "run") == tmp_path / "run" / "best"
    loaded, directory = load_model(tmp_path / "run")
    assert directory == tmp_path / "run" / "best" and not loaded.training
    with pytest.raises(CheckpointError, match="no such"):
        resolve_model_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no model"):
        resolve_model_dir(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- CLI
@pytest.fixture
def text_corpus(tmp_path, monkeypatch):
    """A small user word corpus (its vocabulary size is what the model must predict)."""
    from txl.data import load_corpus

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    lines = [" ".join(rng.choice(words, 12)) for _ in range(400)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = load_corpus(str(path))
    model = _model(n_token=len(corpus.vocab))
    model.save_pretrained(tmp_path / "model")
    return path, tmp_path / "model", corpus


def test_cli_eval_json_and_sweep(text_corpus, tmp_path, capsys) -> None:
    path, model_dir, corpus = text_corpus
    assert main(["eval", str(model_dir), "--dataset", str(path), "--split", "test", "--batch-size", "1",
                 "--json", str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["tokens"] == len(corpus.splits["test"]) - 1 and doc["unscored"] == 1
    assert {"loss", "ppl", "seconds", "tokens_per_s", "mem_len"} <= set(doc)
    pytest.importorskip("matplotlib")
    assert main(["eval", str(model_dir), "--dataset", str(path), "--mem-len", "0,4,16", "--same-length",
                 "--out", str(tmp_path / "sweep")]) == 0
    rows = json.loads((tmp_path / "sweep" / "memory-sweep.json").read_text())
    assert [r["mem_len"] for r in rows] == [0, 4, 16]
    assert (tmp_path / "sweep" / "memory-sweep.png").stat().st_size > 0
    assert "mem_len" in (tmp_path / "sweep" / "memory-sweep.md").read_text()
    assert main(["eval", str(model_dir), "--dataset", str(path), "--sliding-window", "8", "--max-tokens", "50"]) == 0
    assert "50 tokens (1 not scored)" in capsys.readouterr().out  # max-tokens 50: tokens 1..50


@pytest.mark.parametrize("argv, message", [
    (["--mem-len", "0,abc"], "--mem-len must be a comma-separated list"),
    (["--mem-len", "-4"], "--mem-len values must be >= 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
])
def test_cli_eval_bad_arguments_are_one_line_errors(text_corpus, capsys, argv, message) -> None:
    path, model_dir, _ = text_corpus
    assert main(["eval", str(model_dir), "--dataset", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_eval_missing_checkpoint_and_unknown_dataset(text_corpus, tmp_path, capsys) -> None:
    path, model_dir, _ = text_corpus
    assert main(["eval", str(tmp_path / "nope"), "--dataset", str(path)]) == 2
    assert "no such model" in capsys.readouterr().err
    assert main(["eval", str(model_dir), "--dataset", "no-such-dataset"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_evaluate_sentence_streams_scores_every_predicted_token() -> None:
    """With sentence offsets (One Billion Word) the loss is the mean NLL over every target of the complete
    batches of the unshuffled sentence iterator, memory carried; ``max_tokens`` keeps whole sentences."""
    from txl.data import LMShuffledIterator

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
    assert math.isclose(res.loss, total / count, rel_tol=1e-12)
    cut = evaluate(model, data, batch_size=3, tgt_len=5, offsets=offsets, max_tokens=int(offsets[20]) - 1)
    assert 0 < cut.tokens < res.tokens
    with pytest.raises(ConfigError, match="return_nll"):
        evaluate(model, data, batch_size=3, offsets=offsets, return_nll=True)
