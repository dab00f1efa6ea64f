"""Files that a crash cannot leave half-written, their SHA-256, and JSON read with one-line errors.

The files txl writes as a whole (configs, weights, vocabularies, results, caches) go through :func:`atomic_write`
(or :func:`write_text` / :func:`write_json`, :func:`atomic_path`): the bytes go to a temporary file beside the
target, are fsynced, then renamed over it, so a reader sees the old file or the new one. An OS error while writing
(a full disk) names the target. Directories that must
appear whole (checkpoints, model directories, prepared data caches) are built inside :func:`atomic_dir` and
renamed into place. Logs that grow line by line (``metrics.jsonl``) are appended to, and plots are written by
matplotlib.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from transformer_xl.errors import ConfigError, DataError, TXLError


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry (a rename inside it) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; then the file is fsynced, renamed over ``path``
    and the directory entry fsynced. An exception removes the temporary file and leaves ``path`` as it was.
    The file gets the permissions a plain ``open`` would give it (``0o666`` less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        _name_path(exc, path)
        raise


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` via ``write(binary_file)`` into a temporary file, fsync it, then rename it over ``path``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write` of UTF-8 text."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str | Path, obj: Any, *, indent: int = 2, sort_keys: bool = True) -> Path:
    """:func:`atomic_write` of ``obj`` as JSON (non-JSON numbers such as NumPy floats become floats)."""
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=float) + "\n")


@contextlib.contextmanager
def atomic_dir(final: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """Build a directory that appears whole or not at all.

    Yields a hidden temporary directory beside ``final``; when the block ends normally its files are
    fsynced and it replaces ``final`` (an existing ``final`` is moved aside first and removed after),
    and the parent directory is fsynced. An exception removes the temporary directory. With
    ``replace=False`` a ``final`` that another process published meanwhile is never moved (a reader of it
    would see it vanish for a moment): the rename fails with ``ENOTEMPTY``/``EEXIST`` instead.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        fsync_dir(tmp)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; a directory of the run is not
        if replace:
            _replace_dir(tmp, final)
        else:
            os.rename(tmp, final)  # fails on a published (non-empty) final: the caller keeps that one
        fsync_dir(final.parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _name_path(exc, final)
        raise


def _name_path(exc: BaseException, path: Path) -> None:
    """Give an OS error without a file name (a full disk on ``write``) the path being written, so that its
    one-line message says where."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
        exc.filename = str(path)


def _replace_dir(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``; an existing ``final`` is moved aside first and put back if the rename fails."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    try:
        os.replace(new, final)
    except BaseException:
        if old.exists() and not final.exists():
            os.replace(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (as stored, not decompressed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def parse_json_object(text: str, what: str, error: type[TXLError] = ConfigError) -> dict[str, Any]:
    """Parse ``text`` as a JSON object, or raise a one-line ``error`` about ``what``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} JSON must be an object")
    return data


def read_json(path: str | Path, what: str | None = None, error: type[TXLError] = ConfigError) -> dict[str, Any]:
    """The JSON object in ``path``; a one-line ``error`` when it is missing, not UTF-8 or not an object."""
    path = Path(path)
    label = what or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{label} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{label} cannot be read ({exc})") from None
    return parse_json_object(text, label if what else str(path), error)


def check_plain_name(name: Any, what: str, error: type[TXLError] = DataError) -> str:
    """``name`` when it is a plain file name (no folder separator, not ``.``/``..``, not empty or absolute), else
    a one-line ``error`` naming ``what`` (e.g. the manifest that lists it): a manifest cannot point outside its
    folder."""
    seps = {"/", "\\", os.sep, os.altsep or "/"}
    if (not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in seps) or "\0" in name
            or os.path.isabs(name)):
        raise error(f"{what} names {name!r}, not a plain file name in its folder; delete it or rebuild")
    return name
