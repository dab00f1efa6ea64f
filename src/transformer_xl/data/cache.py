"""The prepared-corpus cache: ``{split}.npy`` + ``vocab.json`` + ``manifest.json`` (no pickle anywhere).

The manifest records the schema and txl versions, the preparation config, every source file's size,
mtime and SHA-256, the vocabulary's size and SHA-256, and each array's length and dtype, so that a
stale or foreign cache is detected before use. Sources are compared by size and SHA-256 (an edit that keeps
the size and the mtime is found by content). The manifest names plain file names in its folder only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import time
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np

from transformer_xl.data.builders import Built
from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import DataError
from transformer_xl.store.files import atomic_dir, check_plain_name, sha256_file, write_json
from transformer_xl.store.layout import CACHE_MANIFEST as MANIFEST
from transformer_xl.store.layout import VOCAB
from transformer_xl.store.outputs import refusal
from transformer_xl.version import __version__

SCHEMA_VERSION = 1


def config_key(config: dict[str, Any]) -> str:
    """Short stable hash of a preparation config (names the cache folder)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:12]


def fingerprint(path: Path) -> dict[str, Any]:
    """Size, mtime and SHA-256 of a source file."""
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_file(path)}


def write_cache(
    cache_dir: Path,
    built: Built,
    *,
    dataset: str,
    config: dict[str, Any],
    sources: list[Path],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``built`` atomically (temporary folder, then rename) and return its manifest. When another process
    (e.g. another rank of the same ``torchrun``) published the same cache first, the rename finds the folder
    taken: that cache, built from the same sources and config, is kept and its manifest returned. A folder that
    existed before (a stale cache, ``--rebuild``) is replaced; a new one is only ever created, never moved aside
    under a reader's feet."""
    try:
        return _write_cache(cache_dir, built, dataset=dataset, config=config, sources=sources, extra=extra,
                            replace=cache_dir.exists())
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        theirs = read_manifest(cache_dir)
        if theirs is None:
            raise
        return theirs


def _write_cache(cache_dir: Path, built: Built, *, dataset: str, config: dict[str, Any], sources: list[Path],
                 extra: dict[str, Any] | None, replace: bool) -> dict[str, Any]:
    why = refusal(cache_dir, "txl data prepare", written=_cache_files) if replace else None
    if why is not None:  # a cache is replaced whole: never over files it does not hold itself
        raise DataError(f"{why}: refusing to replace it; move them out, or delete the folder to rebuild the cache")
    with atomic_dir(cache_dir, replace=replace) as tmp:
        arrays: dict[str, Any] = {}
        for key, arr in {**built.splits, **built.extras}.items():
            np.save(tmp / f"{key}.npy", np.ascontiguousarray(arr), allow_pickle=False)
            arrays[key] = {"file": f"{key}.npy", "length": int(arr.shape[0]), "dtype": str(arr.dtype)}
        built.vocab.save(tmp / VOCAB)
        manifest = {
            "schema": SCHEMA_VERSION,
            "txl_version": __version__,
            "dataset": dataset,
            "config": config,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sources": [fingerprint(p) for p in sources],
            "vocab": {"file": VOCAB, "size": len(built.vocab), "sha256": built.vocab.sha256()},
            "splits": {k: v for k, v in arrays.items() if k in built.splits},
            "extras": {k: v for k, v in arrays.items() if k in built.extras},
            **(extra or {}),
        }
        write_json(tmp / MANIFEST, manifest, indent=1, sort_keys=False)
    return manifest


def _cache_files(cache_dir: Path) -> set[str]:
    """The entries of ``cache_dir`` a cache holds: its manifest and the files that manifest lists (arrays and
    vocabulary), and nothing else -- not a ``.npy`` it does not list, not any file where there is no manifest. A
    manifest damaged beyond reading (a crash, a bad disk: the cache must be rebuilt) vouches for what a cache holds by
    its names: ``*.npy``, the vocabulary and itself."""
    try:
        manifest = read_manifest(cache_dir)
    except DataError:
        return {p.name for p in cache_dir.iterdir()
                if p.is_file() and not p.is_symlink() and (p.suffix == ".npy" or p.name in (MANIFEST, VOCAB))}
    if manifest is None:
        return set()
    entries = [manifest.get("vocab", {}), *manifest.get("splits", {}).values(), *manifest.get("extras", {}).values()]
    listed = {MANIFEST, *(e["file"] for e in entries if "file" in e)}  # plain names: read_manifest checked them
    return {n for n in listed if (cache_dir / n).is_symlink() or not (cache_dir / n).is_dir()}


def read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    """The manifest of a cache folder, or None if there is none; a one-line :class:`DataError` when it is there
    but unreadable, not a JSON object of the expected structure, or names a file outside the folder."""
    path = cache_dir / MANIFEST
    if not path.is_file():
        return None
    hint = "; rebuild with --rebuild"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"cache manifest {path} is unreadable ({exc}){hint}") from None
    if not isinstance(manifest, dict):
        raise DataError(f"cache manifest {path} is not a JSON object{hint}")
    sections = {key: manifest.get(key, {}) for key in ("splits", "extras", "vocab")}
    sources = manifest.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(v, dict) for v in [*sources, *sections.values()]):
        raise DataError(f"cache manifest {path} has the wrong structure (sources, splits, extras, vocab){hint}")
    for section in ("splits", "extras"):
        for key, info in sections[section].items():
            if not isinstance(info, dict) or not isinstance(info.get("length"), int) or \
                    not isinstance(info.get("dtype"), str):
                raise DataError(f"cache manifest {path}: {section} entry {key!r} has the wrong structure{hint}")
            check_plain_name(info.get("file"), f"cache manifest {path} ({section} {key!r})")
    if "file" in sections["vocab"]:
        check_plain_name(sections["vocab"]["file"], f"cache manifest {path} (vocab)")
    return manifest


