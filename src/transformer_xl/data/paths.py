"""Where datasets live: data directory and prepared-cache directory resolution."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DATA_DIR_ENV = "TXL_DATA_DIR"
CACHE_DIR_ENV = "TXL_CACHE_DIR"


def user_cache_dir() -> Path:
    """The per-user cache folder of txl (``$XDG_CACHE_HOME/txl``, ``~/.cache/txl``, ``%LOCALAPPDATA%\\txl``)."""
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "txl"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "txl"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "txl"


def _first_dir(given: str | Path | None, env_var: str, cache_sub: str) -> Path:
    """``given`` if set and non-empty, else ``$env_var`` if non-empty, else ``<user cache>/<cache_sub>``."""
    if given is not None and str(given) != "":
        return Path(given).expanduser().resolve()
    env = os.environ.get(env_var)
    if env:
        return Path(env).expanduser().resolve()
    return user_cache_dir() / cache_sub


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The raw-data directory: ``data_dir`` if given, else ``$TXL_DATA_DIR``, else ``<user cache>/data``."""
    return _first_dir(data_dir, DATA_DIR_ENV, "data")


def resolve_cache_dir(cache_dir: str | Path | None = None, data_dir: Path | None = None) -> Path:
    """The folder holding prepared caches: ``cache_dir``, else ``$TXL_CACHE_DIR``, else ``<user cache>/prepared``.

    Caches never go inside the data directory (it may be a shared, read-only mount); each cache folder
    is keyed by a hash of the preparation config and the absolute source paths. ``data_dir`` is
    accepted for symmetry and unused.
    """
    return _first_dir(cache_dir, CACHE_DIR_ENV, "prepared")
