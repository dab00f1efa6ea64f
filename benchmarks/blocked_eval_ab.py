"""Long-memory evaluation, the position term whole (as before issue 26 item 4) vs in blocks, in one process.

The same model and memories are streamed through ``Recurrence`` (inference cache) with the two attention paths
alternated round by round (the path switched by rebinding ``attention.attend``); per segment time, tokens/s and
MFU against the fp32 matmul peak measured in the same run, and the largest per-token NLL difference.

Usage::

    python benchmarks/blocked_eval_ab.py --threads 1 --cpu-time   # CPU time: robust on a shared machine
    python benchmarks/blocked_eval_ab.py --threads 2 --case word --mem-lens 1600 --block-mib 1,16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import transformer_xl.model.attention as attention
from transformer_xl.experiments.bench.cases import bench_case
from transformer_xl.experiments.bench.runner import zipf_tokens
from transformer_xl.experiments.bench.yardstick import forward_flops, gemm_peak
from transformer_xl.model import Recurrence, TransformerXLLM
from transformer_xl.model.blocked import ShiftedScores, attend_blocked
from transformer_xl.model.dispatch import attend
from transformer_xl.model.fastpath import attend_fused
from transformer_xl.model.positional import PositionScores


def whole(q, k, v, p, mask_bias, *, scale: float, dropatt: float, plain: bool = False) -> torch.Tensor:
    """The attention with ``P`` formed whole (the path before blocking)."""
    if isinstance(p, PositionScores):
        p = ShiftedScores.of(*p).dense()
    return attend_fused(q, k, v, p, mask_bias, scale=scale, dropatt=dropatt)


def blocks_of(nbytes: int) -> Callable[..., Any]:
    def fn(q, k, v, p, mask_bias, *, scale: float, dropatt: float, plain: bool = False) -> torch.Tensor:
        if isinstance(p, PositionScores):
            return attend_blocked(q, k, v, ShiftedScores.of(*p), mask_bias, scale=scale, block_bytes=nbytes)
        return attend_fused(q, k, v, p, mask_bias, scale=scale, dropatt=dropatt)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="char")
    ap.add_argument("--mem-lens", default="128,512,1600")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--block-mib", default="", help="also time these block sizes (MiB), besides the default rule")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="segments per round")
    ap.add_argument("--cpu-time", action="store_true", help="thread CPU time instead of wall time (1 thread)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    paths: dict[str, Callable[..., Any]] = {"whole": whole, "blocked": attend}
    for mib in filter(None, args.block_mib.split(",")):
        paths[f"{mib} MiB"] = blocks_of(int(float(mib) * (1 << 20)))
    case = bench_case(args.case)
    cfg = case.config
    torch.manual_seed(0)
    model = TransformerXLLM(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    seq = zipf_tokens(cfg.n_token, (case.batch_size, cfg.tgt_len + 1), gen)
    x, y = seq[:, :-1], seq[:, 1:]
    peak = gemm_peak("fp32")
    print(f"case {args.case}, {torch.get_num_threads()} threads, fp32 peak {peak / 1e9:.1f} GFLOP/s, "
          f"{'CPU' if args.cpu_time else 'wall'} time, load {os.getloadavg()}")
    for mem in [int(m) for m in args.mem_lens.split(",")]:
        recs, times, nll = {}, {name: [] for name in paths}, {}
        for name in paths:
            g = torch.Generator().manual_seed(1)
            mems = [torch.randn(case.batch_size, mem, cfg.d_model, generator=g) for _ in range(cfg.n_layer + 1)]
            recs[name] = Recurrence(model, cfg.lengths(mem_len=mem), mems=mems)
        with torch.no_grad():
            for name, fn in paths.items():
                attention.attend = fn
                for _ in range(2):
                    nll[name] = recs[name](x, y).nll
            for _ in range(args.rounds):
                for name, fn in paths.items():
                    attention.attend = fn
                    t = clock()
                    for _ in range(args.steps):
                        recs[name](x, y)
                    times[name].append((clock() - t) / args.steps)
        attention.attend = attend
        flops = forward_flops(cfg, batch=case.batch_size, qlen=cfg.tgt_len, mlen=mem, targets=y,
                              streaming=True)["total"]
        base = statistics.median(times["whole"])
        for name in paths:
            t = statistics.median(times[name])
            print(f"mem {mem:5d} {name:8s} {t * 1e3:7.1f} ms/segment  {case.batch_size * cfg.tgt_len / t:7.0f} tok/s  "
                  f"MFU {flops / t / peak:6.1%}  x{base / t:4.2f}  rounds(ms) {[round(r * 1e3) for r in times[name]]}  "
                  f"max|dNLL| {(nll[name] - nll['whole']).abs().max().item():.1e}")
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
