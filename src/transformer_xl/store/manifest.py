"""SHA-256 manifests: what a directory txl wrote held when it was written, checked when it is read.

A manifest is ``MANIFEST.json`` in the directory it describes::

    {"files": {"model.safetensors": {"sha256": "…", "bytes": 1234}, "config.json": {…}}, …}

(a training checkpoint adds ``"step"``). Every directory of weights txl writes has one: checkpoints
(:mod:`transformer_xl.store.checkpoint`), model directories (:func:`transformer_xl.store.layout.save_model_dir`, so
``save_pretrained``, a run's ``best/`` and ``final/``, ``txl convert`` outputs). Readers call
:func:`verify_manifest`, which refuses in one line

* an entry that is not a plain file name (a path separator, ``..``, an absolute path, an empty name), before
  opening any file, so a manifest cannot make txl read outside its directory;
* a listed file that is missing, has another size (truncated) or another SHA-256 (changed, bit rot).

Files the manifest does not list are not checked (e.g. a ``vocab.json`` added later). A directory without a
manifest (written by an older txl, or by hand) is read unchecked unless the manifest is ``required``.
"""

from __future__ import annotations

import ntpath
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformer_xl.errors import CheckpointError
from transformer_xl.store.files import read_json, sha256_file, write_json

MANIFEST = "MANIFEST.json"


def is_plain_name(name: object) -> bool:
    """Whether ``name`` names a file directly inside a directory: a non-empty string without a path separator
    (``/`` or ``\\``), not ``.`` or ``..``, not absolute, no drive, no NUL."""
    return (isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
            and not os.path.isabs(name) and not ntpath.splitdrive(name)[0])


def manifest_entry(path: str | Path) -> dict[str, Any]:
    """``{"sha256": hex, "bytes": size}`` of one file."""
    path = Path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def plain_files(directory: str | Path) -> list[str]:
    """The names of the regular files directly in ``directory``, sorted, without the manifest itself and hidden
    files (``.name``: the temporary files of an atomic write)."""
    return sorted(p.name for p in Path(directory).iterdir()
                  if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def write_manifest(directory: str | Path, names: Iterable[str] | None = None, **extra: Any) -> Path:
    """(Re)write ``directory/MANIFEST.json`` with the SHA-256 and size of ``names`` (default: every plain file
    of the directory, :func:`plain_files`); ``extra`` keys (e.g. ``step``) are stored beside ``"files"``.

    Call it last, after every file of the directory is written: a file written afterwards is not covered, and
    a listed file changed afterwards is refused on read."""
    directory = Path(directory)
    listed = plain_files(directory) if names is None else sorted(set(names))
    for name in listed:
        if not is_plain_name(name) or name == MANIFEST:
            raise CheckpointError(f"cannot list {name!r} in a manifest: only plain file names of the directory")
    doc = {**extra, "files": {name: manifest_entry(directory / name) for name in listed}}
    return write_json(directory / MANIFEST, doc, indent=1)  # pragma: no mutate (the indent is layout; readers parse)


def read_manifest(directory: str | Path, *, required: bool = False, what: str = "directory") -> dict[str, Any] | None:
    """The manifest of ``directory`` with every entry checked for shape and plain names (no file opened), or
    None when there is none and it is not ``required``."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        if required:
            raise CheckpointError(f"{directory} is not a complete {what} (no {MANIFEST})")
        return None
    manifest = read_json(path, f"manifest {path}", CheckpointError)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path} is unreadable (no 'files' object)")
    for name, info in files.items():
        if not is_plain_name(name):
            raise CheckpointError(f"{path} lists {name!r}, which is not a plain file name of {directory} "
                                  "(a manifest names files inside its own directory only)")
        if (not isinstance(info, dict) or not isinstance(info.get("sha256"), str)
                or not isinstance(info.get("bytes"), int) or isinstance(info.get("bytes"), bool)):
            raise CheckpointError(f"{path} is unreadable (entry {name!r} needs 'sha256' and 'bytes')")
    return manifest


def verify_manifest(directory: str | Path, *, required: bool = False, what: str = "directory",
                    names: Iterable[str] | None = None) -> dict[str, Any] | None:
    """Check the files of ``directory`` against its manifest (all listed files, or those of ``names`` that it
    lists); returns the manifest, or None when there is none and it is not ``required``.

    Raises a one-line :class:`CheckpointError` naming the first file that is missing, has another size or
    another SHA-256."""
    directory = Path(directory)
    manifest = read_manifest(directory, required=required, what=what)
    if manifest is None:
        return None
    wanted = None if names is None else set(names)
    for name, info in manifest["files"].items():
        if wanted is not None and name not in wanted:
            continue
        f = directory / name
        if not f.is_file():
            raise CheckpointError(f"{directory} lacks {name}, which its {MANIFEST} lists")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{f} does not match its SHA-256 in {MANIFEST}: {size} bytes where "
                                  f"{info['bytes']} were written (truncated or changed)")
        if sha256_file(f) != info["sha256"]:
            raise CheckpointError(f"{f} does not match its SHA-256 in {MANIFEST} (corrupt or changed after "
                                  "it was written)")
    return manifest


def verify_beside(*paths: str | Path) -> None:
    """Check each file of ``paths`` against the manifest of its own directory, when that directory has one
    listing it (e.g. the files of a ``txl convert --to official`` export, read back one by one)."""
    by_dir: dict[Path, set[str]] = {}
    for p in map(Path, paths):
        by_dir.setdefault(p.parent, set()).add(p.name)
    for directory, names in by_dir.items():
        verify_manifest(directory, names=names)
