"""``torch.distributed`` as ``torchrun`` starts it (gloo on CPU, NCCL on GPU), or a single process; the model's
DDP wrapper (:func:`wrap_ddp`).

Failures of other processes end this one instead of hanging it: the process group is created with the run's
``dist_timeout`` (a collective that waits longer fails), and :meth:`Dist.guard` turns a failed collective into
:class:`RankLost`, one line naming the rank(s) that did not answer (each failing process writes ``failed/RANK`` into
the group's store; the ranks that wrote nothing within a few seconds died or stalled). :meth:`Dist.close` tears the
group down in order: a barrier, then ``destroy_process_group`` on every process at the same point of the run.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from transformer_xl.devices import bind, ddp_device_ids, process_group_backend
from transformer_xl.errors import TXLError
from transformer_xl.inference.loading import check_device
from transformer_xl.model.config import TXLConfig
from transformer_xl.train.config import TrainConfig


class RankLost(TXLError):
    """A collective failed: another process died, stalled or did not answer within ``dist_timeout``."""


#: Seconds a failing process waits for the others to report their own failure before naming the silent ones.
REPORT_WAIT = 3.0


def _is_collective_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the communication backend (gloo/NCCL raise plain ``RuntimeError``s)."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, getattr(dist, "DistError", ())) or any(k in text for k in ("gloo", "NCCL", "Gloo"))


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, without gloo's source-file prefix, at most 160 characters."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__).split("] ", 1)[-1][:160]


def _attempt_store(timeout: datetime.timedelta) -> Any:
    """Under ``torchrun``'s shared store, a store of this attempt's own (``txl/attempt_N/``), else ``None``.

    The workers of every attempt (``TORCHELASTIC_RESTART_COUNT``) connect to the same store, the agent's, and
    ``init_process_group("env://")`` does not prefix its keys with the attempt: after a restart, gloo could read
    the previous attempt's addresses and fail with "Connection refused" (seen here in one restart of three)."""
    import torch.distributed as dist

    count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if count is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"txl/attempt_{count}", store)


class Dist:
    """``torch.distributed`` as started by ``torchrun`` (``WORLD_SIZE``/``RANK``/``LOCAL_RANK``), or one process.

    ``timeout``: seconds any collective may wait for the other processes (the process group's timeout)."""

    def __init__(self, device: str, timeout: float = 1800.0) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.timeout = timeout
        self.owns_group = False
        if self.world_size > 1:
            import torch.distributed as dist

            bind(device)  # NCCL would otherwise put every process on GPU 0
            if not dist.is_initialized():
                self.owns_group = True
                backend, wait = process_group_backend(device), datetime.timedelta(seconds=timeout)
                try:
                    store = _attempt_store(wait)
                    if store is None:
                        dist.init_process_group(backend, timeout=wait)
                    else:
                        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                                timeout=wait)
                except RuntimeError as exc:  # DistError (store unreachable, rendezvous timeout) and gloo's
                    if not _is_collective_error(exc):
                        raise
                    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
                    raise RankLost(f"rank {self.rank} of {self.world_size} could not join the process group (store "
                                   f"{where}): {_first_line(exc)}; dist_timeout is {timeout:g} s") from None
            self.world_size, self.rank = dist.get_world_size(), dist.get_rank()

    def close(self, *, sync: bool = True) -> None:
        """Leave the process group: with ``sync`` after a barrier (every process tears it down at the same point,
        no collective in flight); without it at once (after a failure, when a barrier would wait for the dead).
        gloo's threads live on while a DDP wrapper holds the group: ``txl train`` ends a torchrun worker with
        ``os._exit`` after flushing (:func:`transformer_xl.cli.train.run`)."""
        if self.owns_group:
            import torch.distributed as dist

            self.owns_group = False
            if dist.is_initialized():
                if sync:
                    dist.barrier()
                dist.destroy_process_group()

    @contextlib.contextmanager
    def guard(self, where: Callable[[], str]) -> Iterator[None]:
        """Turn a failed collective inside the block into :class:`RankLost` naming the ranks that did not answer;
        ``where()`` says what the run was doing (e.g. ``"step 7"``)."""
        try:
            yield
        except RuntimeError as exc:
            if not self.owns_group or not _is_collective_error(exc):
                raise
            raise RankLost(self._lost_message(where(), exc)) from None

    def _lost_message(self, where: str, exc: BaseException) -> str:
        cause = _first_line(exc)
        silent = self._silent_ranks(where)
        who = ("the other ranks cannot be asked (the group's store is gone)" if silent is None else
               f"rank {', '.join(map(str, silent))} did not answer (died or stalled)" if silent else
               "every other rank failed too")
        return (f"rank {self.rank} of {self.world_size} at {where}: {who}; a collective failed ({cause}); "
                f"dist_timeout is {self.timeout:g} s")

    def _silent_ranks(self, where: str) -> list[int] | None:
        """The ranks that wrote no failure report into the group's store within :data:`REPORT_WAIT` seconds."""
        try:
            import torch.distributed as dist

            store = dist.distributed_c10d._get_default_store()
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            store.set(f"txl/{attempt}/failed/{self.rank}", where)
            keys = {r: f"txl/{attempt}/failed/{r}" for r in range(self.world_size) if r != self.rank}
            deadline = time.monotonic() + REPORT_WAIT
            while True:
                silent = [r for r, k in keys.items() if not store.check([k])]
                if not silent or time.monotonic() > deadline:
                    return silent
                time.sleep(0.1)
        except Exception:  # the store itself is gone (its host died): nothing to name
            return None

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
    check_device(cfg.device)  # CUDA asked for where there is none: one line
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
    return DistributedDataParallel(model, device_ids=ddp_device_ids(device),
                                   find_unused_parameters=has_step_local_parameters(cfg), **no_sync)
