"""txl score: a file and standard input, JSON lines and TSV, equal to txl eval on the same text; one-line errors."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest

from tests.helpers import corpus_dir, eval_model, one_line_error
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


def test_segment_options_reach_the_scores(scored_model, capsys) -> None:
    """--tgt-len, --mem-len, --clamp-len, --same-length and --batch-size score as ``score_text`` does with them."""
    from transformer_xl.inference.lines import LineEncoder
    from transformer_xl.inference.loading import load_model
    from transformer_xl.inference.score import score_text

    model_dir, _, text = scored_model
    model, directory = load_model(model_dir)
    default = score_text(model, LineEncoder.for_model(directory), TEXT, memory="reset")
    flags = {"tgt_len": "--tgt-len", "mem_len": "--mem-len", "clamp_len": "--clamp-len"}
    for opts in (dict(tgt_len=3, mem_len=4, clamp_len=2), dict(tgt_len=3, mem_len=2, same_length=True)):
        args = [a for k, v in opts.items() for a in ((flags[k], str(v)) if k in flags else ("--same-length",))]
        assert main(["score", str(model_dir), str(text), *args, "--batch-size", "1", "--memory", "reset"]) == 0
        got = _records(capsys)
        want = score_text(model, LineEncoder.for_model(directory), TEXT, memory="reset", **opts)
        for g, w in zip(got, want, strict=True):
            assert g["log_probs"] == pytest.approx(w.log_probs, rel=1e-6, abs=1e-6)  # float rounding (batch 1 here)
        assert got[0]["log_probs"] != pytest.approx(default[0].log_probs, rel=0, abs=1e-6)  # the options count


def test_tsv_header_names_lines_and_tokens_are_escaped(scored_model, capsys) -> None:
    from transformer_xl.cli.score import write_tsv
    from transformer_xl.inference.score import ScoredText

    model_dir, _, text = scored_model
    assert main(["score", str(model_dir), str(text), "--format", "tsv"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["line", "position", "token", "log_prob", "surprisal_bits"]
    assert [r[:3] for r in rows[1:4]] == [["1", "0", "the"], ["1", "1", "cat"], ["1", "2", "sat"]]
    assert rows[8][:3] == ["2", "0", "the"] and len(rows) == 1 + 7 + 7 + 1 + 6 + 2
    out = io.StringIO()
    write_tsv([ScoredText("x", tokens=["a\tb", "c\\d", "\n"], log_probs=[-0.5, -1.0, -2.0])], out, "line")
    assert out.getvalue().splitlines()[1:] == [f"1\t0\ta\\tb\t-0.5\t{0.5 / math.log(2)!r}",
                                               f"1\t1\tc\\\\d\t-1.0\t{1 / math.log(2)!r}",
                                               f"1\t2\t\\n\t-2.0\t{2 / math.log(2)!r}"]


def test_options_that_do_not_fit_are_one_line(scored_model, tmp_path, monkeypatch, capsys) -> None:
    from transformer_xl.data import Vocab

    model_dir, _, text = scored_model
    assert main(["score", str(model_dir), str(text), "--level", "word", "--tokenizer", "tok.json"]) == 2
    one_line_error(capsys, "txl score: error: --level and --tokenizer exclude each other")
    Vocab(["<eos>", "<unk>", "the"], eos="<eos>", unk="<unk>").save(tmp_path / "small.json")
    assert main(["score", str(model_dir), str(text), "--vocab", str(tmp_path / "small.json")]) == 2
    one_line_error(capsys, "txl score: error: the vocabulary has 3 symbols but the model predicts ")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n")))
    assert main(["score", str(model_dir)]) == 2
    one_line_error(capsys, "txl score: error: nothing to score: standard input is empty")


def test_carriage_returns_end_lines_and_text_is_written_as_utf8(scored_model, tmp_path, capsys) -> None:
    model_dir, _, _ = scored_model
    (tmp_path / "crlf.txt").write_bytes("the cat\r\nthe é\rdog\r\n".encode())
    assert main(["score", str(model_dir), str(tmp_path / "crlf.txt")]) == 0
    out = capsys.readouterr().out
    assert [r["text"] for r in map(json.loads, out.splitlines())] == ["the cat", "the é", "dog"]
    assert '"the é"' in out  # UTF-8 as it is, not \u escapes


def test_help_describes_every_option_its_choices_and_defaults(capsys, monkeypatch) -> None:
    """``txl score --help``: each option with its metavar or choices and what it does (the default it states is the
    one parsed, checked below), the command's description and example."""
    from transformer_xl.cli import UsageError, _build_parser

    monkeypatch.setenv("COLUMNS", "400")  # one line per option: the phrases below are not cut by wrapping
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("MODEL_OR_RUN_DIR [FILE]",
                 "Each line of FILE (or of standard input: - or nothing) is one record;",
                 "--memory reset scores each line alone.",
                 "FILE UTF-8 text to score, '-' for standard input (default)",
                 "--documents one record per document (lines separated by blank lines) instead of per line",
                 "--memory {carry,reset} carry: the lines of a document read with the memory of those before "
                 "(default); reset: each line alone",
                 "--format {jsonl,tsv} jsonl: one JSON object per line/document (default); tsv: one row per token",
                 "--mem-len MEM_LEN memory length (default: the model's)",
                 "--batch-size BATCH_SIZE streams scored side by side (padded and masked; the same scores as one at "
                 "a time) (default: 16)",
                 "--vocab VOCAB vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)",
                 "--level {word,char,text8,byte} how a line becomes tokens (default: the run's, else read from the "
                 "vocabulary)",
                 "--tokenizer TOK_JSON the tokenizers JSON of a model trained with --tokenizer (default: the one its "
                 "run recorded)",
                 "--errors {strict,replace} bytes that are not UTF-8: strict refuses the file (default), replace reads "
                 "them as U+FFFD",
                 "MODEL_OR_RUN_DIR model directory (config.json + model.safetensors), checkpoint step_* dir, or run "
                 "dir; a Hugging Face Hub id",
                 "--max-document-tokens N the most tokens one record (a line; with --documents, a document) may have; "
                 "a line may have 16 bytes per token of it (default: 1,000,000)",
                 "The input is read as it comes and each record is written once it is scored"):
        assert text in out, text
    assert out.endswith(" example: txl score runs/wt2 sentences.txt --format tsv")
    parser = _build_parser()
    args = parser.parse_args(["score", "m"])
    assert (args.file, args.documents, args.memory, args.format, args.batch_size, args.errors) == (
        "-", False, "carry", "jsonl", 16, "strict")
    assert (args.mem_len, args.vocab, args.level, args.tokenizer) == (None, None, None, None)
    assert args.max_document_tokens == 1_000_000
    assert parser.parse_args(["score", "m", "--max-document-tokens", "5"]).max_document_tokens == 5
    args = parser.parse_args(["score", "m", "f.txt", "--documents", "--memory", "reset", "--format", "tsv",
                              "--mem-len", "0", "--batch-size", "3", "--vocab", "v.json", "--level", "text8",
                              "--tokenizer", "t.json", "--errors", "replace"])
    assert (args.file, args.documents, args.memory, args.format, args.mem_len, args.batch_size, args.vocab,
            args.level, args.tokenizer, args.errors) == ("f.txt", True, "reset", "tsv", 0, 3, "v.json", "text8",
                                                         "t.json", "replace")
    for level in ("word", "char", "byte"):
        assert parser.parse_args(["score", "m", "--level", level]).level == level
    for bad in (["--mem-len", "-1"], ["--batch-size", "0"], ["--memory", "keep"], ["--format", "csv"],
                ["--max-document-tokens", "0"]):
        with pytest.raises(UsageError, match=f"argument {bad[0]}: "):
            parser.parse_args(["score", "m", *bad])