def stale_reason(
    manifest: dict[str, Any], *, dataset: str, config: dict[str, Any], sources: list[Path], cache_dir: Path
) -> str | None:
    """Why a cache cannot be used for (dataset, config, sources), or None when it is valid."""
    if manifest.get("schema") != SCHEMA_VERSION:
        return f"cache schema {manifest.get('schema')} != {SCHEMA_VERSION}"
    if manifest.get("txl_version") != __version__:
        return f"built by txl {manifest.get('txl_version')}, this is txl {__version__}"
    if manifest.get("dataset") != dataset or manifest.get("config") != json.loads(json.dumps(config, default=str)):
        return "built with another dataset or preparation config"
    recorded = manifest.get("sources", [])
    if [r.get("path") for r in recorded] != [str(p) for p in sources]:
        return "built from other source files"
    for rec, path in zip(recorded, sources):
        try:
            st = path.stat()
        except OSError:
            return f"source {path} is gone"
        if st.st_size != rec.get("size"):
            return f"source {path} changed size"
        if sha256_file(path) != rec.get("sha256"):  # by content: an edit may keep the size and the mtime
            return f"source {path} changed content (sha256)"
    vinfo = manifest.get("vocab", {})
    try:
        vocab = Vocab.load(cache_dir / VOCAB)
    except DataError as exc:
        return str(exc)
    if vocab.sha256() != vinfo.get("sha256") or len(vocab) != vinfo.get("size"):
        return "vocab.json does not match the manifest (another vocabulary)"
    for info in {**manifest.get("splits", {}), **manifest.get("extras", {})}.values():
        f = cache_dir / info["file"]
        if not f.exists():
            return f"{f.name} is missing"
    return None


def read_npy(path: Path, *, mmap: bool = False) -> np.ndarray:
    """An array from a ``.npy`` file, and from that format only, memory-mapped with ``mmap``. ``np.load`` picks the
    format by the file's first bytes, so a damaged array that begins with the zip magic was opened as an ``.npz``
    and raised ``zipfile.BadZipFile``; here it is a bad ``.npy`` magic like any other. Whatever bad bytes do (a
    header that does not parse, a size the file does not hold, pickled objects) is a :class:`ValueError` naming it."""
    try:
        if mmap:
            return np.lib.format.open_memmap(path, mode="r")
        with open(path, "rb") as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(str(exc) or type(exc).__name__) from None
    except (SyntaxError, EOFError, TokenError, RecursionError, MemoryError, OverflowError):
        raise ValueError("its .npy header cannot be parsed") from None


def load_arrays(cache_dir: Path, entries: dict[str, Any], vocab_size: int | None = None) -> dict[str, np.ndarray]:
    """Memory-map the arrays listed in a manifest section, checking length and dtype, and with ``vocab_size``
    that every id is below it."""
    out = {}
    for key, info in entries.items():
        path = cache_dir / check_plain_name(info["file"], f"cache manifest in {cache_dir}")
        try:
            arr = read_npy(path, mmap=True)
        except ValueError as exc:
            raise DataError(f"{path}: unreadable cache array ({exc}); rebuild with --rebuild") from None
        if arr.ndim != 1 or arr.shape[0] != info["length"] or str(arr.dtype) != info["dtype"]:
            raise DataError(f"{path}: does not match its manifest; rebuild with --rebuild")
        if vocab_size is not None and arr.size and int(arr.max()) >= vocab_size:
            raise DataError(f"{path}: holds token id {int(arr.max())}, but the vocabulary has {vocab_size} "
                            "symbols; rebuild with --rebuild")
        out[key] = arr
    return out


def list_caches(cache_root: Path, label: str, under: Path | None = None) -> list[dict[str, Any]]:
    """The caches already prepared for ``label`` in ``cache_root`` (none is built), newest first: folder, level,
    tokenizer, vocabulary size, tokens per split and when built. ``under``: only caches whose source files lie in
    this file or folder (user text: another folder of the same name has another cache)."""
    out = []
    folders = sorted(cache_root.glob(f"{label}-*")) if cache_root.is_dir() else []
    for folder in folders:
        manifest = read_manifest(folder)
        if manifest is None or manifest.get("dataset") != label:
            continue
        paths = [Path(str(s.get("path"))) for s in manifest.get("sources", [])]
        if under is not None and not any(p == under or under in p.parents for p in paths):
            continue
        options = manifest.get("config", {}).get("options", {})
        out.append({
            "cache_dir": str(folder),
            "level": "tokenizer" if options.get("tokenizer") else options.get("level", "word"),
            "tokenizer": options.get("tokenizer"),
            "options": options,
            "vocab_size": manifest.get("vocab", {}).get("size"),
            "tokens": {k: v.get("length") for k, v in manifest.get("splits", {}).items()},
            "created": manifest.get("created"),
        })
    return sorted(out, key=lambda c: str(c["created"]), reverse=True)
