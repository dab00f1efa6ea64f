"""One process per run directory: refused in one line naming the holder, free again when the holder dies."""

from __future__ import annotations

import json
import os
import re
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
    """``discard`` (a run refused before writing): the lock file if the lock made it, the directory if it made that
    and it is empty; nothing else."""
    RunLock(tmp_path / "new").acquire().release(discard=True)
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine")
    RunLock(tmp_path / "old").acquire().release(discard=True)  # not made by the lock: kept, without the lock file
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["notes.txt"]
    (tmp_path / "old" / LOCK).write_text("")  # a lock file there before: an earlier run's, kept
    RunLock(tmp_path / "old").acquire().release(discard=True)
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == [LOCK, "notes.txt"]
    lock = RunLock(tmp_path / "used").acquire()
    (tmp_path / "used" / "config.json").write_text("{}")
    lock.release(discard=True)  # something was written: kept
    assert (tmp_path / "used" / "config.json").is_file()


def test_the_lock_file_holds_only_the_current_holder(tmp_path) -> None:
    """Each holder rewrites the file from the start: a longer record left by an earlier holder never trails it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK).write_text(json.dumps({"pid": 1, "host": "x" * 200, "since": "then"}) + "\n")
    with RunLock(tmp_path / "run"):
        info = json.loads((tmp_path / "run" / LOCK).read_text())
    assert info["pid"] == os.getpid() and info["host"] != "x" * 200
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", info["since"])


def test_a_holder_that_cannot_be_read_is_named_another_process(tmp_path) -> None:
    for text in ("not json", '{"pid": 7}', "[1]"):
        with RunLock(tmp_path / "run"):
            (tmp_path / "run" / LOCK).write_text(text)
            with pytest.raises(RunLockedError, match=r"^\S+ is in use by another process: wait for it to end or stop "
                               r"it \(one process per run directory\)$"):
                RunLock(tmp_path / "run").acquire()


def test_a_nested_run_directory_is_made_and_acquiring_twice_is_the_same_hold(tmp_path) -> None:
    lock = RunLock(tmp_path / "runs" / "a")
    assert lock.created is False  # nothing made before acquire()
    assert lock.acquire() is lock and lock.acquire() is lock and lock.held and lock.created
    lock.release()
    lock.release()  # twice: nothing more to free
    assert not lock.held and (tmp_path / "runs" / "a" / LOCK).is_file()
    assert not RunLock(tmp_path / "runs" / "a").acquire().created  # there already


def test_release_never_raises_when_the_directory_or_the_file_cannot_be_tidied(tmp_path, monkeypatch) -> None:
    """Freeing the lock is best effort past the lock itself: a directory that cannot be removed stays, a
    descriptor already closed under the lock is no error."""
    lock = RunLock(tmp_path / "new").acquire()

    def busy(self) -> None:
        raise OSError("Directory not empty")

    monkeypatch.setattr(type(tmp_path), "rmdir", busy)
    lock.release(discard=True)
    assert not lock.held and (tmp_path / "new").is_dir()
    monkeypatch.undo()
    lock = RunLock(tmp_path / "new").acquire()
    os.close(lock._file.fileno())  # the descriptor closed under it (and with it the flock)
    lock.release()
    assert not lock.held
    RunLock(tmp_path / "new").acquire().release()
