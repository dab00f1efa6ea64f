"""What the benchmark measures besides time and the yardstick (:mod:`transformer_xl.experiments.bench.yardstick`):
the peak training memory (CPU: a fresh child process per measurement; CUDA: the allocator's high-water mark)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import torch

from transformer_xl.devices import synchronize


def sync(device: str) -> None:
    """Wait for the device (CUDA kernels run asynchronously): :func:`transformer_xl.devices.synchronize`."""
    synchronize(device)


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise OSError(f"{field_name} not in /proc/self/status")


def memory_child(spec: str) -> None:
    """Entry point of the child process that measures one implementation's peak training memory."""
    args = json.loads(spec)
    from transformer_xl.experiments.bench.runner import setup

    runner, x, y = setup(args["case"], args["impl"], device="cpu", dtype=args["dtype"], compile=False,
                          batch=args["batch"], seed=0)
    before = _rss_kib("VmRSS")
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset the high-water mark to the current RSS
    for _ in range(3):
        runner.train_step(x, y)
    print(json.dumps({"rss_before_mib": before / 1024, "peak_rss_mib": _rss_kib("VmHWM") / 1024}))


def peak_memory_cpu(case: str, impl: str, dtype: str, batch: int) -> dict[str, float]:
    spec = json.dumps(dict(case=case, impl=impl, dtype=dtype, batch=batch))
    # A fixed mmap threshold makes glibc return every large freed block, so RSS follows live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    code = f"from transformer_xl.experiments.bench.measure import memory_child; memory_child({spec!r})"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"memory probe failed for {impl}/{case}:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["step_peak_mib"] = out["peak_rss_mib"] - out["rss_before_mib"]
    return out


def peak_memory_cuda(runner: Any, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    runner.mems = None
    runner.opt.state.clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(2):
        runner.train_step(x, y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"rss_before_mib": base / 2**20, "peak_rss_mib": peak / 2**20, "step_peak_mib": (peak - base) / 2**20}
