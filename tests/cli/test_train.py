"""txl train: flags, presets, config files and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import corpus_dir, one_line_error


def test_cli_train_errors_are_one_line(tmp_path, capsys) -> None:
    from txl.cli import main

    assert main(["train", "--preset", "wt103-bsae", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean 'wt103-base'" in err and "\n" not in err
    assert main(["train", "--preset", "tiny", "--batch-size", "6", "--batch-chunk", "4"]) == 2
    assert "not divisible" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert main(["train", "--preset", "enwik8-base", "--n-layer", "2", "--set", "cutoffs=[]", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["batch_size"] == 22 and cfg["model_overrides"] == {"n_layer": 2, "cutoffs": []}


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
    from txl.cli import main

    assert main(["train", *TINY_FLAGS, *flags]) == 2
    assert message in one_line_error(capsys, "txl train: error: ")


@pytest.mark.parametrize("name, content, message", [
    ("cut.toml", b'cutoffs = ["a"]\n', "cutoffs must be a list of integers"),
    ("bad.json", b'{"n_layer": "two"}', "n_layer must be a positive integer"),
    ("float.json", b'{"clip": 1e999}', "clip must be a finite number, got inf"),
    ("latin1.toml", b"lr = 1e-3 # \xe9t\xe9\n", "latin1.toml cannot be read ('utf-8' codec can't decode"),
])
def test_bad_config_files_are_one_line(tmp_path, capsys, name: str, content: bytes, message: str) -> None:
    from txl.cli import main

    (tmp_path / name).write_bytes(content)
    assert main(["train", "--config", str(tmp_path / name), "--print-config"]) == 2
    assert message in one_line_error(capsys, "txl train: error: ")


def test_set_none_and_out_dir_file(tmp_path, capsys) -> None:
    from txl.cli import main

    assert main(["train", *TINY_FLAGS, "--set", "max_minutes=None", "--set", "eval_max_tokens=null"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["max_minutes"] is None and cfg["eval_max_tokens"] is None
    (tmp_path / "f").write_text("x")
    assert main(["train", *TINY_FLAGS, "--out-dir", str(tmp_path / "f")]) == 2
    assert "out_dir " + str(tmp_path / "f") + " is a file, not a directory" in one_line_error(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_train_on_cuda_without_a_gpu(tmp_path, capsys) -> None:
    from txl.cli import main

    corpus = corpus_dir(tmp_path)
    assert main(["train", "--preset", "tiny", "--dataset", str(corpus), "--device", "cuda", "--out-dir",
                 str(tmp_path / "run"), "--set", f"data_dir={tmp_path}"]) == 2
    assert "CUDA is not available" in one_line_error(capsys, "txl train: error: ")
