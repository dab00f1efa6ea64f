"""How long ``txl eval`` of each released TensorFlow model takes, measured at its real shape with random weights.

Usage::

    python benchmarks/bench_released_eval.py [--models wt103,enwik8,text8,lm1b] [--batch-size 10] [--segments 2]
        [--device cpu] [--json benchmarks/results/released_eval_cpu.json]

Each model (``transformer_xl.interop.tf.RELEASED``: the architecture ``txl convert --from tf`` reads from the
checkpoint, and the paper's evaluation settings: tgt_len, mem_len, clamp_len, same_length, the TF memory) is built
with random weights in a process of its own and scores random tokens as ``txl eval`` does (``evaluate``,
``--batch-size`` streams): one segment to warm up, then ``--segments`` timed ones. The memory is full from the
first segment (the TF code's first memory is ``mem_len`` zero states), so every segment costs what it costs in the
middle of a test set.
Recorded: tokens/s, the matmul FLOP/s beside the fp32 GEMM peak measured in the same process (a share, the yardstick
of docs/performance.md), the peak resident memory, and the time the model's test set would take at that rate.
The time depends on the weights only through the adaptive softmax's tail clusters (the random targets fall in them
as often as their sizes say, more often than real text's, which favours the head).
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from transformer_xl.experiments.bench.yardstick import forward_flops, gemm_peak, machine
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.interop.tf_released import RELEASED
from transformer_xl.model import TransformerXLLM

#: Tokens of each released model's test set as txl reads it (None: not known here; the estimate is per 100,000).
#: enwik8: the last 5,000,000 bytes less their newline bytes (about 2 %), so at most 5,000,000; text8: 5,000,000
#: characters; WikiText-103: 245,569 tokens (the same articles as WikiText-2's test set).
TEST_TOKENS = {"enwik8": 5_000_000, "text8": 5_000_000, "wt103": 245_569, "lm1b": None}


def one(name: str, batch: int, segments: int, device: str) -> dict:
    released = RELEASED[name]
    cfg = released.config()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = TransformerXLLM(cfg).to(device).eval()
    built = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    n = batch * cfg.tgt_len
    data = rng.integers(0, cfg.n_token, size=(segments + 1) * n + batch + 1)
    # each of the batch's streams gets tgt_len * segments + 1 tokens: whole segments
    evaluate(model, data, batch_size=batch, max_tokens=n + batch, device=device)  # warm-up segment
    result = evaluate(model, data, batch_size=batch, max_tokens=n * segments + batch, device=device)
    per_token = result.seconds / result.tokens
    flops = forward_flops(cfg, batch=batch, qlen=cfg.tgt_len, mlen=cfg.mem_len,
                          targets=torch.as_tensor(data[: n]).view(batch, -1))["total"]
    achieved = flops / (result.seconds / (result.tokens / n))
    peak = gemm_peak("fp32", device)
    tokens = TEST_TOKENS[name]
    return {
        "model": name, "parameters": model.num_parameters(), "batch_size": batch, "tgt_len": cfg.tgt_len,
        "mem_len": cfg.mem_len, "clamp_len": cfg.clamp_len, "same_length": cfg.same_length,
        "segments_timed": round(result.tokens / n, 2), "tokens_per_s": round(1 / per_token, 2),
        "matmul_gflop_per_s": round(achieved / 1e9, 2), "fp32_gemm_peak_gflop_per_s": round(peak / 1e9, 2),
        "share_of_fp32_peak": round(achieved / peak, 3), "build_seconds": round(built, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "test_tokens": tokens, "seconds_per_100k_tokens": round(per_token * 100_000, 1),
        "test_hours": None if tokens is None else round(per_token * tokens / 3600, 2), **machine(device),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="wt103,enwik8,text8,lm1b")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.batch_size, args.segments, args.device)))
        return 0
    rows = []
    for name in args.models.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--batch-size", str(args.batch_size),
                               "--segments", str(args.segments), "--device", args.device],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        report = {"command": "python benchmarks/bench_released_eval.py " + shlex.join(sys.argv[1:]), "rows": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
