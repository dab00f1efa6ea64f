"""State dicts as safetensors files, without pickle.

Tied parameters (``tie_weight``/``tie_projs``) share storage; safetensors refuses shared tensors, so one
name per storage is written and the other names are recorded as aliases in the file's metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from txl.errors import CheckpointError
from txl.store.files import atomic_path

_ALIASES_KEY = "txl_aliases"
FORMAT_VERSION = "1"


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Save a state dict to safetensors atomically, writing shared storages once (aliases in metadata)."""
    canonical: dict[tuple, str] = {}
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    storages: set[int] = set()
    for name, t in tensors.items():  # the same storage, place, shape, strides and dtype: the same tensor
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in canonical:
            aliases[name] = canonical[key]
            continue
        canonical[key] = name
        t = t.detach().contiguous().cpu()
        unique[name] = t.clone() if ptr in storages else t  # another view of a saved storage: its own copy
        storages.add(ptr)
    meta = {"format": "pt", "txl_format_version": FORMAT_VERSION, _ALIASES_KEY: json.dumps(aliases)}
    meta.update(metadata or {})
    with atomic_path(path) as tmp:
        save_file(unique, str(tmp), metadata=meta)
    return Path(path)


def load_tensors(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load a safetensors file written by :func:`save_tensors`, restoring aliased names."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    try:
        aliases = json.loads(meta.get(_ALIASES_KEY, "{}"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: unreadable alias metadata ({exc})") from exc
    for alias, name in aliases.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: alias {alias!r} names a missing tensor {name!r}")
        tensors[alias] = tensors[name]
    return tensors
