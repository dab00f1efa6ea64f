"""Training loggers, read back with the tools' own readers: TensorBoard's ``EventAccumulator`` over the event files,
W&B's ``wandb leet inspect --json`` over the offline run's ``.wandb`` log. A run SIGKILLed after its checkpoint and
resumed with ``txl train --resume`` shows every logged step once, with the value ``metrics.jsonl`` keeps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import plugin_data_pb2

from tests.helpers import one_line_error, subprocess_env
from tests.helpers import tiny_train_config as tiny_cfg
from transformer_xl.cli import main
from transformer_xl.errors import ConfigError
from transformer_xl.train import Trainer
from transformer_xl.train.config import LOGGER_NAMES, TrainConfig
from transformer_xl.train.loggers import LOGGERS, TAGS, metric_value


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Iterator[dict[str, str]]:
    """W&B offline, its settings and caches under ``tmp_path`` (no network, no account). W&B puts the address of the
    service it starts in ``WANDB_SERVICE``, which child processes would share: the test's own is removed after it."""
    env = {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_SERVICE", "")
    monkeypatch.delenv("WANDB_SERVICE")  # recorded as absent: monkeypatch removes what W&B sets in the test
    yield env
    import wandb

    wandb.teardown()


def _expected(run: Path, metric: str = "ppl") -> dict[str, list[tuple[int, float]]]:
    """Each tag's (step, value) points as ``metrics.jsonl`` keeps them."""
    out: dict[str, list[tuple[int, float]]] = {t.format(metric=metric): [] for t in TAGS}
    for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if r["kind"] == "train":
            values = {"loss": r["train_loss"], metric: metric_value(r["train_loss"], metric), "lr": r["lr"],
                      "tokens_per_s": r["tokens_per_s"], "grad_norm": r["grad_norm"]}
        elif r["kind"] == "valid":
            values = {"loss": r["valid_loss"], metric: r[f"valid_{metric}"]}
        else:
            continue
        for key, value in values.items():
            out[f"{r['kind']}/{key}"].append((r["step"], value))
    return out


def _float32(points: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard keeps scalars as float32."""
    return {tag: [(s, float(np.float32(v))) for s, v in pts] for tag, pts in points.items()}


def _accumulator(path: Path) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def _tensorboard(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for ``path`` (a directory or one event file), in its order."""
    acc = _accumulator(path)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _wandb_segments(run: Path) -> list[tuple[dict, dict[int, dict]]]:
    """Each offline W&B run of ``run`` (oldest first), read by ``wandb leet inspect --json``: its run record and its
    history rows by step."""
    segments = []
    for directory in sorted((run / "wandb").glob("offline-run-*")):
        read = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(directory)],
                              capture_output=True, text=True, timeout=60)
        assert read.returncode == 0, f"{directory}: {read.stderr}"
        records = [json.loads(line) for line in read.stdout.splitlines()]
        head = next((r["run"] for r in records if r["type"] == "run"), {})  # {}: nothing was written
        rows: dict[int, dict] = {}
        for r in records:
            if r["type"] == "history":
                rows.setdefault(int(r["history"]["step"]["num"]), {}).update(r["history"]["item"])
        segments.append((head, rows))
    return segments


