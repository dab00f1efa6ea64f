"""txl experiment / txl recl / txl bench eval-speed from the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import MODEL_ARG_KINDS, assert_model_note, eval_model, model_arg, one_line_error
from transformer_xl.cli import main


def _word_file(path, lines: int):
    rng = np.random.default_rng(0)
    path.write_text("\n".join(" ".join(rng.choice([f"w{i}" for i in range(20)], 10)) for _ in range(lines)) + "\n")
    return path


def test_cli_experiments(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    path = _word_file(tmp_path / "corpus.txt", 400)
    out = tmp_path / "abl"
    argv = ["experiment", "ablation", "--dataset", str(path), "--variants", "rec-ours-full,norec-ours-half",
            "--tgt-len", "8", "--steps", "2", "--batch-size", "4", "--seeds", "0,3", "--attn-max", "16",
            "--eval-tokens", "200", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    assert "Ours" in (out / "ablations.md").read_text() and "± " in (out / "ablations.md").read_text()
    assert main([*argv[:5], "table6-core", *argv[6:-2], "--seeds", "0", "--out", str(out)]) == 0
    assert (out / "table6-core.md").is_file() and (out / "ablations.md").is_file()  # one report per set
    row = json.loads((out / "seed3" / "norec-ours-half" / "result.json").read_text())
    assert row["seed"] == 3 and row["window_len"] == 8 and row["attn_search"]["step"] == 2  # T // 4
    assert row["attn_search"]["max_len"] == 16 and row["attn_search"]["rel_tol"] == 1e-3
    doc = json.loads((out / "ablations.json").read_text())
    assert [a["seeds"] for a in doc["aggregate"]] == [[0, 3], [0, 3]] and len(doc["rows"]) == 4
    assert doc["attn_search"] == {"step": 2, "max_len": 16, "rel_tol": 1e-3} and doc["command"]["seeds"] == [0, 3]
    capsys.readouterr()
    for variants, message in (("rec-nope-full", "bad variant"), ("table7", "One Billion Word, which was not run")):
        assert main(["experiment", "ablation", "--dataset", str(path), "--variants", variants, "--out",
                     str(out)]) == 2
        assert message in capsys.readouterr().err


def test_cli_eval_speed_under_both_names(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")  # eval-speed plots its table
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    path = _word_file(tmp_path / "corpus.txt", 400)
    for command in (["experiment", "eval-speed"], ["bench", "eval-speed"]):  # the same command, two names
        speed = tmp_path / "-".join(command)
        assert main([*command, "--dataset", str(path), "--model-preset", "tiny", "--attn-lens", "8",
                     "--tgt-len", "4", "--xl-batch", "2", "--xl-segments", "2", "--rows", "4", "--repeats", "1",
                     "--out", str(speed)]) == 0
        assert json.loads((speed / "eval-speed.json").read_text())[0]["attn_len"] == 8


def test_cli_recl(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("matplotlib")
    from transformer_xl.cli import main
    from transformer_xl.data import load_corpus

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(rng.choice([f"w{i}" for i in range(20)], 10)) for _ in range(300)) + "\n")
    n_token = len(load_corpus(str(path)).vocab)
    eval_model(0, n_token=n_token).save_pretrained(tmp_path / "xl")
    eval_model(3, n_token=n_token, tgt_len=12).save_pretrained(tmp_path / "van")
    argv = ["recl", "--model", f"xl={tmp_path / 'xl'}", "--model", f"van={tmp_path / 'van'}", "--dataset", str(path),
            "--grid", "4:16:4", "--tokens", "100", "--resamples", "20", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "out" / "recl.json").read_text())
    assert set(doc["recl"]) == {"xl", "van"} and doc["max_context"]["van"] == 12
    assert doc["method"] == "window" and doc["models"]["xl"]["method"] == "window"  # the default, for XL too
    assert doc["contexts"] == [4, 8, 12, 16] and doc["grid_step"] == 4
    assert doc["receptive_field"]["tokens"] == {"xl": [4, 8, 12, 16], "van": [4, 8, 12, 12]}
    assert "exactly the c previous tokens" in doc["receptive_field"]["statement"]
    assert doc["bootstrap"]["resamples"] == 20 and doc["bootstrap"]["seed"] == 0
    assert set(doc["bootstrap"]["recl_interval"]["xl"]) == {"0.1", "0.5", "1.0"}
    assert doc["top_tokens"] == {"0.1": 10, "0.5": 50, "1.0": 100} and doc["tgt_len"] is None
    md = (tmp_path / "out" / "recl.md").read_text()
    assert (tmp_path / "out" / "recl.png").is_file() and "r = 0.1" in md
    assert "by `window`" in md and "uniform, Δ = 4" in md and " ± " in md and "resamples" in md
    assert main(argv) == 0  # resumes from the cache
    capsys.readouterr()

    # the attention-length method (alias memory), stated with its receptive field; a non-uniform grid warns
    mem = [*argv[:5], "--dataset", str(path), "--contexts", "4,8,16", "--tokens", "60", "--tgt-len", "4",
           "--method", "memory", "--resamples", "0", "--out", str(tmp_path / "mem")]
    assert main(mem) == 0
    assert "the grid 4,8,16 is not uniform" in capsys.readouterr().err
    doc = json.loads((tmp_path / "mem" / "recl.json").read_text())
    assert doc["method"] == "attention-length" and doc["grid_step"] is None and doc["bootstrap"] is None
    assert doc["receptive_field"]["tokens"]["xl"] == [7, 15, 31]  # n_layer 2: 2 * (c - 1) + 1
    assert "n_layer*(c-1)+1" in doc["receptive_field"]["statement"] and doc["tgt_len"] == 4
    assert "NOT uniform" in (tmp_path / "mem" / "recl.md").read_text()

    # one method for the whole group
    for extra, message in ((["--method", "xl=window"], "not one per model"),
                           (["--method", "window", "--method", "attention-length"], "measured by one method"),
                           (["--method", "nearest"], "method must be one of"),
                           (["--device", "nowhere"], "unknown device 'nowhere'")):
        assert main([*argv[:-2], "--out", str(tmp_path / "o2"), *extra]) == 2
        assert message in one_line_error(capsys)
    assert not (tmp_path / "o2").exists()
    import torch

    if not torch.cuda.is_available():  # --device is checked before anything is read
        assert main([*argv[:-2], "--out", str(tmp_path / "o2"), "--device", "cuda"]) == 2
        assert "CUDA is not available" in one_line_error(capsys)


@pytest.mark.parametrize("argv, message", [
    (["recl", "--model", "a=x", "--dataset", "wt2", "--contexts", "8", "--tokens=-5", "--out", "o"],
     "argument --tokens: expected a positive integer, got '-5'"),
    (["recl", "--model", "a=x", "--dataset", "wt2", "--contexts", "8", "--r", "nan", "--out", "o"],
     "--r must hold finite numbers"),
    (["recl", "--model", "a=x", "--dataset", "wt2", "--grid", "8:30:8", "--out", "o"], "is not a multiple of STEP"),
    (["recl", "--model", "a=x", "--dataset", "wt2", "--grid", "8:32:8", "--resamples=-1", "--out", "o"],
     "argument --resamples: expected an integer >= 0"),
    (["experiment", "ablation", "--steps=-1", "--out", "o"], "argument --steps: expected a positive integer"),
    (["experiment", "ablation", "--lr", "inf", "--out", "o"], "argument --lr: expected a finite number"),
    (["experiment", "ablation", "--seeds=0,-1", "--out", "o"], "argument --seeds: expected a seed in [0, 2**32 - 1]"),
    (["experiment", "ablation", "--seeds", "1,1", "--out", "o"], "argument --seeds: expected distinct seeds"),
    (["experiment", "ablation", "--attn-tol", "nan", "--out", "o"], "argument --attn-tol: expected a finite number"),
    (["experiment", "ablation", "--device", "nope", "--out", "o"], "unknown device 'nope'"),
    (["experiment", "eval-speed", "--repeats", "0"], "argument --repeats: expected a positive integer"),
    (["experiment", "eval-speed", "--n-layer", "0"], "argument --n-layer: expected a positive integer"),
])
def test_impossible_numbers_are_one_line(tmp_path, monkeypatch, capsys, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in one_line_error(capsys)



@pytest.mark.parametrize("command, kind", [(["recl"], k) for k in MODEL_ARG_KINDS] + [(["experiment", "recl"], "run")])
def test_recl_takes_a_model_checkpoint_or_run_directory(trained_run, tmp_path, monkeypatch, capsys, command,
                                                        kind) -> None:
    pytest.importorskip("matplotlib")  # txl recl plots its curve
    run, corpus = trained_run
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    path = model_arg(run, kind, tmp_path)
    assert main([*command, "--model", f"xl={path}", "--dataset", str(corpus), "--contexts", "4,8", "--tokens", "40",
                 "--tgt-len", "4", "--out", str(tmp_path / "out")]) == 0
    assert_model_note(capsys.readouterr().err, f"txl {' '.join(command)}: model xl", run, kind)
    assert json.loads((tmp_path / "out" / "recl.json").read_text())["models"]["xl"]["path"] == str(path)

