"""One writer per run directory: an exclusive OS file lock on ``RUN/.lock``, held for the life of the process.

``fcntl.flock`` locks belong to the open file, so the kernel releases the lock of a process that dies in any
way (SIGKILL included): a lock left by a dead process is simply free and the next run takes it over. The
holder's pid, host and start time are written into the file so that a refused process can name it.
Within one process a second :class:`RunLock` on the same directory is refused as well.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from transformer_xl.errors import TXLError

LOCK = ".lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, the run directory is not protected
    fcntl = None  # type: ignore[assignment]


class RunLockedError(TXLError):
    """Another process (or another object of this one) holds the run directory."""


class RunLock:
    """The exclusive lock of the run directory ``root`` (created if needed).

    ``acquire()`` refuses at once, in one line naming the holder, when another process holds it; ``release()``
    (or leaving the ``with`` block, or the process ending) frees it. The lock file itself stays.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK
        self._file: IO[str] | None = None
        self.created = False  # acquire() made the directory
        self.created_file = False  # acquire() made the lock file

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> RunLock:
        if self._file is not None:
            return self
        try:
            self.created = not self.root.exists()
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise RunLockedError(f"{self.root} exists and is not a directory") from None
        self.created_file = not self.path.exists()
        # kept open while the lock is held; equivalent mutant: "UTF-8" names the same codec as "utf-8"
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115  # pragma: no mutate
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = _describe(f.read())
                f.close()
                raise RunLockedError(f"{self.root} is in use by {holder}: wait for it to end or stop it "
                                     "(one process per run directory)") from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        f.flush()
        self._file = f
        return self

    def release(self, *, discard: bool = False) -> None:
        """Free the lock. ``discard``: also remove the lock file if :meth:`acquire` made it, and the directory if it
        made that and it holds nothing else (a run refused before it wrote anything leaves no trace, in a new
        directory or in one of the user's)."""
        f, self._file = self._file, None
        if f is None:
            return
        if discard and self.created_file:
            with contextlib.suppress(OSError):
                self.path.unlink()
                if self.created and not any(self.root.iterdir()):
                    self.root.rmdir()
        with contextlib.suppress(OSError):
            f.close()  # closing the file drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _describe(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} (since {info['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
