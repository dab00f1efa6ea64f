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


def test_plot_writes_over_no_file_that_is_not_a_png(tmp_path, capsys) -> None:
    """``--out RUN/metrics.jsonl`` (a slip of the shell) is refused in one line naming --force, before the run is
    read, the file untouched; a directory likewise; --force moves the file aside to OUT.old-1 (never deletes it)."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"kind": "train", "step": s, "time": float(s), "train_loss": 3.0 / s,
                                           "lr": 0.1, "tokens_per_s": 100.0, "grad_norm": 1.0}) + "\n"
                               for s in (1, 2)))
    before = metrics.read_bytes()
    for out in (metrics, run):
        assert main(["plot", str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == (f"txl plot: error: {out} exists and is not a PNG: refusing to write over it; give another "
                       f"--out, or --force to move it aside to {out}.old-1\n")
    assert metrics.read_bytes() == before and sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]
    assert main(["plot", str(run), "--out", str(run / "curves.png")]) == 0
    assert main(["plot", str(run), "--out", str(run / "curves.png")]) == 0  # its own PNG: replaced
    assert main(["plot", str(run), "--out", str(metrics), "--force"]) == 0
    moved = run / "metrics.jsonl.old-1"
    assert f"txl plot: moved the old {metrics} aside to {moved} (--force)" in capsys.readouterr().err
    assert moved.read_bytes() == before and sorted(p.name for p in run.iterdir()) == [
        "curves.png", "metrics.jsonl", "metrics.jsonl.old-1"]
    assert metrics.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