def test_a_run_directory_is_named_and_changed_weights_are_refused_unless_told(scored_model, tmp_path, capsys) -> None:
    """A run directory: the note of the model picked (``txl score: using RUN/best (...)``); a file that no longer
    matches its MANIFEST.json is refused in one line, and read with ``--no-verify``."""
    import shutil

    model_dir, _, text = scored_model
    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "best")
    assert main(["score", str(run), str(text)]) == 0
    out = capsys.readouterr()
    assert out.err.startswith(f"txl score: using {run / 'best'} (the best validation model") and out.out
    config = model_dir / "config.json"
    config.write_text(config.read_text() + "\n")  # the same config, other bytes
    assert main(["score", str(model_dir), str(text)]) == 2
    assert "config.json does not match its SHA-256 in MANIFEST.json" in one_line_error(capsys, "txl score: error: ")
    assert main(["score", str(model_dir), str(text), "--no-verify"]) == 0


def test_progress_lines_name_the_command(scored_model, capsys, monkeypatch) -> None:
    """Without a terminal, progress is plain lines on stderr, ``txl score N/M (...)``, once they are due (a clock
    that moves 10 s per reading makes every line due)."""
    from types import SimpleNamespace

    import transformer_xl.data.progress as progress

    ticks = iter(range(0, 10 ** 6, 10))
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    model_dir, _, text = scored_model
    assert main(["score", str(model_dir), str(text)]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("txl score: warning")]
    assert lines and all(ln.startswith("txl score ") for ln in lines) and "(100%)" in lines[-1]


