"""The ``txl`` command line: thin subcommands, one-line errors with non-zero exit, ``--debug`` tracebacks."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from tests.helpers import corpus_dir, one_line_error, subprocess_env
from transformer_xl.cli import describe_environment_error, main


def test_errors_are_one_line_with_exit_2(tmp_path, capsys) -> None:
    assert main(["convert", str(tmp_path / "missing"), "--from", "hf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txl convert: error:") and "\n" not in err
    assert main(["convert", str(tmp_path / "s.pt"), "--from", "official", "--out", str(tmp_path / "x")]) == 2
    assert "--config" in capsys.readouterr().err


def test_usage_errors_are_one_line(capsys) -> None:
    assert main(["train", "--seed", "1e20"]) == 2
    assert "argument --seed: expected int, got '1e20' (see txl train --help)" in one_line_error(capsys)
    assert main(["no-such-command"]) == 2
    one_line_error(capsys, "txl: error: argument COMMAND: invalid choice")


def _raise(exc: BaseException):
    def run(args) -> int:
        raise exc
    return run


@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, "no space left on device"), (errno.EACCES, "permission denied"),
    (errno.EPERM, "operation not permitted"), (errno.EROFS, "read-only file system"),
    (errno.EISDIR, "is a directory"), (errno.ENOTDIR, "not a directory"),
    (errno.ENOENT, "no such file or directory"), (errno.EEXIST, "file exists"),
])
def test_os_errors_are_one_line_naming_the_path(monkeypatch, capsys, code: int, words: str) -> None:
    from transformer_xl.cli import plot

    monkeypatch.setattr(plot, "run", _raise(OSError(code, os.strerror(code), "/some/where")))
    assert main(["plot", "x"]) == 1
    assert one_line_error(capsys) == f"txl plot: error: {words} (/some/where)\n"


def test_a_full_disk_while_training_names_the_file(tmp_path, monkeypatch, capsys) -> None:
    corpus = corpus_dir(tmp_path)
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["data", "prepare", str(corpus)]) == 0  # the cache is written before the disk is "full"

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--dataset", str(corpus), "--max-step", "2", "--out-dir", str(out),
                 "--no-progress"]) == 1
    err = one_line_error(capsys, "txl train: error: no space left on device (")
    assert str(out) in err


def test_interrupt_anywhere_is_one_line_and_130(monkeypatch, capsys) -> None:
    import transformer_xl.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_build_parser", interrupted)  # during imports and parser construction
    assert main(["train", "--preset", "tiny"]) == 130
    assert one_line_error(capsys) == "txl train: interrupted\n"
    monkeypatch.undo()
    from transformer_xl.cli import plot

    monkeypatch.setattr(plot, "run", _raise(KeyboardInterrupt()))
    assert main(["plot", "x"]) == 130
    assert one_line_error(capsys) == "txl plot: interrupted\n"


def test_debug_flag_and_env_show_the_traceback(monkeypatch) -> None:
    from transformer_xl.cli import plot

    monkeypatch.setattr(plot, "run", _raise(OSError(errno.EACCES, "Permission denied", "/x")))
    with pytest.raises(PermissionError):
        main(["--debug", "plot", "x"])
    monkeypatch.setenv("TXL_DEBUG", "1")
    with pytest.raises(PermissionError):
        main(["plot", "x"])
    monkeypatch.setattr(plot, "run", _raise(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        main(["plot", "x"])


def test_bugs_keep_their_traceback(monkeypatch) -> None:
    from transformer_xl.cli import plot

    for bug in (RuntimeError("a bug"), KeyError("k"), OSError("no errno")):
        monkeypatch.setattr(plot, "run", _raise(bug))
        with pytest.raises(type(bug)):
            main(["plot", "x"])


def test_describe_environment_error() -> None:
    bad = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert describe_environment_error(bad) == "a file is not valid UTF-8 text (invalid start byte at byte 0)"
    assert describe_environment_error(AssertionError("Torch not compiled with CUDA enabled")).startswith(
        "CUDA is not available (Torch not compiled with CUDA enabled); use --device cpu")
    assert "CUDA is not available" in describe_environment_error(RuntimeError("Found no NVIDIA driver on your system"))
    assert describe_environment_error(MemoryError()) == "out of memory"
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: can't allocate memory: you tried")
    assert describe_environment_error(cpu).startswith("out of memory ([enforce fail")
    assert describe_environment_error(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device"
    for bug in (RuntimeError("shape mismatch"), AssertionError(), ValueError("x"), OSError("no errno")):
        assert describe_environment_error(bug) is None


def test_python_m_txl_errors_in_a_subprocess(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cmd = [sys.executable, "-m", "transformer_xl", "train", "--preset", "tiny", "--out-dir", str(blocker / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(tmp_path), timeout=300)
    assert proc.returncode == 1 and proc.stderr == f"txl train: error: not a directory ({blocker / 'run'})\n"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(tmp_path, TXL_DEBUG="1"),
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "NotADirectoryError" in proc.stderr


def _without_permission_override() -> None:
    """In the child, before exec: drop CAP_DAC_OVERRIDE (1) and CAP_DAC_READ_SEARCH (2) from the capability
    bounding set, so that a root process obeys file modes as any user does (PR_CAPBSET_DROP is 24)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


