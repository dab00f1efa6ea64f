"""Exact resume: a run SIGKILLed right after a checkpoint and resumed equals the uninterrupted run, bit for bit;
SIGTERM finishes the step, saves and exits 0 with a resume hint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import corpus_dir, subprocess_env
from tests.helpers import tiny_train_config as tiny_cfg

pytestmark = pytest.mark.integration

# The killing run: a Trainer that SIGKILLs its own process once the checkpoint of step K is on disk ("after"),
# or in the middle of writing it, between its weights and its trainer state ("during").
KILLER = """
import os, signal, sys, torch
torch.set_num_threads(1)
import transformer_xl.store.checkpoint as ckpt
from transformer_xl.train import Trainer, TrainConfig
cfg = TrainConfig.from_json(open(sys.argv[1]).read())
K, when = int(sys.argv[2]), sys.argv[3]
write = ckpt.save_tensors
def save_tensors(tensors, path, *a, **kw):
    if when == "during" and f".step_{K:08d}." in str(path) and "train_state" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)
    return write(tensors, path, *a, **kw)
ckpt.save_tensors = save_tensors
class Killed(Trainer):
    def save_checkpoint(self):
        path = super().save_checkpoint()
        if self.step == K and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return path
Killed(cfg).fit()
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return subprocess_env(tmp_path)


def _txl(args: list[str], env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import torch,sys; torch.set_num_threads(1); "
                           "from transformer_xl.cli import main; sys.exit(main(sys.argv[1:]))", *args], env=env,
                          capture_output=True, text=True, timeout=120, **kw)


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in r.items() if k not in ("time", "tokens_per_s")} for r in map(json.loads, lines)
            if r["kind"] == kind]


@pytest.mark.parametrize("when, log_interval", [("after", 1), ("during", 1), ("after", 4)])
@pytest.mark.slow
def test_sigkill_then_resume_reproduces_every_later_loss(tmp_path, when: str, log_interval: int) -> None:
    """With ``log_interval`` 4 the checkpoint of step 6 falls between two log lines: the line of step 8 averages
    steps 5-8 in the resumed run too (the losses since the last line are in the checkpoint)."""
    data = corpus_dir(tmp_path, n_train=150)  # 7 segments per epoch: the resumed part crosses an epoch
    # dropout (RNG), batch_chunk (per-chunk memories), warmup + cosine, an epoch boundary, evaluations
    cfg = tiny_cfg(tmp_path / "x", dataset=str(data), dropout=0.1, batch_chunk=2, max_step=14, save_interval=2,
                   log_interval=log_interval)
    env = _env(tmp_path)
    full, killed = tmp_path / "full", tmp_path / "killed"
    for run in (full, killed):
        (tmp_path / f"{run.name}.json").write_text(_cfg_json(cfg, run))
    r = _txl(["train", "--config", str(tmp_path / "full.json")], env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "killed.json"), "6", when], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (killed / "checkpoints" / "step_00000006").is_dir() == (when == "after")
    assert bool(list((killed / "checkpoints").glob(".step_*"))) == (when == "during")  # a torn temporary dir
    assert not (killed / "results.json").exists()
    r = _txl(["train", "--resume", str(killed)], env)
    assert r.returncode == 0, r.stderr
    assert not list((killed / "checkpoints").glob(".*"))  # the dead writer's temporary directory is gone
    a, b = _records(full, "train"), _records(killed, "train")
    assert [x["step"] for x in b] == list(range(log_interval, 15, log_interval))
    assert a == b  # every logged loss, lr and gradient norm, bit for bit (JSON floats round-trip exactly)
    assert _records(full, "valid") == _records(killed, "valid")
    from safetensors.torch import load_file

    for name in ("model.safetensors", "train_state.safetensors"):  # weights, moments, memories, RNG: bit for bit
        w1, w2 = (load_file(str(run / "checkpoints" / "step_00000014" / name)) for run in (full, killed))
        assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1), name


def test_a_run_stopped_between_two_log_lines_logs_the_same_losses_after_resume(tmp_path, word_corpus) -> None:
    """Ctrl-C lands between two log lines (step 7 of log_interval 4): the checkpoint keeps the sum and count of the
    losses since the last line, so the first line after ``--resume`` (step 8) averages steps 5-8, as the
    uninterrupted run's, bit for bit, and not only the steps the resumed process trained."""
    import dataclasses

    from transformer_xl.store.checkpoint import load_checkpoint
    from transformer_xl.train import Trainer

    cfg = tiny_cfg(tmp_path / "x", dataset=str(word_corpus), dropout=0.1, max_step=12, log_interval=4,
                   save_interval=100, eval_interval=100)
    full, stopped = (dataclasses.replace(cfg, out_dir=str(tmp_path / name)) for name in ("full", "stopped"))
    Trainer(full).fit()

    class Interrupted(Trainer):
        def train_step(self, *args, **kwargs):
            out = super().train_step(*args, **kwargs)
            if self.step == 6:
                self._request_stop()  # what Ctrl-C does: the next step is the last
            return out

    assert Interrupted(stopped).fit()["stopped"] == "signal"
    [ckpt] = (tmp_path / "stopped" / "checkpoints").iterdir()
    state = load_checkpoint(ckpt)[2]
    Trainer(stopped, resume=tmp_path / "stopped").fit()
    a, b = _records(tmp_path / "full", "train"), _records(tmp_path / "stopped", "train")
    assert [x["step"] for x in b] == [4, 8, 12] and a == b
    assert ckpt.name == "step_00000007" and state["loss_window"]["count"] == 3  # steps 5, 6 and 7


def _cfg_json(cfg, out_dir: Path) -> str:
    import dataclasses

    return dataclasses.replace(cfg, out_dir=str(out_dir)).to_json()


def test_sigterm_finishes_the_step_saves_and_exits_0(tmp_path, word_corpus) -> None:
    data = word_corpus
    run = tmp_path / "run"
    cfg = tiny_cfg(run, dataset=str(data), max_step=100000, save_interval=100000, eval_interval=100000)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    proc = subprocess.Popen([sys.executable, "-m", "transformer_xl", "train", "--config", str(tmp_path / "cfg.json")],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = run / "metrics.jsonl"
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"txl train --resume {run}" in err
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    assert len(ckpts) == 1
    step = int(ckpts[0].name[5:])
    last = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == step >= 3
    results = json.loads((run / "results.json").read_text())
    assert results["stopped"] == "signal" and results["step"] == step


@pytest.mark.slow
def test_resume_continues_past_the_original_max_step(tmp_path, word_corpus) -> None:
    data = word_corpus
    run = tmp_path / "run"
    (tmp_path / "cfg.json").write_text(tiny_cfg(run, dataset=str(data), max_step=4).to_json())
    env = _env(tmp_path)
    assert _txl(["train", "--config", str(tmp_path / "cfg.json")], env).returncode == 0
    r = _txl(["train", "--resume", str(run), "--max-step", "6"], env)
    assert r.returncode == 0, r.stderr
    assert [x["step"] for x in _records(run, "train")] == [1, 2, 3, 4, 5, 6]
