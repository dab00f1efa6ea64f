"""``torch.distributed`` as ``torchrun`` starts it (gloo on CPU, NCCL on GPU), or a single process; the model's
DDP wrapper (:func:`wrap_ddp`)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from transformer_xl.errors import ConfigError
from transformer_xl.model.config import TXLConfig
from transformer_xl.train.config import TrainConfig


class Dist:
    """``torch.distributed`` as started by ``torchrun`` (``WORLD_SIZE``/``RANK``/``LOCAL_RANK``), or one process."""

    def __init__(self, device: str) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owns_group = False
        if self.world_size > 1:
            import torch.distributed as dist

            if device.startswith("cuda"):
                torch.cuda.set_device(device)
            if not dist.is_initialized():
                self.owns_group = True
                dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
            self.world_size, self.rank = dist.get_world_size(), dist.get_rank()

    def close(self) -> None:
        """Leave the process group (after the last collective of the run)."""
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.owns_group = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: Tensor, op: str = "sum") -> Tensor:
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t

    def gather_rows(self, t: Tensor, device: Any) -> Tensor:
        """Concatenate every process's ``t`` along dim 0, in rank order (on every process)."""
        if not self.enabled:
            return t
        import torch.distributed as dist

        local = t.to(device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.cat(parts, 0)

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def broadcast_float(self, value: float, device: Any) -> float:
        if not self.enabled:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.broadcast(t, 0)
        return float(t.item())


def resolve_device(cfg: TrainConfig, local_rank: int) -> str:
    if cfg.device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {cfg.device!r} requested but CUDA is not available")
    return f"cuda:{local_rank}" if cfg.device == "cuda" else cfg.device


def has_step_local_parameters(cfg: TXLConfig) -> bool:
    """Whether a training step can leave parameters of ``cfg``'s model without a gradient (DDP then needs
    ``find_unused_parameters=True``, an extra graph traversal every step; without it DDP fails at the next step).

    The rule: only adaptive clusters with parameters of their own. With ``cutoffs`` and ``div_val > 1`` each
    cluster has its own embedding, output layer and projections, used only when an input or target of the step
    falls in it; with ``div_val == 1`` and ``d_embed != d_model`` the tail clusters' untied output projections are
    used only for their targets. Everything else (a full softmax, ``div_val == 1`` with ``d_embed == d_model`` where
    the tail clusters are slices of the one output layer, the sampled softmax whose negatives index the whole
    embedding matrix, every attention/positional variant) gives every parameter a gradient in every step."""
    if not cfg.cutoffs:
        return False
    return cfg.div_val > 1 or cfg.d_embed != cfg.d_model


def wrap_ddp(model: torch.nn.Module, cfg: TXLConfig, device: str) -> torch.nn.Module:
    """``model`` in ``DistributedDataParallel``: ``find_unused_parameters`` by :func:`has_step_local_parameters`;
    buffers are not broadcast at each forward (the one buffer, the positional ``inv_freq``, is computed from the
    config and equal on every process; torch >= 2.13 names that ``forward_sync_buffers``, the deprecated
    ``broadcast_buffers`` before)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
               inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
    return DistributedDataParallel(model, device_ids=[device] if device.startswith("cuda") else None,
                                   find_unused_parameters=has_step_local_parameters(cfg), **no_sync)
