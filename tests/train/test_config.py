"""TrainConfig: one-line errors for impossible values, TOML/JSON files, run configs."""

from __future__ import annotations

import json

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.train import TrainConfig
from transformer_xl.train.config import read_config_file


# ------------------------------------------------------------------ config errors (before any work)
@pytest.mark.parametrize(("values", "match"), [
    ({"lr": -1}, "lr must be > 0"),
    ({"batch_size": 6, "batch_chunk": 4}, "not divisible by batch_chunk"),
    ({"mem_lenn": 3}, "did you mean 'mem_len'"),
    ({"max_stpe": 3}, "did you mean 'max_step'"),
    ({"optim": "adamw"}, "optim must be one of"),
    ({"scheduler": "cosin"}, "did you mean 'cosine'"),
    ({"batch_size": "8"}, "batch_size must be int"),
    ({"eval_tgt_len": 0}, "eval_tgt_len must be >= 1"),
    *[({name: value}, f"{name} must be a finite number, got {value}") for name in
      ("lr", "mom", "eta_min", "decay_rate", "lr_min", "clip", "max_minutes") for value in ("nan", "inf", "-inf")],
    ({"seed": -1}, r"seed must be in \[0, 2\*\*32 - 1\], got -1"),
    ({"seed": 2**32}, "seed must be in"),
])
def test_bad_config_values_fail_with_one_line(values, match) -> None:
    values = {k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in values.items()}
    with pytest.raises(ConfigError, match=match) as info:
        TrainConfig.from_dict(values)
    assert "\n" not in str(info.value)


def test_config_file_toml_and_run_config(tmp_path) -> None:
    (tmp_path / "run.toml").write_text('preset = "wt2-cpu"\nlr = 3e-4\nn_layer = 2\n[model_overrides]\nd_inner = 96\n')
    from transformer_xl.train.presets import train_preset

    flat = read_config_file(tmp_path / "run.toml")
    cfg = TrainConfig.from_dict(flat, base=train_preset(flat["preset"]))
    assert cfg.lr == 3e-4 and cfg.max_step == 600
    assert cfg.model_overrides == {"pre_lnorm": True, "n_layer": 2, "d_inner": 96}
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    (tmp_path / "config.json").write_text(json.dumps({"train": cfg.to_dict(), "model": {"n_token": 9, "n_layer": 2}}))
    assert TrainConfig.from_dict(read_config_file(tmp_path / "config.json")).model_overrides["n_layer"] == 2
