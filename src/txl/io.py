"""Weights on disk without pickle: ``config.json`` + ``model.safetensors``, written atomically.

Tied parameters (``tie_weight``/``tie_projs``) share storage; safetensors refuses shared tensors, so one
name per storage is written and the other names are recorded as aliases in the file's metadata.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from txl.errors import CheckpointError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
_ALIASES_KEY = "txl_aliases"
FORMAT_VERSION = "1"


def atomic_write(path: str | Path, write: Any, *, binary: bool = True) -> None:
    """Write ``path`` via ``write(file_object)`` into a temporary file, fsync it, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_tensors(tensors: dict[str, Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Save a state dict to safetensors atomically, writing shared storages once (aliases in metadata)."""
    canonical: dict[tuple[int, int, tuple[int, ...]], str] = {}
    unique: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in canonical:
            aliases[name] = canonical[key]
        else:
            canonical[key] = name
            unique[name] = t.detach().contiguous().cpu()
    meta = {"format": "pt", "txl_format_version": FORMAT_VERSION, _ALIASES_KEY: json.dumps(aliases)}
    meta.update(metadata or {})
    tmp_dir = Path(path).parent
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}.", suffix=".tmp", dir=tmp_dir)
    os.close(fd)
    try:
        save_file(unique, tmp, metadata=meta)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_tensors(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Load a safetensors file written by :func:`save_tensors`, restoring aliased names."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    for alias, name in json.loads(meta.get(_ALIASES_KEY, "{}")).items():
        tensors[alias] = tensors[name]
    return tensors


def save_weights(model: nn.Module, config: Any, directory: str | Path) -> Path:
    """Write ``config.json`` (``config.to_json()``) and ``model.safetensors`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(model.state_dict(), directory / WEIGHTS_NAME)
    text = config.to_json()
    atomic_write(directory / CONFIG_NAME, lambda f: f.write(text), binary=False)
    return directory


def load_weights(directory: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, dict]:
    """Read ``(config dict, state dict)`` from a directory written by :func:`save_weights`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"model directory not found: {directory}")
    cfg_path = directory / CONFIG_NAME
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path} not found (a txl model directory holds {CONFIG_NAME} and "
                              f"{WEIGHTS_NAME})")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {exc}") from exc
    return config, load_tensors(directory / WEIGHTS_NAME, map_location)
