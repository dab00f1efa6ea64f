"""txl eval: memory evaluation, sweeps, the vanilla window, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers import (
    MODEL_ARG_KINDS,
    MODEL_DIR_KINDS,
    assert_cli_refuses_damage,
    assert_model_note,
    model_arg,
    model_dirs,
)
from tests.helpers import eval_model as _model
from transformer_xl import TransformerXLLM
from transformer_xl.cli import main


@pytest.fixture
def text_corpus(tmp_path, monkeypatch):
    """A small user word corpus (its vocabulary size is what the model must predict)."""
    from transformer_xl.data import load_corpus

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
    assert main(["eval", str(model_dir), "--dataset", str(path), "--sliding-window", "8", "--max-tokens", "50"]) == 0
    assert "50 tokens (1 not scored)" in capsys.readouterr().out  # max-tokens 50: tokens 1..50


def test_cli_eval_memory_sweep(text_corpus, tmp_path) -> None:
    pytest.importorskip("matplotlib")  # the sweep plots its curve
    path, model_dir, _ = text_corpus
    assert main(["eval", str(model_dir), "--dataset", str(path), "--mem-len", "0,4,16", "--same-length",
                 "--out", str(tmp_path / "sweep")]) == 0
    rows = json.loads((tmp_path / "sweep" / "memory-sweep.json").read_text())
    assert [r["mem_len"] for r in rows] == [0, 4, 16]
    assert (tmp_path / "sweep" / "memory-sweep.png").stat().st_size > 0
    assert "mem_len" in (tmp_path / "sweep" / "memory-sweep.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--mem-len", "0,abc"], "--mem-len must be a comma-separated list"),
    (["--mem-len", "-4"], "--mem-len values must be >= 0"),
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got '0'"),
    (["--sliding-window", "4", "--same-length"], "--same-length does not apply to --sliding-window"),
    (["--sliding-window", "4", "--out", "sweep"], "--out does not apply to --sliding-window"),
    (["--device", "bogus"], "unknown device 'bogus'"),
    (["--max-tokens", "-10"], "argument --max-tokens: expected a positive integer, got '-10'"),
    (["--tgt-len", "0"], "argument --tgt-len: expected a positive integer, got '0'"),
    (["--ext-len=-1"], "argument --ext-len: expected an integer >= 0"),
    (["--clamp-len=-100"], "argument --clamp-len: expected an integer >= -1 (-1 or 0: no clamping), got '-100'"),
    (["--sliding-window", "0"], "argument --sliding-window: expected a positive integer"),
    (["--sliding-window", "4", "--rows", "0"], "argument --rows: expected a positive integer"),
    *([] if torch.cuda.is_available() else [(["--device", "cuda"], "'cuda' requested but CUDA is not available")]),
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


@pytest.mark.parametrize("damage", ["truncate", "bit-flip"])
def test_cli_eval_refuses_damaged_weights_of_every_kind_of_directory(text_corpus, tmp_path, capsys, damage) -> None:
    path, model_dir, _ = text_corpus
    dirs = model_dirs(tmp_path / "kinds", TransformerXLLM.from_pretrained(model_dir))
    assert set(dirs) == set(MODEL_DIR_KINDS)
    assert_cli_refuses_damage(lambda d: ["eval", str(d), "--dataset", str(path), "--max-tokens", "20"], dirs,
                              damage, capsys)


@pytest.mark.parametrize("kind", MODEL_ARG_KINDS)
def test_cli_eval_takes_a_model_checkpoint_or_run_directory(trained_run, tmp_path, monkeypatch, capsys,
                                                            kind) -> None:
    run, corpus = trained_run
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    path = model_arg(run, kind, tmp_path)
    assert main(["eval", str(path), "--dataset", str(corpus), "--max-tokens", "60", "--batch-size", "2",
                 "--json", str(tmp_path / "r.json")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("loss ")
    assert_model_note(err, "txl eval", run, kind)
    assert json.loads((tmp_path / "r.json").read_text())["model"] == str(run / "best" if kind == "run" else path)


def test_a_sweep_prints_each_row_as_soon_as_its_evaluation_ends(text_corpus, monkeypatch, capsys) -> None:
    import sys

    from transformer_xl.inference import evaluate as E

    path, model_dir, _ = text_corpus
    events: list[str] = []
    real_evaluate = E.evaluate

    def evaluate(*args, **kwargs):
        events.append(f"start {kwargs['mem_len']}")
        assert kwargs["progress"] == "lines"  # --no-progress: lines, never a bar
        return real_evaluate(*args, **kwargs)

    class Out:  # stdout that records when each line is written relative to the evaluations
        def write(self, text: str) -> int:
            events.extend(f"print {line.split(':')[0].split()[-1]}" for line in text.splitlines() if line)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(E, "evaluate", evaluate)
    monkeypatch.setattr(sys, "stdout", Out())
    assert main(["eval", str(model_dir), "--dataset", str(path), "--mem-len", "0,4,8", "--no-progress"]) == 0
    assert events == ["start 0", "print 0", "start 4", "print 4", "start 8", "print 8"]


def test_user_text_options_come_from_flags_the_run_or_the_vocabulary(tmp_path, capsys) -> None:
    import argparse

    from transformer_xl.cli.eval import given_text_options
    from transformer_xl.data.vocab import Vocab
    from transformer_xl.inference.loading import run_text_options

    def user_text_options(args: argparse.Namespace, model_dir) -> dict:  # as `txl eval` decides (cli/eval.py run)
        given = given_text_options(args)
        return given if given is not None else run_text_options(model_dir)

    def ns(dataset: str, **kw) -> argparse.Namespace:
        return argparse.Namespace(dataset=dataset, **{k: kw.get(k) for k in ("level", "tokenizer", "valid_fraction",
                                                                             "test_fraction")})

    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train": {"level": "byte", "valid_fraction": 0.2}, "model": {}}))
    assert user_text_options(ns(str(tmp_path)), run / "best") == {"level": "byte", "valid_fraction": 0.2}
    assert user_text_options(ns(str(tmp_path), level="word"), run / "best") == {"level": "word"}
    model = tmp_path / "model"  # no run config: the vocabulary tells the level
    model.mkdir()
    Vocab(["<eos>", "a", "b", " "], eos="<eos>").save(model / "vocab.json")
    assert user_text_options(ns(str(tmp_path)), model) == {"level": "char"}
    Vocab(["<eos>", "hello", "world"], eos="<eos>").save(model / "vocab.json")
    assert user_text_options(ns(str(tmp_path)), model) == {}
    assert user_text_options(ns("wt2"), run / "best") == {}
    assert main(["eval", str(model), "--dataset", "wt2", "--level", "char"]) == 2
    assert "--level applies to your own text only; wt2 is a known dataset" in capsys.readouterr().err


def test_cli_eval_quantize_int8_scores_close_to_float(text_corpus, tmp_path, capsys) -> None:
    path, model_dir, _ = text_corpus
    loss = {}
    for flag in ([], ["--quantize", "int8"]):
        out = tmp_path / f"q{len(flag)}.json"
        assert main(["eval", str(model_dir), "--dataset", str(path), "--split", "valid", *flag, "--json", str(out),
                     "--no-progress"]) == 0
        loss[len(flag)] = json.loads(out.read_text())["loss"]
    assert loss[0] != loss[2] and abs(loss[2] - loss[0]) < 0.01 * loss[0]
    assert main(["eval", str(model_dir), "--dataset", str(path), "--quantize", "int4"]) == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    assert main(["eval", str(model_dir), "--dataset", str(path), "--quantize", "int8", "--device", "meta"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "int8 quantization is for CPU inference" in err


def test_cli_eval_warns_in_one_line_when_the_memory_is_shorter_than_in_training(text_corpus, capsys) -> None:
    from transformer_xl.cli.eval import shorter_memory_warning

    path, model_dir, _ = text_corpus
    trained = TransformerXLLM.from_pretrained(model_dir).config.mem_len
    assert trained > 4
    assert main(["eval", str(model_dir), "--dataset", str(path), "--mem-len", f"0,4,{trained}",
                 "--max-tokens", "60"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and err[0].startswith("txl eval: warning: --mem-len 0,4 is shorter than the "
                                                f"{trained} this model was trained with")
    for argv in ([], ["--mem-len", str(trained)], ["--mem-len", str(2 * trained)]):
        assert main(["eval", str(model_dir), "--dataset", str(path), "--max-tokens", "60", *argv]) == 0
        assert "warning" not in capsys.readouterr().err
    assert shorter_memory_warning(96, [32]).count("\n") == 0 and shorter_memory_warning(0, [0]) is None


@pytest.mark.parametrize("speedup, said", [(0.48, True), (1.3, False)])  # eval rows on AVX2 and AMX: 0.4-0.5x
def test_cli_eval_says_in_one_line_when_int8_does_not_pay_for_its_rows(text_corpus, tmp_path, capsys, monkeypatch,
                                                                         speedup, said) -> None:
    """The probe measured for the command's rows (batch x segment); a ratio below 1 is said in one line, and the
    evaluation runs as asked."""
    from transformer_xl.model import int8

    path, model_dir, _ = text_corpus
    asked: list[tuple] = []
    monkeypatch.setattr(int8, "int8_speedup", lambda n_out, n_in, rows: asked.append((n_out, n_in, rows)) or speedup)
    out = tmp_path / "q.json"
    assert main(["eval", str(model_dir), "--dataset", str(path), "--split", "valid", "--quantize", "int8",
                 "--batch-size", "3", "--tgt-len", "7", "--json", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert [rows for *_, rows in asked] == [21] and json.loads(out.read_text())["loss"] > 0
    line = f"txl eval: int8 weights measured {speedup:.2f}x the speed of float32 on this CPU for products of 21 rows: "
    assert (line + "--quantize int8 saves memory here, not time\n" in err) == said
    assert main(["eval", str(model_dir), "--dataset", str(path), "--split", "valid", "--json", str(out),
                 "--no-progress"]) == 0 and len(asked) == 1  # no probe without --quantize


def test_a_model_whose_vocabulary_holds_wikitext2s_reads_its_test_set_as_its_own_ids(tmp_path, capsys) -> None:
    """WikiText-103's test articles are WikiText-2's: a WikiText-103 model (a vocabulary holding every WikiText-2
    symbol, in its own order) evaluates on WikiText-2's test file, each symbol read as the model's id for it, and
    scores what it scores on the same text written in its own ids."""
    from tests.helpers import tiny_model
    from transformer_xl.data import Vocab, load_corpus
    from transformer_xl.inference.evaluate import evaluate

    wt2 = load_corpus("wt2", cache_dir=tmp_path / "cache")
    symbols = [*reversed(wt2.vocab.idx2sym), "Valkyria-extra", "zzz-extra"]  # a superset, another order
    own = Vocab(symbols, special=["<eos>"], eos="<eos>", unk="<unk>")
    model = tiny_model(0, n_token=len(own), mem_len=8, tgt_len=8)
    model.save_pretrained(tmp_path / "m", vocab=own)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "m"), "--dataset", "wt2", "--split", "test", "--max-tokens", "400",
                 "--batch-size", "2", "--data-dir", str(tmp_path / "cache"), "--json", str(tmp_path / "r.json")]) == 0
    assert "read as the model's own ids" in capsys.readouterr().err
    got = json.loads((tmp_path / "r.json").read_text())
    remap = np.array([own.sym2idx[s] for s in wt2.vocab.idx2sym])
    want = evaluate(model, remap[wt2.splits["test"]], batch_size=2, max_tokens=400)
    assert got["loss"] == pytest.approx(want.loss, rel=1e-6) and got["tokens"] == want.tokens