def _wandb_points(rows: dict[int, dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(rows):
        for tag, value in rows[step].items():
            if not tag.startswith("_"):
                out.setdefault(tag, []).append((step, value))
    return out


def _train(cfg: TrainConfig, corpus: Path) -> Path:
    from transformer_xl.data import load_corpus

    Trainer(cfg, corpus=load_corpus(str(corpus), cache_dir=Path(cfg.out_dir).parent / "cache")).fit()
    return Path(cfg.out_dir)


def test_tensorboard_points_are_on_disk_before_the_logger_closes(tmp_path) -> None:
    """Each logged step is flushed (live curves; a killed run keeps its points); a hyper-parameter of None is left
    out rather than shown as the text ``null``."""
    from transformer_xl.train.loggers import Loggers

    logs = Loggers(["tensorboard"], tmp_path, hparams={"lr": 0.5, "none": None}, resumed_at=None, rewind=False,
                   metric="ppl")
    logs.train(1, 2.0, 0.5, 100.0, 3.0)
    assert _tensorboard(tmp_path / "events")["train/loss"] == [(1, 2.0)]
    content = _accumulator(tmp_path / "events").PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert set(start) == {"lr"}
    logs.close()


#: A process that logs 23 steps and a validation through the TensorBoard logger, then is killed (SIGKILL): the
#: logger is never closed, and nothing the process holds in memory survives.
LOG_THEN_DIE = """
import os, signal, sys
from pathlib import Path
from transformer_xl.train.loggers import Loggers
logs = Loggers(["tensorboard"], Path(sys.argv[1]), hparams={}, resumed_at=None, rewind=False, metric="ppl")
for step in range(1, 24):
    logs.train(step, float(step), 0.5, 100.0, 1.0)
logs.valid(23, {"loss": 1.5, "ppl": 4.5}, "ppl")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_run_keeps_its_last_tensorboard_points(tmp_path) -> None:
    """Every log line is flushed to the event file: a process killed without closing its logger leaves every point
    on disk, the last training step and the validation after it included (TensorBoard's writer would otherwise hold
    up to ten events, or two minutes of them, in memory)."""
    killed = subprocess.run([sys.executable, "-c", LOG_THEN_DIE, str(tmp_path)], env=subprocess_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr[-3000:]
    shown = _tensorboard(tmp_path / "events")
    assert shown["train/loss"] == [(step, float(step)) for step in range(1, 24)]
    assert shown["train/lr"][-1] == (23, 0.5) and shown["train/grad_norm"][-1] == (23, 1.0)
    assert shown["valid/loss"] == [(23, 1.5)] and shown["valid/ppl"] == [(23, 4.5)]


def test_a_wandb_run_keeps_its_id_and_rewinds_only_when_asked(tmp_path, offline, monkeypatch) -> None:
    """:class:`Loggers` without a training run, read back with ``wandb leet inspect``: a new run records its id in
    ``loggers.json``; a resume with ``rewind`` branches the same run at the checkpoint's step, one without it
    continues the run. W&B writes its log every second unless its own environment variable says otherwise."""
    import re

    import wandb

    from transformer_xl.train.loggers import Loggers

    run = tmp_path / "myrun"
    run.mkdir()
    first = Loggers(["wandb"], run, hparams={"lr": 0.5}, resumed_at=None, rewind=False, metric="ppl")
    assert first.active[0].run.settings.x_transaction_log_flush_interval == 1.0  # a killed run loses 1 s at most
    for step in range(1, 5):
        first.train(step, float(step), 0.1, 1.0, 1.0)
    first.close()
    run_id = json.loads((run / "loggers.json").read_text())["wandb"]["id"]
    assert re.fullmatch("[a-z0-9]{8}", run_id)

    rewound = Loggers(["wandb"], run, hparams={"lr": 0.5}, resumed_at=2, rewind=True, metric="ppl")
    for step in (3, 4):
        rewound.train(step, 10.0 + step, 0.1, 1.0, 1.0)
    rewound.close()

    wandb.teardown()  # W&B reads its environment variables when it sets up, once per process
    monkeypatch.setenv("WANDB_PROJECT", "other")
    monkeypatch.setenv("WANDB__TRANSACTION_LOG_FLUSH_INTERVAL", "5")
    continued = Loggers(["wandb"], run, hparams={"lr": 0.5}, resumed_at=4, rewind=False, metric="ppl")
    assert continued.active[0].run.settings.x_transaction_log_flush_interval == 5.0
    continued.train(5, 5.0, 0.1, 1.0, 1.0)
    continued.close()
    wandb.teardown()

    (head1, rows1), (head2, rows2), (head3, rows3) = _wandb_segments(run)
    assert [h["run_id"] for h in (head1, head2, head3)] == [run_id] * 3
    assert [h["display_name"] for h in (head1, head2, head3)] == ["myrun"] * 3
    assert [h["project"] for h in (head1, head2, head3)] == ["txl", "txl", "other"]
    assert "branch_point" not in head1 and "branch_point" not in head3
    assert head2["branch_point"] == {"run": run_id, "metric": "_step", "value": 2}
    assert (sorted(rows1), sorted(rows2), sorted(rows3)) == ([1, 2, 3, 4], [3, 4], [5])
    assert rows2[3]["train/loss"] == 13.0
    assert json.loads((run / "loggers.json").read_text()) == {"wandb": {"id": run_id}}
    assert not list((run / "wandb").rglob("output.log"))  # console capture off: txl's own output is not copied


def test_a_wandb_logger_with_an_unreadable_run_id_file_is_off_with_a_note_naming_it(tmp_path, offline, capsys) -> None:
    from transformer_xl.train.loggers import Loggers

    (tmp_path / "loggers.json").write_text("{not json")
    logs = Loggers(["wandb"], tmp_path, hparams={}, resumed_at=None, rewind=False, metric="ppl")
    assert logs.active == [] and not (tmp_path / "wandb").exists()
    err = capsys.readouterr().err
    assert err.startswith("txl train: warning: the wandb logger could not start (ConfigError: ")
    assert str(tmp_path / "loggers.json") in err


def test_tensorboard_shows_the_metrics_jsonl_values_and_the_config_as_hparams(tmp_path, word_corpus) -> None:
    run = _train(tiny_cfg(tmp_path / "run", str(word_corpus), max_step=6, eval_interval=2, loggers=["tensorboard"]),
                 word_corpus)
    shown = _tensorboard(run / "events")
    assert set(shown) == {t.format(metric="ppl") for t in TAGS}
    assert shown == _float32(_expected(run))
    assert [s for s, _ in shown["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in shown["valid/loss"]] == [2, 4, 6]
    acc = _accumulator(run / "events")
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    config = json.loads((run / "config.json").read_text())
    assert hparams["n_layer"].number_value == config["model"]["n_layer"] == 2
    assert hparams["lr"].number_value == pytest.approx(3e-3)
    assert hparams["dataset"].string_value == str(word_corpus)
    assert hparams["cutoffs"].string_value == json.dumps(config["model"]["cutoffs"])  # lists as JSON text
    assert hparams["parameters"].number_value == config["parameters"]


def test_wandb_offline_run_holds_the_values_and_the_config(tmp_path, word_corpus, offline) -> None:
    run = _train(tiny_cfg(tmp_path / "run", str(word_corpus), max_step=4, eval_interval=2, loggers=["wandb"]),
                 word_corpus)
    assert not (run / "events").exists()
    [(head, rows)] = _wandb_segments(run)
    assert head["run_id"] == json.loads((run / "loggers.json").read_text())["wandb"]["id"]
    assert head["project"] == "txl"
    assert _wandb_points(rows) == _expected(run)
    config = head["config"]["update"]
    assert config["n_layer"] == 2 and config["lr"] == 3e-3 and config["max_step"] == 4
    assert config["loggers"] == ["wandb"]


def test_both_loggers_at_once_and_the_flag_forms(tmp_path, capsys) -> None:
    base = ["train", "--preset", "tiny", "--out-dir", str(tmp_path / "r"), "--print-config"]
    for flags, want in ((["--logger", "tensorboard", "--logger", "wandb"], ["tensorboard", "wandb"]),
                        (["--logger", "wandb,tensorboard"], ["wandb", "tensorboard"]),
                        (["--logger", "wandb", "--logger", "wandb"], ["wandb"]),
                        (["--logger", "none"], []), ([], [])):
        assert main([*base, *flags]) == 0
        assert json.loads(capsys.readouterr().out)["loggers"] == want, flags
    assert main([*base, "--logger", "tensorbord"]) == 2
    assert "did you mean 'tensorboard'" in one_line_error(capsys, "txl train: error: unknown logger 'tensorbord'")


def test_every_logger_name_has_its_package_and_extra() -> None:
    assert set(LOGGERS) == set(LOGGER_NAMES)
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    for module, extra in LOGGERS.values():
        assert f'{extra} = ["{module}' in pyproject


def test_a_missing_extra_is_one_line_before_anything_is_written(tmp_path, word_corpus, monkeypatch, capsys) -> None:
    import importlib.util

    import transformer_xl.train.loggers as loggers

    real = importlib.util.find_spec
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--dataset", str(word_corpus), "--max-step", "2", "--out-dir", str(out),
                 "--no-progress", "--logger", "tensorboard,wandb"]) == 2
    err = one_line_error(capsys, "txl train: error: --logger wandb needs the wandb package: ")
    assert "pip install -e '.[wandb]' in the txl checkout" in err
    assert not out.exists()


def test_a_config_of_an_older_txl_with_its_tensorboard_key_is_read() -> None:
    assert TrainConfig.from_dict({"tensorboard": True, "lr": 1e-3}).loggers == []
    with pytest.raises(ConfigError, match="loggers must be a list"):
        TrainConfig(loggers="tensorboard")  # type: ignore[arg-type]


def test_a_failing_logger_is_turned_off_and_the_run_goes_on(tmp_path, word_corpus, monkeypatch, capsys) -> None:
    from transformer_xl.train import loggers

    def full(self, scalars, step):
        if step >= 3:
            raise OSError(28, "No space left on device")
        return write(self, scalars, step)

    write = loggers._TensorBoard.log
    monkeypatch.setattr(loggers._TensorBoard, "log", full)
    run = _train(tiny_cfg(tmp_path / "run", str(word_corpus), max_step=6, eval_interval=2, loggers=["tensorboard"]),
                 word_corpus)
    err = capsys.readouterr().err
    assert err.count("the tensorboard logger failed (OSError") == 1 and "metrics.jsonl keeps every value" in err
    expected = _expected(run)
    assert [s for s, _ in expected["train/loss"]] == [1, 2, 3, 4, 5, 6]  # the record is whole
    assert _tensorboard(run / "events") == {t: [p for p in pts if p[0] < 3] for t, pts in _float32(expected).items()}
    assert json.loads((run / "results.json").read_text())["step"] == 6


def test_metric_value() -> None:
    assert metric_value(2.0, "ppl") == math.exp(2.0)
    assert metric_value(3 * math.log(2), "bpc") == pytest.approx(3.0)
    assert metric_value(800.0, "ppl") == math.inf


# The killed run: a Trainer that SIGKILLs its own process before step K + 1 (steps up to K were logged, the last
# checkpoint is older), once W&B's reader finds step K - 1 in the .wandb file (txl asks W&B to write it every second;
# W&B's default, 15 s, would leave the killed run's file empty; W&B writes a step's row when the next one begins).
KILLER = """
import glob, json, os, signal, subprocess, sys, time, torch
torch.set_num_threads(1)
from transformer_xl.train import Trainer, TrainConfig
cfg = TrainConfig.from_json(open(sys.argv[1]).read())
K = int(sys.argv[2])
def written(step):
    for d in glob.glob(cfg.out_dir + "/wandb/offline-run-*"):
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", d], capture_output=True,
                             text=True).stdout
        return any(r["type"] == "history" and int(r["history"]["step"]["num"]) == step
                   for r in map(json.loads, out.splitlines()))
    return False
class Killed(Trainer):
    def train_step(self, *a, **kw):
        if self.step == K:
            deadline = time.monotonic() + 60
            while not written(K - 1) and time.monotonic() < deadline:
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_step(*a, **kw)
Killed(cfg).fit()
"""


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_and_resumed_run_shows_every_step_once_with_the_metrics_jsonl_value(tmp_path, word_corpus,
                                                                                     offline) -> None:
    run = tmp_path / "run"
    cfg = tiny_cfg(run, str(word_corpus), max_step=10, eval_interval=2, save_interval=4,
                   loggers=["tensorboard", "wandb"])
    (tmp_path / "c.json").write_text(cfg.to_json())
    env = subprocess_env(tmp_path, **offline)
    killed = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "c.json"), "6"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000004"]
    [first] = sorted((run / "events").iterdir())
    assert [s for s, _ in _tensorboard(first)["train/loss"]] == [1, 2, 3, 4, 5, 6]  # 5 and 6 are to be re-done
    # the resume names no logger: the run's own config brings both back
    resumed = subprocess.run([sys.executable, "-m", "transformer_xl", "train", "--resume", str(run)], env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = _expected(run)
    assert [s for s, _ in expected["train/loss"]] == list(range(1, 11))
    assert [s for s, _ in expected["valid/loss"]] == [2, 4, 6, 8, 10]
    assert len(list((run / "events").iterdir())) == 2
    assert _tensorboard(run / "events") == _float32(expected)  # every step once, the resumed run's value

    (head1, rows1), (head2, rows2) = _wandb_segments(run)
    assert head1["run_id"] == head2["run_id"]
    # the killed run had logged past its checkpoint (W&B writes a step's row once the next step begins: not 6) ...
    assert sorted(rows1) == [1, 2, 3, 4, 5]
    assert head2["branch_point"] == {"run": head1["run_id"], "metric": "_step", "value": 4}  # ... so W&B rewinds
    assert min(rows2) == 5
    rewound = {**{s: r for s, r in rows1.items() if s <= 4}, **rows2}  # what W&B keeps after the rewind
    assert _wandb_points(rewound) == expected


@pytest.mark.integration
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.slow
def test_under_torchrun_only_rank_0_logs(tmp_path, word_corpus, offline) -> None:
    cfg = tiny_cfg(tmp_path / "run", str(word_corpus), max_step=4, batch_size=8, loggers=["tensorboard", "wandb"])
    (tmp_path / "c.json").write_text(cfg.to_json())
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            "-m", "transformer_xl", "train", "--config", str(tmp_path / "c.json")],
                           env=subprocess_env(tmp_path, **offline), capture_output=True, text=True, timeout=180)
    assert multi.returncode == 0, multi.stderr[-3000:]
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["world_size"] == 2
    assert len(list((run / "events").iterdir())) == 1
    assert _tensorboard(run / "events") == _float32(_expected(run))
    [(head, rows)] = _wandb_segments(run)
    assert head["config"]["update"]["world_size"] == 2
    assert _wandb_points(rows) == _expected(run)


def test_the_tensorboard_logger_alone_writes_the_tags_hparams_and_session_end(tmp_path) -> None:
    """:class:`Loggers` without a training run, read back with TensorBoard's reader: every tag of a character
    model (``bpc``), the hyper-parameters with the validation metrics they are shown against, the session's end."""
    from transformer_xl.train.loggers import Loggers

    logs = Loggers(["tensorboard"], tmp_path, hparams={"lr": 0.5, "cutoffs": [2, 4], "name": "x", "none": None},
                   resumed_at=None, rewind=False, metric="bpc")
    logs.train(1, 2.0, 0.5, 100.0, 3.0)
    logs.valid(1, {"loss": 1.5, "bpc": 1.5 / math.log(2)}, "bpc")
    logs.close()
    assert logs.active == []
    want = {"train/loss": 2.0, "train/bpc": 2.0 / math.log(2), "train/lr": 0.5, "train/tokens_per_s": 100.0,
            "train/grad_norm": 3.0, "valid/loss": 1.5, "valid/bpc": 1.5 / math.log(2)}
    assert _tensorboard(tmp_path / "events") == {t: [(1, float(np.float32(v)))] for t, v in want.items()}
    content = _accumulator(tmp_path / "events").PluginTagToContent("hparams")
    data = {k: plugin_data_pb2.HParamsPluginData.FromString(v) for k, v in content.items()}
    start = data["_hparams_/session_start_info"].session_start_info.hparams
    assert start["lr"].number_value == 0.5 and start["cutoffs"].string_value == "[2, 4]"
    assert start["name"].string_value == "x"
    shown = [m.name.tag for m in data["_hparams_/experiment"].experiment.metric_infos]
    assert sorted(shown) == ["valid/bpc", "valid/loss"]
    assert "_hparams_/session_end_info" in data


def test_a_resumed_tensorboard_logger_replaces_the_steps_after_the_checkpoint(tmp_path) -> None:
    from transformer_xl.train.loggers import Loggers

    first = Loggers(["tensorboard"], tmp_path, hparams={}, resumed_at=None, rewind=False, metric="ppl")
    for step in range(1, 6):
        first.train(step, float(step), 0.1, 1.0, 1.0)
    first.close()
    again = Loggers(["tensorboard"], tmp_path, hparams={}, resumed_at=2, rewind=False, metric="ppl")
    for step in (3, 4):
        again.train(step, 10.0 + step, 0.1, 1.0, 1.0)
    again.close()
    assert _tensorboard(tmp_path / "events")["train/loss"] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]


