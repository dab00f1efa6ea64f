"""Where a captured decode step spends its time: ``torch.profiler`` over steps of
:class:`~transformer_xl.inference.captured.CapturedDecoder` on the WT103-base shape of ``txl bench generate``
(random weights), the memory full from the first step; prints the top operators by self CPU time per step.

    python benchmarks/profile_decode_step.py --mem-len 640 --batch 1 --int8 --kv-dtype bfloat16
    python benchmarks/profile_decode_step.py --mem-len 640 --batch 1            # fp32 weights and ring

One thread unless ``--threads``; the first (compiling) step and ``--warmup`` more are not profiled.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from transformer_xl.experiments.bench.generate import shape_config
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.model import TransformerXLLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="wt103-base")
    ap.add_argument("--mem-len", type=int, default=640)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--kv-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = shape_config(args.shape)
    model = TransformerXLLM(cfg).eval()
    dec = CapturedDecoder(model, batch=args.batch, mem_len=args.mem_len, int8=args.int8, kv_dtype=args.kv_dtype)
    mems = [torch.randn(args.batch, args.mem_len, cfg.d_model) for _ in range(cfg.n_layer + 1)]
    tok = torch.zeros(args.batch, dtype=torch.long)
    dec.load(mems)
    for _ in range(1 + args.warmup):
        lp, mems = dec.step(tok, mems)
        tok = lp.argmax(-1)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            lp, mems = dec.step(tok, mems)
            tok = lp.argmax(-1)
    wall = (time.perf_counter() - start) / args.steps
    print(f"{args.shape} mem_len {args.mem_len} batch {args.batch} int8 {args.int8} ring {args.kv_dtype}, "
          f"{args.threads} thread(s): {wall * 1e3:.1f} ms a step under the profiler (compile {dec.compile_s:.1f} s)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
