"""Training checkpoints without pickle: one ``step_{:08d}/`` directory per save, verified on load.

A checkpoint directory holds

* ``model.safetensors`` + ``config.json``: the model, loadable with ``TransformerXLLM.from_pretrained``;
* ``train_state.json``: every non-tensor part of the trainer state (step counters, scheduler, data
  iterator position, Python/NumPy RNG, optimizer hyper-parameters), tensors replaced by references;
* ``train_state.safetensors``: the referenced tensors (optimizer moments, memories, torch RNG states);
* ``MANIFEST.json``: the SHA-256 and size of each file above, checked by :func:`load_checkpoint`.

It is built inside :func:`transformer_xl.store.files.atomic_dir` (a hidden temporary directory beside its final place,
every file fsynced, then renamed into place), so a crash leaves either the complete checkpoint or none.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_xl.errors import CheckpointError
from transformer_xl.store.files import atomic_dir, read_json, write_json
from transformer_xl.store.layout import (
    CONFIG,
    MANIFEST,
    TRAIN_STATE_JSON,
    TRAIN_STATE_TENSORS,
    load_model_dir,
    model_fields,
    save_model_dir,
    step_dir,
    step_dirs,
)
from transformer_xl.store.manifest import verify_manifest, write_manifest
from transformer_xl.store.tensors import load_tensors, save_tensors

_REF = "__tensor__"


def split_tensors(obj: Any, tensors: dict[str, Tensor] | None = None, prefix: str = "") -> tuple[Any, dict]:
    """Replace every tensor inside nested dicts/lists by ``{"__tensor__": key}``; returns (json_obj, tensors)."""
    tensors = {} if tensors is None else tensors
    if isinstance(obj, Tensor):
        key = prefix or "t"
        tensors[key] = obj.detach().cpu().clone() if obj.dim() else obj.detach().cpu().reshape(1).clone()
        return {_REF: key, "scalar": obj.dim() == 0}, tensors
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise CheckpointError(f"cannot store a state key of type {type(k).__name__}")
            out[str(k) if isinstance(k, str) else f"__int__{k}"] = split_tensors(v, tensors, f"{prefix}.{k}")[0]
        return out, tensors
    if isinstance(obj, (list, tuple)):
        return [split_tensors(v, tensors, f"{prefix}.{i}")[0] for i, v in enumerate(obj)], tensors
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj, tensors
    raise CheckpointError(f"cannot store a state value of type {type(obj).__name__} at {prefix!r}")


def join_tensors(obj: Any, tensors: dict[str, Tensor]) -> Any:
    """Inverse of :func:`split_tensors`."""
    if isinstance(obj, dict):
        if _REF in obj:
            t = tensors.get(obj[_REF])
            if t is None:
                raise CheckpointError(f"checkpoint lacks the tensor {obj[_REF]!r}")
            return t.reshape(()) if obj.get("scalar") else t
        return {(int(k[7:]) if k.startswith("__int__") else k): join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join_tensors(v, tensors) for v in obj]
    return obj


def save_checkpoint(root: str | Path, step: int, model_state: dict[str, Tensor], config_json: str,
                    state: dict[str, Any]) -> Path:
    """Write ``root/step_{step:08d}/`` atomically (replacing a checkpoint of the same step); ``state`` is a
    nested dict that may hold tensors."""
    final = step_dir(root, step)
    with atomic_dir(final) as tmp:
        save_model_dir(tmp, model_state, config_json)
        meta, tensors = split_tensors(state)
        save_tensors(tensors, tmp / TRAIN_STATE_TENSORS)
        write_json(tmp / TRAIN_STATE_JSON, meta, indent=1)  # pragma: no mutate (the indent is layout; readers parse)
        write_manifest(tmp, step=step)
    return final


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check every file of a checkpoint against its manifest (required); returns the manifest."""
    manifest = verify_manifest(path, required=True, what="checkpoint")
    assert manifest is not None
    return manifest


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete ``step_*`` directories under ``root`` (those with a manifest), oldest first."""
    return [p for p in step_dirs(root) if (p / MANIFEST).is_file()]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", *,
                    verify: bool = True) -> tuple[dict, dict, dict]:
    """Verify and read a checkpoint: ``(model config dict, model state dict, trainer state)``. ``verify=False``
    is for a caller that has just run :func:`verify_checkpoint` itself (the files are hashed once)."""
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    config, weights = load_model_dir(path, map_location, verify=False)  # just verified
    meta = read_json(path / TRAIN_STATE_JSON, f"checkpoint state {path / TRAIN_STATE_JSON}", CheckpointError)
    state = join_tensors(meta, load_tensors(path / TRAIN_STATE_TENSORS, map_location))
    return config, weights, state


def prune_checkpoints(root: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (temporary directories are left alone: they may be
    another writer's; :func:`remove_stale_temporaries` clears a dead writer's)."""
    ckpts = list_checkpoints(root)
    for old in ckpts[: max(0, len(ckpts) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def read_checkpoint_meta(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model config and the JSON part of the trainer state of a checkpoint, without reading any tensor."""
    path = Path(path)
    config = model_fields(read_json(path / CONFIG, f"checkpoint config {path / CONFIG}", CheckpointError),
                          CheckpointError)
    meta = read_json(path / TRAIN_STATE_JSON, f"checkpoint state {path / TRAIN_STATE_JSON}", CheckpointError)
    return config, meta


def remove_stale_temporaries(root: str | Path) -> None:
    """Delete the temporary ``.step_*.tmp`` directories a killed writer left under ``root`` (only call this while
    holding the run's lock: no other process is writing there)."""
    for tmp in Path(root).glob(".step_*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