def test_a_level_alone_is_taken_and_changes_the_tokens(scored_model, capsys) -> None:
    """``--level`` without ``--tokenizer`` is accepted and reaches the encoder: the word model's text read as
    characters gives one token per character (most of them unknown to its vocabulary) instead of one per word."""
    model_dir, _, text = scored_model
    assert main(["score", str(model_dir), str(text)]) == 0
    words = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["score", str(model_dir), str(text), "--level", "char"]) == 0
    chars = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert words[0]["n_tokens"] == 7 and chars[0]["n_tokens"] > len("thecatsatonthemat")


def test_lengths_of_a_hostile_config_are_refused_before_they_are_allocated(scored_model, tmp_path, monkeypatch,
                                                                            capsys) -> None:
    """A ``config.json`` whose ``mem_len`` asks for more memory than the machine has (the inference cache's slack is
    ``mem_len // 2`` positions from the first segment): one line, before the model is built. A ``tgt_len`` whose
    segment over a long document does not fit what is available: one line before that batch is allocated."""
    from transformer_xl.data import Vocab
    from transformer_xl.inference import budget

    model_dir, _, text = scored_model
    vocab = Vocab.load(model_dir / "vocab.json")
    eval_model(n_token=len(vocab), mem_len=10**9, tgt_len=5).save_pretrained(tmp_path / "hostile", vocab=vocab)
    assert main(["score", str(tmp_path / "hostile"), str(text)]) == 2
    err = one_line_error(capsys, "txl score: error: scoring with tgt_len=5 and mem_len=1,000,000,000 (1 stream of up "
                                 "to 1 tokens, 2 layers of d_model 16) needs about ")
    assert " GB (memory " in err and " GB available: lower mem_len, tgt_len or the batch size" in err
    assert main(["score", str(tmp_path / "hostile"), str(text), "--mem-len", "6"]) == 0  # told a sane length
    capsys.readouterr()
    eval_model(n_token=len(vocab), mem_len=6, tgt_len=10**9).save_pretrained(tmp_path / "long", vocab=vocab)
    (tmp_path / "long.txt").write_text("the cat sat on the mat\n" * 900, encoding="utf-8")  # 6,300 tokens
    monkeypatch.setattr(budget, "available_bytes", lambda device: 300 * 10**6)
    assert main(["score", str(tmp_path / "long"), str(tmp_path / "long.txt"), "--documents"]) == 2
    err = one_line_error(capsys, "txl score: error: scoring with tgt_len=1,000,000,000 and mem_len=6 (1 stream of up "
                                 "to 6,301 tokens, ")
    assert "(attention " in err and "but cpu has 0.3 GB available" in err
    assert main(["score", str(tmp_path / "long"), str(tmp_path / "long.txt"), "--documents", "--tgt-len", "64"]) == 0


def test_a_config_json_nested_too_deeply_is_one_line(scored_model, capsys) -> None:
    """``config.json`` of 100,000 ``[``: one line, not the parser's RecursionError (unverified, or without the
    manifest that would refuse the changed file first)."""
    model_dir, _, text = scored_model
    (model_dir / "config.json").write_text("[" * 100_000)
    assert main(["score", str(model_dir), str(text)]) == 2
    one_line_error(capsys, "txl score: error: ")
    assert main(["score", str(model_dir), str(text), "--no-verify"]) == 2
    err = one_line_error(capsys, f"txl score: error: {model_dir / 'config.json'} is not a usable JSON object: it is "
                                 "nested too deeply to be read")
    (model_dir / "MANIFEST.json").unlink()
    assert main(["score", str(model_dir), str(text)]) == 2
    assert one_line_error(capsys, "txl score: error: ") == err


