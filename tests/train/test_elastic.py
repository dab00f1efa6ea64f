"""Runs that really die under ``torchrun`` (gloo, CPU, 2 processes): a worker SIGKILLed under ``--max-restarts 1``,
a preemption (SIGTERM to the agent and the workers), a stalled rank, another process count, repeated clean exits.

Every run has the same command line, ``--resume auto`` included; a disturbed run must end with the losses and final
weights of the undisturbed one (dropout 0, one thread: bit for bit on this CPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import corpus_dir, ended, subprocess_env, workers
from tests.helpers import tiny_train_config as tiny_cfg
from transformer_xl.train.distributed import REPORT_WAIT

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")]

STEPS = 120  # about 2 s of training at 2 processes: long enough to be hit mid-run, short enough to wait for


def _torchrun(nproc: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "--monitor-interval", "0.1", *extra, "-m", "transformer_xl", "train"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[str]]:
    """The job's command line for ``nproc`` processes and ``out_dir`` (``train --config c.json --resume auto``)."""
    root = tmp_path_factory.mktemp("elastic")
    cfg = tiny_cfg(root / "x", dataset=str(corpus_dir(root)), max_step=STEPS, batch_size=4, save_interval=4,
                   eval_interval=10**6, keep_checkpoints=2)
    (root / "c.json").write_text(cfg.to_json())

    def command(out_dir: Path, nproc: int = 2, *launcher: str, **changes: object) -> list[str]:
        conf = root / "c.json"
        if changes:
            conf = out_dir.with_suffix(".json")
            conf.write_text(dataclasses.replace(cfg, **changes).to_json())
        return [*_torchrun(nproc, *launcher), "--config", str(conf), "--resume", "auto", "--out-dir", str(out_dir)]

    return command


