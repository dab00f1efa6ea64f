"""txl score: a file and standard input, JSON lines and TSV, equal to txl eval on the same text; one-line errors."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest

from tests.helpers import corpus_dir, eval_model
from transformer_xl.cli import main

TEXT = "the cat sat on the mat\nthe dog ran under a log\n\nthen it was very quiet\nzyzzyva\n"


@pytest.fixture
def scored_model(tmp_path, monkeypatch):
    """A tiny model with the vocabulary of a user corpus whose valid split is ``TEXT`` after an empty line."""
    from transformer_xl.data import load_corpus

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    corpus = corpus_dir(tmp_path)
    (corpus / "valid.txt").write_text("\n" + TEXT, encoding="utf-8")
    vocab = load_corpus(str(corpus)).vocab
    eval_model(n_token=len(vocab), mem_len=6, tgt_len=5).save_pretrained(tmp_path / "model", vocab=vocab)
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    return tmp_path / "model", corpus, tmp_path / "text.txt"


def _records(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_scoring_a_file_equals_txl_eval_on_the_same_text(scored_model, tmp_path, capsys) -> None:
    model, corpus, text = scored_model
    assert main(["score", str(model), str(text)]) == 0
    out = capsys.readouterr()
    assert "warning: 2 tokens are not in the vocabulary and were scored as <unk>" in out.err
    records = [json.loads(line) for line in out.out.splitlines()]
    assert [r["text"] for r in records] == TEXT.splitlines()
    assert records[0]["tokens"] == ["the", "cat", "sat", "on", "the", "mat", "<eos>"]
    assert records[2]["tokens"] == ["<eos>"] and records[4]["tokens"] == ["<unk>", "<eos>"]
    for r in records:
        assert r["n_tokens"] == len(r["tokens"]) == len(r["log_probs"]) == len(r["surprisal_bits"])
        assert math.isclose(r["total_log_prob"], sum(r["log_probs"]), abs_tol=1e-9)
        assert math.isclose(r["ppl"], math.exp(-r["total_log_prob"] / r["n_tokens"]), rel_tol=1e-12)
        assert all(math.isclose(b, -lp / math.log(2)) for b, lp in zip(r["surprisal_bits"], r["log_probs"]))
    assert main(["eval", str(model), "--dataset", str(corpus), "--split", "valid", "--batch-size", "1",
                 "--json", str(tmp_path / "eval.json")]) == 0
    ev = json.loads((tmp_path / "eval.json").read_text())
    n = sum(r["n_tokens"] for r in records)
    assert ev["tokens"] == n
    assert math.isclose(-sum(r["total_log_prob"] for r in records) / n, ev["loss"], rel_tol=0, abs_tol=1e-6)


def test_standard_input_tsv_and_documents(scored_model, monkeypatch, capsys) -> None:
    model, _, text = scored_model
    assert main(["score", str(model), str(text), "--documents"]) == 0
    docs = _records(capsys)
    assert [d["text"] for d in docs] == ["the cat sat on the mat\nthe dog ran under a log",
                                         "then it was very quiet\nzyzzyva"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TEXT.encode())))
    assert main(["score", str(model), "-", "--documents", "--format", "tsv", "--batch-size", "1"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["document", "position", "token", "log_prob", "surprisal_bits"]
    assert [r[2] for r in rows[1:] if r[0] == "2"] == ["then", "it", "was", "very", "<unk>", "<eos>", "<unk>",
                                                       "<eos>"]
    by_doc = [sum(float(r[3]) for r in rows[1:] if r[0] == str(i)) for i in (1, 2)]
    assert by_doc == pytest.approx([d["total_log_prob"] for d in docs], rel=0, abs=1e-5)
    assert main(["score", str(model), str(text), "--memory", "reset", "--mem-len", "0"]) == 0
    reset = _records(capsys)
    assert main(["score", str(model), str(text), "--mem-len", "0"]) == 0
    carried = _records(capsys)  # without memory, the lines after the first see less context in both
    assert reset[0]["log_probs"] == pytest.approx(carried[0]["log_probs"], abs=1e-6)
    assert reset[1]["log_probs"] != pytest.approx(carried[1]["log_probs"], abs=1e-6)


@pytest.mark.parametrize(("content", "message"), [
    (b"the cat \xff sat\n", "invalid UTF-8 at byte offset 8"),
    (b" \n\n", "nothing to score"),
    (None, "cannot read"),
])
def test_bad_input_is_one_line(scored_model, tmp_path, capsys, content, message) -> None:
    model, _, _ = scored_model
    path = tmp_path / "input.txt"
    if content is not None:
        path.write_bytes(content)
    assert main(["score", str(model), str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("txl score: error:") and err.count("\n") == 1


def test_errors_replace_reads_bad_bytes(scored_model, tmp_path, capsys) -> None:
    model, _, _ = scored_model
    (tmp_path / "input.txt").write_bytes(b"the cat \xff sat\n")
    assert main(["score", str(model), str(tmp_path / "input.txt"), "--errors", "replace"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == ["the", "cat", "<unk>", "sat", "<eos>"]