def test_records_are_written_as_the_input_arrives(scored_model, monkeypatch) -> None:
    """Standard input a pipe that a thread writes: the first document's record is written (and flushed) before the
    second document is, with the default batch of 16, and then the second's."""
    import os
    import threading

    model_dir, _, _ = scored_model
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(open(read, "rb")))  # noqa: SIM115 - closed with stdin
    flushed = threading.Event()

    class Out(io.StringIO):
        def flush(self) -> None:
            super().flush()
            if self.getvalue():
                flushed.set()

    out = Out()
    monkeypatch.setattr(sys, "stdout", out)
    before_second: list[bool] = []

    def feed() -> None:
        with open(write, "wb", buffering=0) as pipe:
            pipe.write(b"the cat sat on the mat\nthe dog ran\n\n")
            before_second.append(flushed.wait(timeout=30))
            before_second.append(out.getvalue().count("\n") == 1)
            pipe.write(b"then it was very quiet\n")

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert main(["score", str(model_dir), "-", "--documents"]) == 0
    finally:
        writer.join()
        sys.stdin.close()
    assert before_second == [True, True]
    assert [json.loads(line)["text"] for line in out.getvalue().splitlines()] == [
        "the cat sat on the mat\nthe dog ran", "then it was very quiet"]


def test_input_without_line_ends_is_refused_once_the_cap_is_read(scored_model, monkeypatch, capsys) -> None:
    """``/dev/zero`` (here 256 MB of zeros through a counter, then the real device): a line longer than 16 bytes per
    token of --max-document-tokens is refused in one line once that much is read, not after reading it all."""
    import subprocess

    from tests.helpers import subprocess_env

    model_dir, _, _ = scored_model

    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left, self.read_bytes = 256 << 20, 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            n = min(len(buffer), self.left)
            buffer[:n] = bytes(n)
            self.left, self.read_bytes = self.left - n, self.read_bytes + n
            return n

    for limit, cap in ((None, 16_000_000), ("1000", 16_000)):
        zeros = Zeros()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(zeros)))
        assert main(["score", str(model_dir), *(["--max-document-tokens", limit] if limit else [])]) == 2
        one_line_error(capsys, f"txl score: error: standard input: line 1 is longer than {cap:,} bytes (no line end "
                               "in them: not a text of lines?); split it, or raise the limit (--max-document-tokens)")
        assert zeros.read_bytes <= cap + (1 << 16) + io.DEFAULT_BUFFER_SIZE
    done = subprocess.run([sys.executable, "-m", "transformer_xl", "score", str(model_dir), "/dev/zero",
                           "--max-document-tokens", "1000"], capture_output=True, text=True, timeout=60,
                          env=subprocess_env(model_dir.parent))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("txl score: error: /dev/zero: line 1 is longer than 16,000 bytes (no line end in them: not "
                           "a text of lines?); split it, or raise the limit (--max-document-tokens)\n")


def test_a_record_over_max_document_tokens_is_one_line(scored_model, capsys) -> None:
    """A line (a document with --documents) of more tokens than --max-document-tokens: one line, as it is read."""
    model_dir, _, text = scored_model
    assert main(["score", str(model_dir), str(text), "--max-document-tokens", "6"]) == 2
    assert one_line_error(capsys, "txl score: error: ") == (
        f"txl score: error: {text}: line 1 has more than 6 tokens; split it (blank lines end a document) or raise "
        "the limit (--max-document-tokens)\n")
    assert main(["score", str(model_dir), str(text), "--max-document-tokens", "7"]) == 0  # 7 tokens a line at most
    capsys.readouterr()
    assert main(["score", str(model_dir), str(text), "--max-document-tokens", "13", "--documents"]) == 2
    assert one_line_error(capsys, "txl score: error: ").endswith("the document of lines 1-2 has more than 13 tokens; "
                                                                 "split it (blank lines end a document) or raise the "
                                                                 "limit (--max-document-tokens)\n")
    assert main(["score", str(model_dir), str(text), "--max-document-tokens", "14", "--documents"]) == 0
