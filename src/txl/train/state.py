"""The parts of a training state that are not the model's or the optimizer's own ``state_dict``: the random
number generators of every process, and finding and checking the checkpoint a run resumes from."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from txl.errors import CheckpointError
from txl.store.checkpoint import list_checkpoints
from txl.store.layout import RunDir, is_checkpoint_dir
from txl.train.distributed import Dist

#: Model fields a resumed run may set differently from its checkpoint (they size no parameter of the
#: relative encodings; for attn_type 1 and 3 a change is caught by the weights' shapes).
RESUMABLE_CHANGES = ("tgt_len", "ext_len", "mem_len", "clamp_len", "same_length")


def find_resume_checkpoint(path: str | Path) -> Path:
    """The checkpoint to resume from: ``path`` itself if it is one, else the newest under ``path/checkpoints``."""
    path = Path(path)
    if is_checkpoint_dir(path):
        return path
    ckpts = list_checkpoints(RunDir(path).checkpoints)
    if not ckpts:
        raise CheckpointError(f"no checkpoint to resume from in {path} (expected {RunDir(path).checkpoints}/step_*/)")
    return ckpts[-1]


def check_same_model(saved: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """A one-line :class:`CheckpointError` if the checkpoint's model config differs from the run's."""
    diff = [k for k in config if k not in RESUMABLE_CHANGES and saved.get(k) != config[k]]
    if diff:
        raise CheckpointError(f"{path} holds a model with {diff[0]}={saved.get(diff[0])!r}, but this config "
                              f"builds {diff[0]}={config[diff[0]]!r}")


def capture_rng(dist: Dist, device: str) -> dict[str, Any]:
    """Python and NumPy generator states of this process, torch (and CUDA) states of every process (gathered)."""
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    comm = device if device.startswith("cuda") else "cpu"
    cuda = None
    if device.startswith("cuda"):
        cuda = dist.gather_rows(torch.cuda.get_rng_state(device).to(comm)[None], comm).cpu()
    return {"python": [version, list(state), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            "torch": dist.gather_rows(torch.get_rng_state()[None], comm).cpu(), "cuda": cuda}


def restore_rng(rng: dict[str, Any], rank: int, device: str) -> None:
    """Restore what :func:`capture_rng` saved; ``rank`` picks this process's torch states."""
    random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(rng["torch"][rank].to(torch.uint8).cpu())
    if rng.get("cuda") is not None and device.startswith("cuda"):
        torch.cuda.set_rng_state(rng["cuda"][rank].to(torch.uint8).cpu(), device)
