"""Run outputs: metrics.jsonl records, their trimming on resume, nothing off rank 0, the progress bar."""

from __future__ import annotations

import json
import math
import sys

import pytest

from tests.helpers import tiny_train_config
from transformer_xl.train.metrics import LossWindow, RunLog, postfix, progress, publish_model

VAL = {"loss": 2.0, "ppl": math.exp(2.0), "bpc": 2.0 / math.log(2), "tokens": 120}


def _records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def _log_steps(log: RunLog, steps, loss: float = 3.0) -> None:
    for step in steps:
        log.train(step, step * 0.5, loss, 1e-3, 1000.0, 0.5, step * 24, 0)


def test_records_are_json_lines_with_their_keys(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = RunLog(run, True, tiny_train_config(run), resumed_at=None)
    log.train(1, 0.12345, 3.5, 1e-3, 1234.56, 0.75, 24, 2)
    log.valid(2, 1.0, VAL, "ppl", True)
    log.valid(4, 2.0, VAL, "bpc", False)
    log.event(3, 1.5, "nonfinite", loss=math.inf, grad_norm=1.0)
    log.final(4, 2.5, {"model": "best", "valid": {"loss": 2.0}})
    log.close()
    train, valid, valid_bpc, event, final = _records(run)
    assert train == {"kind": "train", "step": 1, "time": 0.123, "train_loss": 3.5, "lr": 1e-3, "tokens_per_s": 1234.6,
                     "grad_norm": 0.75, "tokens": 24, "nonfinite": 2}
    assert valid == {"kind": "valid", "step": 2, "time": 1.0, "valid_loss": 2.0, "valid_ppl": VAL["ppl"],
                     "tokens": 120, "best": True}
    assert valid_bpc["valid_bpc"] == VAL["bpc"] and "valid_ppl" not in valid_bpc and valid_bpc["best"] is False
    assert event == {"kind": "event", "step": 3, "time": 1.5, "event": "nonfinite", "loss": math.inf, "grad_norm": 1.0}
    assert final == {"kind": "final", "step": 4, "time": 2.5, "model": "best", "valid": {"loss": 2.0}}
    out = capsys.readouterr().out
    assert "step 2: valid loss 2.0000, ppl 7.389 (best)" in out and "step 4: valid loss 2.0000, bpc 2.885\n" in out


def test_a_validation_line_says_what_it_covers(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = RunLog(run, True, tiny_train_config(run), resumed_at=None)
    log.valid(2, 1.0, VAL, "ppl", True, "first 20,000 tokens")
    log.valid(4, 2.0, VAL, "bpc", False, "whole split, 120 tokens")
    log.close()
    assert capsys.readouterr().out == ("step 2: valid (first 20,000 tokens) loss 2.0000, ppl 7.389 (best)\n"
                                       "step 4: valid (whole split, 120 tokens) loss 2.0000, bpc 2.885\n")
    assert "scope" not in _records(run)[0]  # metrics.jsonl keeps its keys (tokens says how many were scored)


def test_the_loss_window_averages_the_steps_since_the_last_line_and_round_trips(tmp_path) -> None:
    """The mean a log line reports, kept across a checkpoint: a window restored from its JSON state gives the same
    mean, to the bit, as the window it was saved from."""
    window, losses = LossWindow(), [3.1, 2.7000000000000006, 2.9, 1 / 3]
    assert math.isnan(window.pop())
    for loss in losses[:2]:
        window.add(loss)
    saved = json.loads(json.dumps(window.state_dict()))
    restored = LossWindow()
    restored.load_state_dict(saved)
    for w in (window, restored):
        for loss in losses[2:]:
            w.add(loss)
    assert window.pop() == restored.pop() == (((3.1 + 2.7000000000000006) + 2.9) + 1 / 3) / 4
    assert window.state_dict() == {"sum": 0.0, "count": 0}  # popped: the next window starts empty
    restored.load_state_dict(None)  # a checkpoint written before the window was kept
    assert restored.state_dict() == {"sum": 0.0, "count": 0}


def test_every_record_is_flushed_at_once(tmp_path) -> None:
    """A run killed between two records keeps every record written so far."""
    run = tmp_path / "run"
    run.mkdir()
    log = RunLog(run, True, tiny_train_config(run), resumed_at=None)
    _log_steps(log, [1, 2])
    assert [r["step"] for r in _records(run)] == [1, 2]
    log.close()


def test_resume_drops_what_was_logged_after_the_checkpoint(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cfg = tiny_train_config(run)
    log = RunLog(run, True, cfg, resumed_at=None)
    _log_steps(log, range(1, 7))
    log.valid(4, 2.0, VAL, "ppl", True)
    log.event(5, 2.5, "nonfinite", loss=math.nan, grad_norm=math.nan)
    log.final(6, 3.0, {"model": "best"})
    log.close()

    log = RunLog(run, True, cfg, resumed_at=4)
    kept = _records(run)
    assert [(r["kind"], r["step"]) for r in kept] == [("train", 1), ("train", 2), ("train", 3), ("train", 4),
                                                      ("valid", 4)]
    log.event(4, 2.0, "resume", checkpoint="step_4")
    _log_steps(log, [5], loss=1.0)
    log.close()
    records = _records(run)
    assert records[:5] == kept and records[5]["event"] == "resume" and records[6]["train_loss"] == 1.0


def _finished_run(tmp_path):
    """A run directory whose log holds two train records and a final evaluation at step 2."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = tiny_train_config(run)
    log = RunLog(run, True, cfg, resumed_at=None)
    _log_steps(log, [1, 2])
    log.final(2, 1.0, {"model": "best"})
    log.close()
    return run, cfg


def test_resuming_a_finished_run_drops_its_final_record(tmp_path) -> None:
    """Resumed at its last step (to train longer), a finished run's final evaluation no longer holds."""
    run, cfg = _finished_run(tmp_path)
    RunLog(run, True, cfg, resumed_at=2).close()
    assert [(r["kind"], r["step"]) for r in _records(run)] == [("train", 1), ("train", 2)]


def test_resume_without_a_checkpoint_step_appends(tmp_path) -> None:
    """``resumed_at=None`` (a fresh run object on an existing file) trims nothing, finals included."""
    run, cfg = _finished_run(tmp_path)
    RunLog(run, True, cfg, resumed_at=None).close()
    assert [r["kind"] for r in _records(run)] == ["train", "train", "final"]


def test_other_processes_write_nothing(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 9}\n', encoding="utf-8")
    log = RunLog(run, False, tiny_train_config(run, loggers=["tensorboard", "wandb"]), resumed_at=2)
    assert log.file is None and log.loggers.active == []
    _log_steps(log, [3])
    log.event(3, 1.0, "resume")
    log.final(3, 1.0, {})
    log.close()
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == '{"kind": "train", "step": 9}\n'  # not trimmed
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]  # no events/ nor wandb/ either


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise(tmp_path, monkeypatch) -> None:
    import io

    assert progress(tiny_train_config(tmp_path, progress=True), 0, False) is None  # rank 0 only
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress(tiny_train_config(tmp_path, progress=True, max_step=8), 3, True)
    try:
        assert bar.mode == "bar" and bar.bar.total == 8 and bar.bar.n == 3
    finally:
        bar.close()
    assert progress(tiny_train_config(tmp_path, progress=False), 0, True).mode == "lines"  # --no-progress
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    lines = progress(tiny_train_config(tmp_path, progress=True, max_step=8, log_interval=2), 0, True)
    assert lines.mode == "lines" and lines.bar is None and lines.every == 2
    lines.stream = io.StringIO()
    postfix(lines, 2.0, "bpc", 2.5e-4, 1234.4)
    lines.update(1)
    lines.update(1)
    out = lines.stream.getvalue().splitlines()
    assert len(out) == 1 and out[0].startswith("train: step 2/8 (25%) | loss 2.000 | bpc 2.89 | lr 2.50e-04 | "
                                               "tok/s 1234 | ") and "ETA " in out[0]


class _Bar:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def set_fields(self, **values: str) -> None:
        self.calls.append(values)


@pytest.mark.parametrize("metric, shown", [("ppl", f"{math.exp(2.0):.2f}"), ("bpc", f"{2.0 / math.log(2):.2f}")])
def test_postfix_shows_the_runs_metric(metric: str, shown: str) -> None:
    bar = _Bar()
    postfix(bar, 2.0, metric, 2.5e-4, 1234.4)
    assert bar.calls == [{"loss": "2.000", metric: shown, "lr": "2.50e-04", "tok/s": "1234"}]


def test_postfix_survives_a_huge_loss() -> None:
    bar = _Bar()
    postfix(bar, 1e6, "ppl", 1e-3, 1.0)  # exp(1e6) would overflow
    assert bar.calls[0]["ppl"] == f"{math.exp(50.0):.2f}"


def test_published_models_carry_the_runs_vocabulary_in_their_manifest(tmp_path) -> None:
    from tests.helpers import tiny_model
    from transformer_xl.data import Vocab
    from transformer_xl.errors import DataError
    from transformer_xl.store.layout import RunDir
    from transformer_xl.store.manifest import verify_manifest

    run, model = RunDir(tmp_path / "run"), tiny_model()
    publish_model(run.best, model, {"step": 2})  # no run vocabulary yet (e.g. a helper's model): none beside
    assert not (run.best / "vocab.json").exists()
    vocab = Vocab([f"w{i}" for i in range(50)])
    vocab.save(run.vocab)
    publish_model(run.best, model, {"step": 4, "valid_loss": 3.0})
    assert (run.best / "vocab.json").read_text(encoding="utf-8") == run.vocab.read_text(encoding="utf-8")
    listed = verify_manifest(run.best, required=True)["files"]
    assert set(listed) == {"config.json", "model.safetensors", "train_info.json", "vocab.json"}
    other = Vocab([f"x{i}" for i in range(50)])
    publish_model(run.final, model, {"step": 4}, other)  # a given vocabulary wins over the run's
    assert Vocab.load(run.final / "vocab.json").sha256() == other.sha256()
    run.vocab.write_text("{torn", encoding="utf-8")
    with pytest.raises(DataError, match="invalid vocabulary JSON"):
        publish_model(run.final, model, {"step": 5})
    assert json.loads((run.final / "train_info.json").read_text())["step"] == 4  # the old final/ is kept
