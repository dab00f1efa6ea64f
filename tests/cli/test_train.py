"""txl train: flags, presets, config files and one-line errors."""

from __future__ import annotations

import json


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