@pytest.fixture(scope="module")
def undisturbed(job, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("undisturbed") / "run"
    p = _finish(subprocess.Popen(job(out), **_popen(out)))
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def _popen(out: Path) -> dict:
    return dict(env=subprocess_env(out.parent, TXL_TEST_JOB=str(out)), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, start_new_session=True)


def _kill_job(out: Path) -> None:
    """SIGKILL every process started for ``out`` (the agent, its workers, workers it left behind)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"TXL_TEST_JOB={out}\0".encode() in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def _finish(proc: subprocess.Popen, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hang is a failure, not a stuck test session
        _kill_job(Path(proc.args[-1]))
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"torchrun did not end within {timeout} s:\n{err[-5000:]}")
    assert "terminate called" not in err, err[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _wait(test: Callable[[], bool], proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        assert proc.poll() is None, "torchrun ended before the test could act"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def _has_checkpoint(out: Path) -> Callable[[], bool]:
    return lambda: any((out / "checkpoints").glob("step_*"))


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _assert_same_run(run: Path, reference: Path, *, exact: bool = True, steps: int = STEPS) -> None:
    """The losses of every step and the final weights of ``run`` are those of ``reference``."""
    losses = [(r["step"], r["train_loss"]) for r in _records(run, "train")]
    ref = [(r["step"], r["train_loss"]) for r in _records(reference, "train")]
    assert [s for s, _ in losses] == [s for s, _ in ref] == list(range(1, steps + 1))
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor([v for _, v in losses]), torch.tensor([v for _, v in ref]), **tol)
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (run, reference))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol, msg=k)


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_run_continues_exactly(job, undisturbed, tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(job(out, 2, "--max-restarts", "1"), **_popen(out))
    _wait(_has_checkpoint(out), proc)
    os.kill(workers(proc.pid)[1], signal.SIGKILL)
    p = _finish(proc)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "--resume auto: continuing" in p.stderr, p.stderr[-3000:]
    resumed = [r for r in _records(out, "event") if r["event"] == "resume"]
    assert len(resumed) == 1 and 0 < resumed[0]["step"] < STEPS, resumed
    _assert_same_run(out, undisturbed)


@pytest.mark.slow
def test_a_preempted_job_saves_exits_and_the_same_command_continues(job, undisturbed, tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(job(out), **_popen(out))
    _wait(_has_checkpoint(out), proc)
    pids = workers(proc.pid)
    t0 = time.monotonic()
    for pid in (proc.pid, *pids.values()):  # a scheduler signals every process of the job
        os.kill(pid, signal.SIGTERM)
    p = _finish(proc, 60)
    seconds = time.monotonic() - t0
    assert seconds < 20, f"took {seconds:.1f} s to stop"
    assert "stopped on a signal" in p.stderr and "checkpoint saved" in p.stderr, p.stderr[-3000:]
    for rank in pids:  # torchrun reports a failed worker by rank: none failed, none was killed
        assert f"rank      : {rank} (local_rank" not in p.stderr, p.stderr[-3000:]
    stopped = max(int(d.name[5:]) for d in (out / "checkpoints").glob("step_*"))
    assert 0 < stopped < STEPS
    again = _finish(subprocess.Popen(job(out), **_popen(out)))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing {out} from step {stopped}" in again.stderr
    _assert_same_run(out, undisturbed)


@pytest.mark.slow
def test_a_stalled_rank_fails_the_job_within_the_timeout_naming_it(job, tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(job(out, 2, dist_timeout=4.0), **_popen(out))
    _wait(_has_checkpoint(out), proc)
    pids = workers(proc.pid)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    _wait(lambda: ended(pids[0]), proc, 60)
    seconds = time.monotonic() - t0  # the stalled rank would get torchrun's SIGKILL after its 30 s grace: now
    os.kill(pids[1], signal.SIGKILL)
    p = _finish(proc, 60)
    assert p.returncode != 0
    assert 4 <= seconds < 4 + REPORT_WAIT + 10, seconds
    errors = [ln for ln in p.stderr.splitlines() if "txl train: error:" in ln]
    assert len(errors) == 1 and "rank 0 of 2" in errors[0] and "rank 1 did not answer" in errors[0], p.stderr[-3000:]
    assert "dist_timeout is 4 s" in errors[0] and "Timed out" in errors[0]
    assert "[rank0]: Traceback" not in p.stderr


#: A learning rate that does not depend on max_step (a run stopped at step 4 and continued to 8 is one run of 8).
CONSTANT = dict(scheduler="constant", warmup_step=0)


@pytest.mark.slow
def test_another_process_count_continues_the_global_batch(job, tmp_path) -> None:
    one = tmp_path / "one"  # 8 steps: 2 processes sum the gradient in another order than 1, a difference that
    single = _finish(subprocess.Popen(job(one, 1, max_step=8, **CONSTANT), **_popen(one)))  # grows over a long run
    assert single.returncode == 0, single.stderr[-3000:]
    out = tmp_path / "run"  # 2 processes to step 4, then 1 process to step 8: the global batch split anew
    first = _finish(subprocess.Popen(job(out, 2, max_step=4, **CONSTANT), **_popen(out)))
    assert first.returncode == 0, first.stderr[-3000:]
    then = _finish(subprocess.Popen(job(out, 1, max_step=8, **CONSTANT), **_popen(out)))
    assert then.returncode == 0, then.stderr[-3000:]
    assert f"continuing {out} from step 4" in then.stderr
    _assert_same_run(out, one, exact=False, steps=8)


@pytest.mark.slow
def test_a_process_count_that_cannot_split_the_batch_is_refused_before_anything_is_written(job, tmp_path) -> None:
    out = tmp_path / "run"
    p = _finish(subprocess.Popen(job(out, 3), **_popen(out)))
    assert p.returncode != 0
    # Every worker says the same one line; they share the agent's stderr, so split on the prefix, not on newlines.
    errors = {part.splitlines()[0] for part in p.stderr.split("txl train: error: ")[1:]}
    assert errors == {"batch_size 4 must be divisible by world_size x batch_chunk = 3 x 1"}, p.stderr[-3000:]
    assert not out.exists()


@pytest.mark.slow
def test_repeated_two_process_runs_all_exit_cleanly(job, tmp_path) -> None:
    for i in range(2):  # benchmarks/reliability_tour.py runs 50 (docs/reliability.md)
        out = tmp_path / f"run{i}"
        p = _finish(subprocess.Popen(job(out, max_step=8), **_popen(out)))
        assert p.returncode == 0 and "done in" in p.stdout + p.stderr, p.stderr[-3000:]
