"""One process per run directory: refused in one line naming the holder, free again when the holder dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import subprocess_env
from transformer_xl.store.lock import LOCK, RunLock, RunLockedError

HOLD = ("import sys, time; from transformer_xl.store.lock import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(60)")


def test_a_second_holder_is_refused_naming_the_first(tmp_path) -> None:
    with RunLock(tmp_path / "run") as lock:
        assert lock.held
        info = json.loads((tmp_path / "run" / LOCK).read_text())
        assert info["pid"] == os.getpid()
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on .*since") as err:
            RunLock(tmp_path / "run").acquire()
        assert "\n" not in str(err.value)
    RunLock(tmp_path / "run").acquire().release()  # free again after release


def test_a_file_in_the_way_is_one_line(tmp_path) -> None:
    (tmp_path / "run").write_text("x")
    with pytest.raises(RunLockedError, match="not a directory"):
        RunLock(tmp_path / "run").acquire()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], env=subprocess_env(tmp_path),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"pid {proc.pid}"):
            RunLock(tmp_path / "run").acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the flock with the process's files
        try:
            RunLock(tmp_path / "run").acquire().release()
            break
        except RunLockedError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_discard_removes_only_a_directory_it_made_and_left_empty(tmp_path) -> None:
    RunLock(tmp_path / "new").acquire().release(discard=True)
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    RunLock(tmp_path / "old").acquire().release(discard=True)  # not made by the lock: kept
    assert (tmp_path / "old").is_dir()
    lock = RunLock(tmp_path / "used").acquire()
    (tmp_path / "used" / "config.json").write_text("{}")
    lock.release(discard=True)  # something was written: kept
    assert (tmp_path / "used" / "config.json").is_file()
