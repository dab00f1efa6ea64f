"""State dicts as safetensors files, without pickle.

Tied parameters (``tie_weight``/``tie_projs``) share storage; safetensors refuses shared tensors, so one
name per storage is written and the other names are recorded as aliases in the file's metadata.

:func:`read_header` gives the names, shapes and dtypes a file holds without reading a tensor (a reader
compares them with what it expects before allocating anything); :func:`check_finite` refuses NaN/inf weights.

The bytes written are a function of the tensors and metadata alone, so equal weights have equal SHA-256 (and
manifests): safetensors orders the tensors by dtype, then name, but writes the metadata from a Rust ``HashMap``,
whose order changes from one call to the next; :func:`save_tensors` rewrites the header with the metadata's keys
sorted (the same JSON, so the same length: in place).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from transformer_xl.errors import CheckpointError
from transformer_xl.store.files import atomic_path

_ALIASES_KEY = "txl_aliases"
FORMAT_VERSION = "1"


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Save a state dict to safetensors atomically, writing shared storages once (aliases in metadata, the first
    name of a storage in ``tensors``' order the one stored). The same state dict and metadata give the same bytes,
    whatever the order of the metadata's keys (and of the tensors, but for which tied name is stored)."""
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
    meta = {"format": "pt", "txl_format_version": FORMAT_VERSION, _ALIASES_KEY: json.dumps(aliases, sort_keys=True)}
    meta.update(metadata or {})
    with atomic_path(path) as tmp:
        save_file(unique, str(tmp), metadata=meta)
        _sort_metadata(tmp)
    return Path(path)


def _sort_metadata(path: Path) -> None:
    """Rewrite the header of the safetensors file ``path`` with its metadata's keys sorted, in place: the JSON
    safetensors wrote (compact, UTF-8, padded with spaces to its length) with only the keys' order changed."""
    with open(path, "r+b") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        meta = header.pop("__metadata__", None)
        ordered = {"__metadata__": dict(sorted(meta.items())), **header} if meta is not None else header
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) > size:  # a bug: the same JSON, reordered, cannot grow
            raise RuntimeError(f"{path}: the sorted safetensors header is longer than the written one")
        f.seek(8)
        f.write(text.ljust(size, b" "))


@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header says of one tensor: its shape and dtype (``"F32"``, ``"BF16"``, ``"I64"`` …)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def floating(self) -> bool:
        """Whether the dtype is a floating point one (``F16``, ``BF16``, ``F32``, ``F64``, ``F8_*``)."""
        return self.dtype.startswith(("F", "BF"))


def read_header(path: str | Path) -> dict[str, TensorInfo]:
    """Name -> :class:`TensorInfo` of every tensor of a safetensors file, aliased names included, read from the
    header alone (no tensor is read or allocated). A missing, truncated (the header claims more bytes than the
    file holds) or malformed file is a one-line :class:`CheckpointError`."""
    path = _existing(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            infos, names = {}, f.keys()
            for name in names:
                piece = f.get_slice(name)
                infos[name] = TensorInfo(tuple(int(d) for d in piece.get_shape()), str(piece.get_dtype()))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    for alias, name in _aliases(path, meta, infos).items():
        infos[alias] = infos[name]
    return infos


def check_finite(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """A one-line :class:`CheckpointError` naming the first floating point tensor of ``tensors`` (read from
    ``path``) that holds a NaN or an infinity."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = t.isnan().sum().item(), t.isinf().sum().item()
            raise CheckpointError(f"{path}: tensor {name!r} holds non-finite values ({bad[0]} NaN, {bad[1]} inf); "
                                  "refusing weights that cannot give a finite loss")


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    return path


def _aliases(path: Path, meta: dict[str, str], stored: Iterable[str]) -> dict[str, str]:
    """The alias -> stored name map of a file's metadata, each alias naming one of the ``stored`` tensors."""
    try:
        aliases = json.loads(meta.get(_ALIASES_KEY, "{}"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: unreadable alias metadata ({exc})") from exc
    if not isinstance(aliases, dict):
        raise CheckpointError(f"{path}: unreadable alias metadata (not an object)")
    stored = set(stored)
    for alias, name in aliases.items():
        if name not in stored:
            raise CheckpointError(f"{path}: alias {alias!r} names a missing tensor {name!r}")
    return aliases


def load_tensors(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load a safetensors file written by :func:`save_tensors`, restoring aliased names."""
    path = _existing(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    for alias, name in _aliases(path, meta, tensors).items():
        tensors[alias] = tensors[name]
    return tensors
