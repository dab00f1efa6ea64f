"""The seed x variant loop the experiments share: results written once and read back, a signal stops the grid."""

from __future__ import annotations

import json

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.grid import run_seed_grid


class _Model:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_pretrained(self, path, vocab=None) -> None:
        self.saved.append(str(path))


def _grid(tmp_path, trained, *, stop_at=None, lines=None, read=lambda r: r):
    def train(seed, v, run_dir, label):
        trained.append((seed, v, run_dir.name, label))
        return _Model(), {"steps": 3, "stopped": "signal" if (seed, v) == stop_at else "max_step"}

    def evaluate(seed, v, model, log):
        return {"variant": v, "seed": seed, "steps": log["steps"], "distances": {7: 1.0}}

    return run_seed_grid(tmp_path, ["a", "b"], [0, 1], name=lambda v: f"v-{v}", train=train, evaluate=evaluate,
                         vocab=None, read=read, done=lambda r: f"{r['steps']} steps",
                         log=None if lines is None else lines.append)


def test_every_seed_and_variant_once_then_read_back(tmp_path) -> None:
    trained, lines = [], []
    rows = _grid(tmp_path, trained, lines=lines)
    assert [(r["seed"], r["variant"]) for r in rows] == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert trained[0] == (0, "a", "run", "seed 0 v-a")
    assert "seed 1 v-b: 3 steps" in lines and all("eval_minutes" in r for r in rows)
    assert json.loads((tmp_path / "seed1" / "v-b" / "result.json").read_text())["seed"] == 1
    trained.clear()
    lines.clear()
    again = _grid(tmp_path, trained, lines=lines, read=lambda r: {**r, "distances": {int(k): v for k, v in
                                                                                    r["distances"].items()}})
    assert trained == [] and lines[0] == "seed 0 v-a: done before, skipped"
    assert again == rows  # the read hook gives back what a fresh run returned (int keys)


def test_a_signal_stops_the_grid_without_a_result(tmp_path) -> None:
    trained, lines = [], []
    with pytest.raises(KeyboardInterrupt):
        _grid(tmp_path, trained, stop_at=(0, "b"), lines=lines)
    assert lines[-1] == ("seed 0 v-b: stopped on a signal at step 3 (checkpoint saved); run the same command again "
                         "to continue")
    assert (tmp_path / "seed0" / "v-a" / "result.json").is_file()
    assert not (tmp_path / "seed0" / "v-b" / "result.json").exists()
    assert len(trained) == 2  # seed 1 not started


def test_no_seed_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="seed"):
        run_seed_grid(tmp_path, ["a"], [], name=str, train=None, evaluate=None, vocab=None)