@pytest.mark.skipif(os.name != "posix" or sys.platform != "linux", reason="file modes and capabilities of Linux")
def test_read_only_out_dir_in_a_subprocess(tmp_path) -> None:
    """A folder without write permission, for any user: root runs the command without the capability that
    overrides file modes (every machine here runs as root, where a mode alone binds nothing)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    cmd = [sys.executable, "-m", "transformer_xl", "train", "--preset", "tiny", "--out-dir", str(ro / "run")]
    drop = _without_permission_override if os.geteuid() == 0 else None
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(tmp_path), timeout=300,
                          preexec_fn=drop)
    assert proc.returncode == 1 and proc.stderr == f"txl train: error: permission denied ({ro / 'run'})\n"


_THREADS_PROBE = ("import sys, torch; from transformer_xl.cli import main; rc = main(sys.argv[1:]); "
                  "print(torch.get_num_threads(), torch.get_num_interop_threads(), rc)")


@pytest.mark.parametrize("argv, env, threads", [
    (["--threads", "1", "eval", "MISSING", "--dataset", "x"], {"TXL_NUM_THREADS": "3"}, 1),
    (["eval", "MISSING", "--dataset", "x", "--threads", "3"], {"TXL_NUM_THREADS": "1"}, 3),
    (["experiment", "recl", "--threads", "3", "--model", "a=MISSING", "--dataset", "x", "--contexts", "4,8",
      "--out", "o"], {}, 3),
    (["eval", "MISSING", "--dataset", "x"], {"TXL_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}, 3),
    (["eval", "MISSING", "--dataset", "x"], {"OMP_NUM_THREADS": "1"}, 1),  # the user's OpenMP setting is kept
    (["eval", "MISSING", "--dataset", "x"], {}, None),  # the cores available to the process
])
def test_threads_reach_torch_once_before_the_command(tmp_path, argv, env, threads) -> None:
    from transformer_xl.cli.args import available_cores

    base = {k: v for k, v in subprocess_env(tmp_path).items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", _THREADS_PROBE, *argv], env={**base, **env}, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    intra, interop, rc = map(int, proc.stdout.split())
    assert rc == 2 and intra == (threads or available_cores())
    if "OMP_NUM_THREADS" not in env or "TXL_NUM_THREADS" in env:
        assert interop == intra
    assert proc.stderr.count("\n") == 1 and "error:" in proc.stderr  # only the command's own error line


def test_bad_thread_counts_are_one_line(tmp_path, capsys, monkeypatch) -> None:
    assert main(["train", "--threads", "0"]) == 2
    one_line_error(capsys, "txl train: error: argument --threads: expected a positive integer, got '0'")
    assert main(["--threads", "x", "eval", "m"]) == 2
    one_line_error(capsys, "txl: error: argument --threads: expected an integer, got 'x'")
    monkeypatch.setenv("TXL_NUM_THREADS", "-2")
    assert main(["eval", str(tmp_path / "missing"), "--dataset", "x"]) == 2
    one_line_error(capsys, "txl eval: error: TXL_NUM_THREADS: expected a positive integer, got '-2'")
