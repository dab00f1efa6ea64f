"""txl plot: the learning curves of a finished run as a PNG, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import tiny_train_config
from transformer_xl.cli import main


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny training run of 4 steps (train and valid records in its metrics.jsonl)."""
    from tests.helpers import corpus_dir
    from transformer_xl.data import load_corpus
    from transformer_xl.train import Trainer

    root = tmp_path_factory.mktemp("plot")
    corpus = load_corpus(str(corpus_dir(root)), cache_dir=root / "cache")
    Trainer(tiny_train_config(root / "run", max_step=4, eval_interval=2, save_interval=4), corpus=corpus).fit()
    return root / "run"


def test_plot_prints_the_png_path(finished_run, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    kinds = [json.loads(line)["kind"] for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("train") == 4 and kinds.count("valid") == 2
    out = tmp_path / "figs" / "X.png"
    assert main(["plot", str(finished_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and out.stat().st_size > 10_000


def test_plot_defaults_to_the_run_directory(finished_run, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "copy"
    run.mkdir()
    for name in ("metrics.jsonl", "config.json"):
        (run / name).write_bytes((finished_run / name).read_bytes())
    assert main(["plot", str(run), "--title", "a title"]) == 0
    assert capsys.readouterr().out.strip() == str(run / "curves.png")
    assert (run / "curves.png").stat().st_size > 10_000


def test_a_directory_without_metrics_is_a_one_line_error(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("txl plot: error: ") and len(err.splitlines()) == 1
    assert f"{tmp_path / 'metrics.jsonl'} not found" in err
    assert captured.out == "" and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("content, message", [
    ('{"kind": "train", "step": 1}\nnot json\n{"kind": "event"}\n', "metrics.jsonl:2 is not JSON"),
    ('{"kind": "event", "step": 0, "event": "resume"}\n', "holds no train/valid records yet"),
])
def test_unreadable_metrics_are_one_line_errors(tmp_path, capsys, content: str, message: str) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_text(content, encoding="utf-8")
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txl plot: error: ") and message in err and len(err.splitlines()) == 1
