"""What the benchmark measures besides time: model FLOPs, the matmul peak (the MFU denominator) and the peak
training memory (CPU: a fresh child process per measurement; CUDA: the allocator's high-water mark)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import torch

from transformer_xl.model import TXLConfig
from transformer_xl.train.precision import matmul_rate


def sync(device: str) -> None:
    """Wait for the device (CUDA kernels run asynchronously)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def model_flops(cfg: TXLConfig, *, batch: int, qlen: int, mlen: int, targets: torch.Tensor | None,
                streaming: bool = False) -> float:
    """Matmul FLOPs of one forward segment (2 per multiply-add), counting the math, not any implementation.

    Per layer: ``W_q`` on the segment, ``W_k, W_v`` on memory + segment, ``W_kR`` on the ``K`` position
    rows, the three ``[Q, K]`` score/value products, ``W_o`` and the feed-forward. Plus the adaptive
    input projections and the (adaptive) softmax: the head for every target, a tail for those in it.
    ``streaming`` (evaluation of a long text): ``W_k, W_v`` only on the segment, since every memory
    position was projected once already, when it was a segment token (the work a stream really needs;
    an implementation that projects the memory again does more).
    """
    d, hd, klen, n = cfg.d_model, cfg.n_head * cfg.d_head, qlen + mlen, batch * qlen
    kv_rows = batch * (qlen if streaming else klen)
    layer = 2 * (n * d * hd + kv_rows * d * 2 * hd + klen * d * hd + 3 * batch * qlen * klen * hd
                 + n * hd * d + 2 * n * d * cfg.d_inner)
    bounds = [0, *cfg.cutoffs, cfg.n_token]
    tgt = targets.reshape(-1) if targets is not None else torch.zeros(n, dtype=torch.long)
    out = 0.0
    for i in range(len(bounds) - 1):
        d_i = cfg.d_embed // cfg.div_val**i
        n_i = int(((tgt >= bounds[i]) & (tgt < bounds[i + 1])).sum()) if i else n
        proj = 2 * d * d_i if (cfg.div_val > 1 or cfg.d_embed != d) else 0
        v_i = bounds[i + 1] - bounds[i] + (len(cfg.cutoffs) if i == 0 else 0)
        out += n_i * (proj + 2 * d_i * v_i) + (n_i * proj if cfg.div_val > 1 else 0)  # softmax + input
    return cfg.n_layer * layer + out


def matmul_peak(device: str, dtype: str, n: int = 1024, reps: int = 5) -> float:
    """Best FLOP/s of an ``n x n x n`` matmul of ``dtype`` (``fp32`` or ``bf16``) in this process (the MFU
    denominator; ``8192^3`` on CUDA)."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    return matmul_rate(device, dt, n=8192 if device.startswith("cuda") else n, reps=reps)


def matmul_peaks(device: str) -> dict[str, float]:
    """The fp32 and bf16 peaks (:func:`matmul_peak`), measured one after the other in this process."""
    return {dtype: matmul_peak(device, dtype) for dtype in ("fp32", "bf16")}


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
