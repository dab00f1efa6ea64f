"""The ``txl`` processes of the GPU check's end-to-end parts, started as a user runs them:

* e, :func:`~transformer_xl.experiments.gpucheck.train_check.train_resume`: ``txl train`` undisturbed, then
  SIGKILLed after a checkpoint and resumed with ``--resume auto``; the losses after the resume point compared.
* f, :func:`~transformer_xl.experiments.gpucheck.serve_check.serve_concurrent`: a real ``txl serve`` answering
  clients in threads at once, each answer equal to the same request answered alone.

Both return a dict with ``status`` (``"ok"``, ``"failed"`` or ``"skipped"``), their figures and ``checks``
(``[{"name", "ok", ...}]``, what the driver's exit status reads). The ``txl`` processes are started as
``python -m transformer_xl`` with this package's sources on ``PYTHONPATH`` (the check runs from a checkout, txl not
installed), in the part's process group, so that the driver stopping a part at its cap stops them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import transformer_xl
from transformer_xl.experiments.gpucheck.options import CheckOptions

#: The folder that holds the ``transformer_xl`` package (``src`` of a checkout).
SOURCES = Path(transformer_xl.__file__).resolve().parents[1]


def txl_command(*args: str) -> list[str]:
    """``python -m transformer_xl ARGS`` with this interpreter."""
    return [sys.executable, "-m", "transformer_xl", *args]


def txl_env(opts: CheckOptions, cache: Path | None = None) -> dict[str, str]:
    """The environment of a ``txl`` process: :data:`SOURCES` first on ``PYTHONPATH``, unbuffered output, one thread
    with ``tiny`` (a CPU run on one core), and ``TXL_CACHE_DIR`` = ``cache`` unless one is set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCES), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; the GPU machine may have no network
    if opts.tiny:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if cache is not None and not env.get("TXL_CACHE_DIR"):
        env["TXL_CACHE_DIR"] = str(cache)
    return env


def stop(proc: subprocess.Popen, grace: float = 10.0) -> int | None:
    """End ``proc``: SIGTERM, then SIGKILL after ``grace`` seconds; its exit status (``None``: it outlived both)."""
    for end in (proc.terminate, proc.kill):
        if proc.poll() is not None:
            break
        end()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def last_line(log: Path) -> str:
    """``": <the last non-empty line of log>"`` (what a failed process said last), or ``""``."""
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f": {lines[-1][:300]}" if lines else ""
