"""The training state a checkpoint holds: :func:`capture_state` gathers a
:class:`~transformer_xl.train.trainer.Trainer`'s
model, optimizer, schedule, grad scaler, counters, the window of losses the next log line averages, data position,
memories and the random number generators of every process; :func:`restore_state` puts them back (the memories' and
generators' rows of this process)."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch

from transformer_xl.devices import collective_device, is_cuda, to_device
from transformer_xl.train.distributed import Dist
from transformer_xl.version import __version__


def capture_rng(dist: Dist, device: str) -> dict[str, Any]:
    """Python and NumPy generator states of this process, torch (and CUDA) states of every process (gathered)."""
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    comm = collective_device(device)
    cuda = None
    if is_cuda(device):
        cuda = dist.gather_rows(torch.cuda.get_rng_state(device).to(comm)[None], comm).cpu()
    return {"python": [version, list(state), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            "torch": dist.gather_rows(torch.get_rng_state()[None], comm).cpu(), "cuda": cuda}


def restore_rng(rng: dict[str, Any], rank: int, device: str) -> None:
    """Restore what :func:`capture_rng` saved; ``rank`` picks this process's torch states."""
    random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    # a row of the gathered states is a view at an offset of its storage, which torch.set_rng_state mishandles
    # (rank 1's row of a 2-process checkpoint: "Invalid mt19937 state", or a crash): each row is copied first
    torch.set_rng_state(rng["torch"][rank].to(torch.uint8).cpu().clone())
    if rng.get("cuda") is not None and is_cuda(device):
        torch.cuda.set_rng_state(rng["cuda"][rank].to(torch.uint8).cpu().clone(), device)


def capture_state(tr: Any) -> dict[str, Any]:
    """Everything a trainer needs to continue exactly; memories and RNG states of all processes are gathered."""
    comm = collective_device(tr.device)
    mems = [tr.dist.gather_rows(m, comm).cpu() for m in tr.mems] if tr.mems else None
    return {
        "format": 1, "txl_version": __version__, "world_size": tr.dist.world_size,
        "step": tr.step, "tokens": tr.tokens, "elapsed": tr.elapsed,
        "nonfinite_total": tr.nonfinite_total, "nonfinite_run": tr.nonfinite_run,
        "loss_window": tr.loss_window.state_dict(),  # the losses since the last logged step
        "best_valid": tr.best_valid if math.isfinite(tr.best_valid) else None, "best_step": tr.best_step,
        "model": tr.model.state_dict(),
        "optimizer": tr.optimizer.state_dict(), "schedule": tr.schedule.state_dict(),
        "scaler": tr.scaler.state_dict() if tr.scaler is not None else None,
        "data": tr.train_iter.state_dict(), "mems": mems, "mems_epoch": tr.mems_epoch,
        "rng": capture_rng(tr.dist, tr.device), "train_config": tr.cfg.to_dict(), "vocab_sha256": tr.vocab_sha256,
        "precision": tr.precision.name,  # what --precision auto resolved to: a resume keeps it
    }


def restore_state(tr: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_state` for this process of ``tr``."""
    if "model" in state:
        tr.model.load_state_dict_strict(to_device(state["model"], tr.device))
    tr.optimizer.load_state_dict(state["optimizer"])
    tr.schedule.load_state_dict(state["schedule"])
    if tr.scaler is not None and state.get("scaler"):
        tr.scaler.load_state_dict(state["scaler"])
    tr.train_iter.load_state_dict(state["data"])
    tr.step, tr.tokens, tr.elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
    tr.nonfinite_total, tr.nonfinite_run = int(state["nonfinite_total"]), int(state["nonfinite_run"])
    tr.loss_window.load_state_dict(state.get("loss_window"))  # absent from older checkpoints: an empty window
    tr.best_valid = math.inf if state.get("best_valid") is None else float(state["best_valid"])
    tr.best_step = int(state.get("best_step", 0))
    per = tr.cfg.batch_size // tr.dist.world_size
    rows = slice(tr.dist.rank * per, (tr.dist.rank + 1) * per)
    tr.mems = to_device([m[rows] for m in state["mems"]], tr.device) if state.get("mems") else None
    tr.mems_epoch = int(state.get("mems_epoch", 0))
    saved_world = int(state.get("world_size", 1))  # another process count: the global batch is split anew
    restore_rng(state["rng"], tr.dist.rank if tr.dist.rank < saved_world else 0, tr.device)
    if tr.dist.rank >= saved_world:  # a process the checkpoint had none for: dropout masks of its own
        torch.manual_seed((tr.cfg.seed + 1_000_003 * tr.dist.rank + tr.step) % 2**32)