def test_a_logger_that_cannot_start_is_off_with_a_note(tmp_path, capsys) -> None:
    from transformer_xl.train.loggers import Loggers

    (tmp_path / "events").write_text("a file where the event folder goes")
    logs = Loggers(["tensorboard"], tmp_path, hparams={}, resumed_at=None, rewind=False, metric="ppl")
    assert logs.active == []
    err = capsys.readouterr().err
    assert err.startswith("txl train: warning: the tensorboard logger could not start (") and err.count("\n") == 1
    assert err.endswith("it is off for the rest of this run, metrics.jsonl keeps every value\n")
    logs.train(1, 1.0, 0.1, 1.0, 1.0)
    logs.close()  # nothing to log to, nothing raised


def test_hyperparameters_of_a_run_config() -> None:
    from transformer_xl.train.loggers import hyperparameters

    config = {"model": {"d_model": 8, "lr": "model's"}, "train": {"lr": 0.1, "model_overrides": {"d_model": 4}},
              "parameters": 123, "world_size": 2, "version": "x"}
    assert hyperparameters(config) == {"d_model": 8, "lr": 0.1, "parameters": 123, "world_size": 2}
    assert hyperparameters({}) == {}


def test_metric_value_at_the_overflow_bound() -> None:
    assert metric_value(699.0, "ppl") == math.exp(699.0)
    assert metric_value(700.0, "ppl") == math.inf
    assert metric_value(0.0, "ppl") == 1.0 and metric_value(0.0, "bpc") == 0.0

