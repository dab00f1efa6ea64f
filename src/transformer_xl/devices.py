"""Where a computation runs: the few rules that differ between a CPU and a CUDA device, in one place.

Everything else in txl is written once for any device; what must differ is here, each rule a function the CPU
tests call with ``"cuda:N"`` as well (the rules are pure: no GPU is needed to check what they decide):

* :func:`synchronize`: CUDA kernels run asynchronously, a timer must wait for them; the CPU's have returned;
* :func:`process_group_backend` / :func:`collective_device` / :func:`ddp_device_ids`: NCCL over CUDA tensors,
  one GPU per process; gloo over CPU tensors (``torchrun`` on CPUs);
* :func:`bind`: a CUDA process makes its GPU current before any collective (NCCL would otherwise pick GPU 0);
* :func:`to_device`: the tensors of a nested state (model weights, memories) moved to the device of this process,
  so that a checkpoint written on one device resumes on another (the optimizer's state follows its parameters in
  ``load_state_dict``; the random generators' states are restored where they belong, CPU or CUDA);
* :func:`available_bytes`: the memory a device can still give (CUDA's free memory; on the CPU the kernel's
  estimate within the container's limit), which ``txl train``, ``score`` and ``eval`` compare their estimates with;
* :func:`float32_matmul_settings`: whether fp32 products may run as TF32 on CUDA, recorded in every run so that a
  figure says what it measured.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def is_cuda(device: str | torch.device) -> bool:
    """Whether ``device`` (``"cuda"``, ``"cuda:1"``, a :class:`torch.device`) is a CUDA device."""
    return torch.device(device).type == "cuda"


def synchronize(device: str | torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA runs kernels asynchronously; on other devices a no-op)."""
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def process_group_backend(device: str | torch.device) -> str:
    """The ``torch.distributed`` backend of a process computing on ``device``: NCCL for CUDA, gloo otherwise."""
    return "nccl" if is_cuda(device) else "gloo"


def collective_device(device: str | torch.device) -> str:
    """Where the tensors of a collective must live for :func:`process_group_backend`'s backend: the GPU for NCCL,
    the CPU for gloo."""
    return str(device) if is_cuda(device) else "cpu"


def ddp_device_ids(device: str | torch.device) -> list[torch.device] | None:
    """``DistributedDataParallel``'s ``device_ids``: the process's one GPU, or None on the CPU (where DDP refuses
    device ids)."""
    return [torch.device(device)] if is_cuda(device) else None


def bind(device: str | torch.device) -> None:
    """Make ``device`` the process's current CUDA device (before its process group starts); a no-op on the CPU."""
    if is_cuda(device):
        torch.cuda.set_device(torch.device(device))


def to_device(obj: Any, device: str | torch.device) -> Any:
    """``obj`` with every tensor inside its nested dicts, lists and tuples moved to ``device`` (the rest as is)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def float32_matmul_settings() -> dict[str, Any]:
    """How this process computes float32 products: ``torch.get_float32_matmul_precision()`` (``"highest"``: true
    fp32; ``"high"``: TF32 on CUDA), and whether cuBLAS and cuDNN may use TF32 (``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``
    turns cuBLAS's on too). TF32 keeps 10 mantissa bits of the inputs: a fp32 run's losses then differ from the
    official code's in the fourth digit."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32)}


def available_bytes(device: str | torch.device, *, meminfo: Path = Path("/proc/meminfo"),
                    cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory ``device`` can still give: CUDA's free memory (``torch.cuda.mem_get_info``); on the CPU
    ``MemAvailable`` of ``meminfo`` (else the free physical pages), at most the room a container's memory limit
    leaves (cgroup v2 ``memory.max`` less ``memory.current`` under ``cgroup``, else v1's ``memory/`` files); None
    where unknown (another device, a system without these files)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    if dev.type != "cpu":
        return None
    found = _meminfo(meminfo, "MemAvailable")
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):  # not a POSIX system
            return None
    room = _cgroup_room(cgroup)
    return found if room is None else min(found, room)


def _meminfo(path: Path, field: str) -> int | None:
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field and value.split() and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024  # kB
    return None


#: A container's memory limit and usage under the cgroup root: v2's files, then v1's.
CGROUP_FILES = (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))


def _cgroup_room(root: Path) -> int | None:
    """The container's memory limit less its usage (cgroup v2, else v1), or None without a (finite) limit."""
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit = (root / limit_file).read_text(encoding="ascii").strip()
            if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as a huge number
                return None
            return max(int(limit) - int((root / usage_file).read_text(encoding="ascii").strip()), 0)
        except (OSError, ValueError, UnicodeDecodeError):
            continue
    return None
