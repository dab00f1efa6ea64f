"""txl train: flags, presets, config files and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import corpus_dir, one_line_error


def test_cli_train_errors_are_one_line(tmp_path, capsys) -> None:
    from transformer_xl.cli import main

    assert main(["train", "--preset", "wt103-bsae", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean 'wt103-base'" in err and "\n" not in err
    assert main(["train", "--preset", "tiny", "--batch-size", "6", "--batch-chunk", "4"]) == 2
    assert "not divisible" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert main(["train", "--preset", "enwik8-base", "--n-layer", "2", "--set", "cutoffs=[]", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["batch_size"] == 22 and cfg["model_overrides"] == {"n_layer": 2, "cutoffs": []}


def _txl(args: list[str], env: dict, **kw):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "transformer_xl", *args], env=env, capture_output=True, text=True,
                          timeout=180, **kw)


@pytest.mark.integration
@pytest.mark.slow
def test_two_processes_never_share_a_run_directory(tmp_path, word_corpus) -> None:
    """A running `txl train` holds its run: a second fresh run and a resume are refused in one line naming it;
    once it has stopped, a resume takes the directory over."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import subprocess_env
    from tests.helpers import tiny_train_config as tiny_cfg

    run = tmp_path / "run"
    cfg = tiny_cfg(run, dataset=str(word_corpus), max_step=100000, save_interval=3, eval_interval=100000)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    env = subprocess_env(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "transformer_xl", "train", "--config", str(tmp_path / "cfg.json")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not list((run / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        for args in (["train", "--config", str(tmp_path / "cfg.json")], ["train", "--resume", str(run)]):
            r = _txl(args, env)
            assert r.returncode == 2, r.stderr
            assert f"is in use by pid {first.pid}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0, err
    step = int(sorted((run / "checkpoints").glob("step_*"))[-1].name[5:])
    r = _txl(["train", "--resume", str(run), "--max-step", str(step + 2)], env)
    assert r.returncode == 0, r.stderr
    assert len(list((run / "checkpoints").glob("step_*"))) <= cfg.keep_checkpoints


@pytest.mark.integration
@pytest.mark.slow
def test_a_refused_resume_changes_nothing_and_a_plain_one_still_works(tmp_path, word_corpus) -> None:
    from tests.helpers import subprocess_env
    from tests.helpers import tiny_train_config as tiny_cfg

    run = tmp_path / "run"
    (tmp_path / "cfg.json").write_text(tiny_cfg(run, dataset=str(word_corpus), max_step=2).to_json())
    env = subprocess_env(tmp_path)
    assert _txl(["train", "--config", str(tmp_path / "cfg.json")], env).returncode == 0
    config = (run / "config.json").read_bytes()
    r = _txl(["train", "--resume", str(run), "--optim", "sgd"], env)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"txl train: error: cannot change optim on --resume: {run} was trained with optim='adam' (it fixes the "
        "optimizer state's form); start a new run with another --out-dir"]
    assert (run / "config.json").read_bytes() == config
    r = _txl(["train", "--resume", str(run), "--max-step", "3", "--lr", "0.01"], env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    # update 3 of a cosine schedule over 3 steps runs with its value at step 2, now from lr 0.01
    assert [x["lr"] for x in lines if x["kind"] == "train"][-1] == pytest.approx(0.01 * 0.25)


TINY_FLAGS = ["--preset", "tiny", "--print-config"]


@pytest.mark.parametrize("flags, message", [
    (["--seed", "-1"], "seed must be in [0, 2**32 - 1], got -1"),
    (["--seed", str(2**64)], "seed must be in [0, 2**32 - 1]"),
    (["--seed", "1e20"], "argument --seed: expected int, got '1e20'"),
    (["--clip", "nan"], "clip must be a finite number, got nan"),
    (["--lr", "inf"], "lr must be a finite number, got inf"),
    (["--mom", "nan"], "mom must be a finite number"),
    (["--eta-min=-inf"], "eta_min must be a finite number"),
    (["--decay-rate", "nan"], "decay_rate must be a finite number"),
    (["--max-minutes", "inf"], "max_minutes must be a finite number"),
    (["--clamp-len", "-100"], "clamp_len must be an integer >= -1 (-1 or 0: no clamping), got -100"),
    (["--mem-len", "-5"], "mem_len must be an integer >= 0, got -5"),
    (["--dropout", "nan"], "dropout must be in [0, 1), got nan"),
    (["--init-std", "-1"], "init_std must be a finite number >= 0"),
    (["--set", "n_layer=two"], "n_layer must be a positive integer, got 'two'"),
    (["--set", "tie_weight=1"], "tie_weight must be true or false, got 1"),
    (["--set", 'cutoffs=["a"]'], "cutoffs must be a list of integers, got ['a']"),
    (["--set", "cutoffs=5"], "cutoffs must be a list of integers, got 5"),
    (["--set", "sample_softmax=-2"], "sample_softmax must be an integer >= -1"),
])
def test_print_config_validates_every_value(capsys, flags: list[str], message: str) -> None:
    from transformer_xl.cli import main

    assert main(["train", *TINY_FLAGS, *flags]) == 2
    assert message in one_line_error(capsys, "txl train: error: ")


@pytest.mark.parametrize("name, content, message", [
    ("cut.toml", b'cutoffs = ["a"]\n', "cutoffs must be a list of integers"),
    ("bad.json", b'{"n_layer": "two"}', "n_layer must be a positive integer"),
    ("float.json", b'{"clip": 1e999}', "clip must be a finite number, got inf"),
    ("latin1.toml", b"lr = 1e-3 # \xe9t\xe9\n", "latin1.toml cannot be read ('utf-8' codec can't decode"),
])
def test_bad_config_files_are_one_line(tmp_path, capsys, name: str, content: bytes, message: str) -> None:
    from transformer_xl.cli import main

    (tmp_path / name).write_bytes(content)
    assert main(["train", "--config", str(tmp_path / name), "--print-config"]) == 2
    assert message in one_line_error(capsys, "txl train: error: ")


def test_set_none_and_out_dir_file(tmp_path, capsys) -> None:
    from transformer_xl.cli import main

    assert main(["train", *TINY_FLAGS, "--set", "max_minutes=None", "--set", "eval_max_tokens=null"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["max_minutes"] is None and cfg["eval_max_tokens"] is None
    (tmp_path / "f").write_text("x")
    assert main(["train", *TINY_FLAGS, "--out-dir", str(tmp_path / "f")]) == 2
    assert "out_dir " + str(tmp_path / "f") + " is a file, not a directory" in one_line_error(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_train_on_cuda_without_a_gpu(tmp_path, capsys) -> None:
    from transformer_xl.cli import main

    corpus = corpus_dir(tmp_path)
    assert main(["train", "--preset", "tiny", "--dataset", str(corpus), "--device", "cuda", "--out-dir",
                 str(tmp_path / "run"), "--set", f"data_dir={tmp_path}"]) == 2
    assert "CUDA is not available" in one_line_error(capsys, "txl train: error: ")


def test_no_progress_prints_plain_lines_and_a_finished_run_is_not_rerun(tmp_path, word_corpus, capsys) -> None:
    from tests.helpers import tiny_train_config as tiny_cfg
    from transformer_xl.cli import main

    run = tmp_path / "run"
    cfg = tiny_cfg(run, dataset=str(word_corpus), max_step=4, log_interval=2, progress=True, final_eval=False)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    assert main(["train", "--config", str(tmp_path / "cfg.json"), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("train: step")]
    assert [ln.split(" | ")[0] for ln in lines] == ["train: step 2/4 (50%)", "train: step 4/4 (100%)"]
    for field in ("loss ", "ppl ", "lr ", "tok/s ", "ETA "):
        assert all(f" | {field}" in ln for ln in lines), (field, lines)
    assert "\r" not in err and "done in" in out
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == (f"txl train: {run} already finished at step 4 (max_step 4); raise --max-step to "
                                 "continue\n")
    assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing re-run
    assert main(["train", "--resume", str(run), "--max-step", "6"]) == 0  # continues
    assert "at step 6" in capsys.readouterr().out


def test_every_config_field_has_a_help_line() -> None:
    import dataclasses

    from transformer_xl.model import TXLConfig
    from transformer_xl.train.config import FIELD_HELP, MODEL_FIELD_HELP, TrainConfig

    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(FIELD_HELP)
    assert {f.name for f in dataclasses.fields(TXLConfig)} == set(MODEL_FIELD_HELP)
    assert all(text.strip() for text in [*FIELD_HELP.values(), *MODEL_FIELD_HELP.values()])


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subparsers(sub))


def test_every_option_of_every_command_has_help() -> None:
    from transformer_xl.cli import _build_parser

    missing = [f"{name} {action.option_strings[-1]}" for name, sub in _subparsers(_build_parser())
               for action in sub._actions if action.option_strings and not (action.help or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_train_help_shows_choices_descriptions_and_defaults(capsys) -> None:
    import re

    from transformer_xl.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--optim {adam,sgd,adagrad}", "--scheduler {cosine,inv_sqrt,constant,dev_perf}",
                 "--precision {fp32,bf16,fp16,auto}", "--device {auto,cpu,cuda,cuda:N}", "--level {word,char,byte}"):
        assert flag in out
    options = out.split("\noptions:\n", 1)[1].split("\ntraining presets:", 1)[0]
    # an option line either carries its help on the same line or the next, indented deeper
    lines = options.splitlines()
    bare = [ln.strip() for i, ln in enumerate(lines) if re.match(r"^  --\S+(?: \S+)?(?:, --\S+)?$", ln)
            and not (i + 1 < len(lines) and re.match(r"^ {10,}\S", lines[i + 1]))]
    assert not bare, f"options without help text: {bare}"
    assert "--max-step MAX_STEP   training steps (default: 100000; a preset changes it)" in out


def test_own_text_trains_at_char_level_and_eval_uses_the_runs_level(tmp_path, monkeypatch, capsys) -> None:
    from transformer_xl.cli import main

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "mine"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat\nand the dog ran\n" * 60)
    run = tmp_path / "run"
    tiny = ["--preset", "tiny", "--max-step", "2", "--n-layer", "1", "--d-model", "16", "--d-head", "8", "--n-head",
            "2", "--d-inner", "32", "--tgt-len", "8", "--mem-len", "8", "--no-final-eval", "--eval-max-tokens", "50",
            "--eval-interval", "2", "--no-progress", "--out-dir", str(run)]
    assert main(["train", "--dataset", str(corpus), "--level", "char", "--valid-fraction", "0.1", *tiny]) == 0
    cfg = json.loads((run / "config.json").read_text())["train"]
    assert cfg["level"] == "char" and cfg["valid_fraction"] == 0.1
    capsys.readouterr()
    assert main(["eval", str(run), "--dataset", str(corpus), "--max-tokens", "40"]) == 0
    assert "bpc" in capsys.readouterr().out  # the run's char level (and its fraction): the model's vocabulary
    assert main(["train", "--resume", str(run), "--level", "word", "--max-step", "3"]) == 2
    assert "cannot change level on --resume" in one_line_error(capsys)


def test_user_text_flags_on_a_registered_dataset_are_refused(capsys) -> None:
    from transformer_xl.cli import main

    assert main(["train", "--preset", "wt2-cpu", "--level", "char", "--print-config"]) == 2
    assert "level applies to your own text only; wt2 is a known dataset" in one_line_error(capsys)
    assert main(["train", "--preset", "tiny", "--dataset", "x", "--level", "char", "--tokenizer", "t.json",
                 "--print-config"]) == 2
    assert "give level or tokenizer, not both" in one_line_error(capsys)


@pytest.mark.parametrize("value", ["null", "None", "none"])
def test_set_null_or_none_clears_a_value(capsys, value: str) -> None:
    from transformer_xl.cli import main

    assert main(["train", "--preset", "wt2-cpu", "--set", f"save_minutes={value}", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["save_minutes"] is None


@pytest.mark.parametrize("level, metric", [("word", "ppl"), ("char", "bpc")])
def test_each_score_says_what_it_covers_and_done_is_the_whole_commands_time(tmp_path, word_corpus, monkeypatch,
                                                                            capsys, level, metric) -> None:
    """Validation during training reads the first eval_max_tokens tokens, the final evaluation the whole splits:
    each printed score says which. "done in" is the command's wall time, the final evaluation (slowed down here)
    included, and says what it was spent on. results.json and the lines name the unit's metric: ppl for words, bpc
    for characters (no bpc of a word-level model)."""
    import math
    import re
    import time

    from tests.helpers import tiny_train_config as tiny_cfg
    from transformer_xl.cli import main
    from transformer_xl.train import validation

    real = validation.score_split

    def slow(*args, **kwargs):  # the final evaluation's splits (validation during training is bound elsewhere)
        time.sleep(0.8)
        return real(*args, **kwargs)

    monkeypatch.setattr(validation, "score_split", slow)
    run = tmp_path / "run"
    cfg = tiny_cfg(run, dataset=str(word_corpus), level=level, max_step=4, eval_max_tokens=50, final_eval=True)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    began = time.monotonic()
    assert main(["train", "--config", str(tmp_path / "cfg.json"), "--no-progress"]) == 0
    wall = (time.monotonic() - began) / 60
    out, err = capsys.readouterr()
    assert re.search(rf"^step 4: valid \(first 50 tokens\) loss [\d.]+, {metric} [\d.]+ \(best\)$", out, re.M), out
    done = re.search(rf"^txl train: done in ([\d.]+) min \(training ([\d.]+) min, final evaluation ([\d.]+) min\) at "
                     rf"step 4; best model \({run}/best, step 4\): valid {metric} \(whole split, ([\d,]+) tokens\) "
                     rf"[\d.]+, test {metric} \(whole split, ([\d,]+) tokens\) [\d.]+$", out, re.M)
    assert done, out
    total, training, evaluation = (float(done.group(i)) for i in (1, 2, 3))
    assert evaluation >= 0.02 and training + evaluation <= total + 0.01 and total <= wall + 0.005
    assert f"txl train: final evaluation of {run}/best on the whole splits (valid " in err
    results = json.loads((run / "results.json").read_text())
    assert results["metric"] == metric and results["final"]["minutes"] == evaluation
    for split, shown in (("valid", done.group(4)), ("test", done.group(5))):
        got = results["final"][split]
        assert shown == f"{got['tokens']:,}"
        assert ("bpc" in got) is (level == "char") and got["ppl"] == pytest.approx(math.exp(got["loss"]))
        if level == "char":
            assert got["bpc"] == pytest.approx(got["loss"] / math.log(2))
