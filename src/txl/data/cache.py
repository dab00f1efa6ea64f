"""The prepared-corpus cache: ``{split}.npy`` + ``vocab.json`` + ``manifest.json`` (no pickle anywhere).

The manifest records the schema and txl versions, the preparation config, every source file's size,
mtime and SHA-256, the vocabulary's size and SHA-256, and each array's length and dtype, so that a
stale or foreign cache is detected before use.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from txl.data.builders import Built
from txl.data.vocab import Vocab
from txl.errors import DataError
from txl.store.files import atomic_dir, sha256_file, write_json
from txl.store.layout import CACHE_MANIFEST as MANIFEST
from txl.store.layout import VOCAB
from txl.version import __version__

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
    """Write ``built`` atomically (temporary folder, then rename) and return its manifest."""
    with atomic_dir(cache_dir) as tmp:
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


def read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    """The manifest of a cache folder, or None if there is none / it is unreadable."""
    try:
        return json.loads((cache_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


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
        if st.st_mtime_ns != rec.get("mtime_ns") and sha256_file(path) != rec.get("sha256"):
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


def load_arrays(cache_dir: Path, entries: dict[str, Any]) -> dict[str, np.ndarray]:
    """Memory-map the arrays listed in a manifest section, checking length and dtype."""
    out = {}
    for key, info in entries.items():
        path = cache_dir / info["file"]
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: unreadable cache array ({exc}); rebuild with --rebuild") from None
        if arr.ndim != 1 or arr.shape[0] != info["length"] or str(arr.dtype) != info["dtype"]:
            raise DataError(f"{path}: does not match its manifest; rebuild with --rebuild")
        out[key] = arr
    return out
