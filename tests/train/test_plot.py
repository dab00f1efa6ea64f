"""Learning-curve plots of a run directory: reading metrics.jsonl and writing the PNG."""

from __future__ import annotations

import json
import math

import pytest

from transformer_xl.errors import DataError
from transformer_xl.train.plot import plot_run, read_metrics


def _write_run(run, *, metric: str = "ppl", config: bool = True):
    """A hand-written run directory: 6 train records, 2 valid ones, an event and the final record."""
    run.mkdir(parents=True, exist_ok=True)
    records = []
    for step in range(1, 7):
        records.append({"kind": "train", "step": step, "time": 20.0 * step, "train_loss": 4.0 - 0.3 * step,
                        "lr": 1e-3 * step / 6, "tokens_per_s": 900.0 + step, "grad_norm": 0.5, "tokens": 24 * step,
                        "nonfinite": 0})
        if step % 3 == 0:
            loss = 3.5 - 0.2 * step
            value = math.exp(loss) if metric == "ppl" else loss / math.log(2)
            records.append({"kind": "valid", "step": step, "time": 20.0 * step, "valid_loss": loss,
                            f"valid_{metric}": value, "tokens": 100, "best": True})
    records.insert(3, {"kind": "event", "step": 2, "time": 40.0, "event": "nonfinite", "loss": None})
    records.append({"kind": "final", "step": 6, "time": 130.0, "model": "best"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    if config:
        (run / "config.json").write_text(json.dumps({"train": {"model": "tiny", "preset": None, "dataset": "ptb",
                                                               "batch_size": 4}, "parameters": 123_456}))
    return records


@pytest.fixture
def figures(monkeypatch):
    """The figures plot_run closes (so a test can read their titles and labels)."""
    plt = pytest.importorskip("matplotlib.pyplot")
    closed = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
    return closed


def test_read_metrics_returns_every_record_in_order(tmp_path) -> None:
    records = _write_run(tmp_path / "run")
    path = tmp_path / "run" / "metrics.jsonl"
    path.write_text(path.read_text() + "\n   \n", encoding="utf-8")  # blank lines are skipped
    assert read_metrics(tmp_path / "run") == records
    assert read_metrics(str(tmp_path / "run")) == records


def test_read_metrics_without_the_file(tmp_path) -> None:
    with pytest.raises(DataError, match=r"metrics\.jsonl not found: RUN_DIR must be a `txl train` output"):
        read_metrics(tmp_path)


def test_read_metrics_names_the_line_that_is_not_json(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n{"kind": "tr\n{"step": 2}\n')
    with pytest.raises(DataError, match=r"metrics\.jsonl:2 is not JSON"):
        read_metrics(tmp_path)


def test_read_metrics_skips_a_torn_last_line_saying_so(tmp_path, capsys) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n\n{"kind": "tr\n', encoding="utf-8")
    assert read_metrics(tmp_path) == [{"kind": "train", "step": 1}]
    assert capsys.readouterr().err.count("skipping the torn last line") == 1


def test_plot_run_writes_a_png(tmp_path, figures) -> None:
    _write_run(tmp_path / "run")
    out = plot_run(tmp_path / "run", tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and out.stat().st_size > 10_000
    (fig,) = figures
    assert fig._suptitle.get_text() == "tiny on ptb (0.12M parameters, batch 4)"  # from config.json
    step_axes, time_axes = fig.axes[0], fig.axes[1]
    labels = step_axes.get_legend_handles_labels()[1]
    assert labels == ["train loss", f"valid loss (best 2.300 = ppl {math.exp(2.3):.3g})"]
    train_line, valid_line = step_axes.get_lines()
    assert list(train_line.get_xdata()) == [1, 2, 3, 4, 5, 6] and list(valid_line.get_xdata()) == [3, 6]
    assert list(time_axes.get_lines()[0].get_xdata()) == pytest.approx([20 * s / 60 for s in range(1, 7)])  # minutes
    assert list(fig.axes[2].get_lines()[0].get_ydata()) == pytest.approx([1e-3 * s / 6 for s in range(1, 7)])


def test_plot_run_default_path_title_and_bpc(tmp_path, figures) -> None:
    _write_run(tmp_path / "run", metric="bpc", config=False)
    out = plot_run(tmp_path / "run", title="my run")
    assert out == tmp_path / "run" / "curves.png" and out.is_file()
    (fig,) = figures
    assert fig._suptitle.get_text() == "my run"
    assert f"bpc {2.3 / math.log(2):.3g}" in fig.axes[0].get_legend_handles_labels()[1][1]


def test_plot_run_of_a_run_with_validation_only(tmp_path, figures) -> None:
    _write_run(tmp_path / "run", config=False)
    path = tmp_path / "run" / "metrics.jsonl"
    path.write_text("".join(ln + "\n" for ln in path.read_text().splitlines() if '"valid"' in ln))
    assert plot_run(tmp_path / "run").is_file()
    assert figures[0]._suptitle is None  # no config.json, no title


@pytest.mark.parametrize("content", ["", '{"kind": "event", "step": 0, "event": "resume"}\n{"kind": "final"}\n'])
def test_plot_run_refuses_a_run_without_train_or_valid_records(tmp_path, content: str) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="holds no train/valid records yet"):
        plot_run(tmp_path)
    assert not (tmp_path / "curves.png").exists()


def test_plot_run_without_metrics(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    with pytest.raises(DataError, match="not found"):
        plot_run(tmp_path)
