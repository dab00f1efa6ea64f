"""Which products the captured decode step's float32 weights go through, measured: BLAS (``F.linear``, MKL's
matrix-vector kernel at batch 1) against one multiply-and-sum per matrix that inductor compiles into a streaming
reduction (:func:`transformer_xl.inference.decode.float_linear`), beside the plain step, against the machine's read
rate and the bytes a step reads (:mod:`transformer_xl.experiments.bench.yardstick`).

    python benchmarks/decode_kernels.py --threads 1 --cases wt103-base:640:1 wt103-full:640:1 demo:128:1 \
        --out benchmarks/results/decode_kernels_cpu_1t.json

Cases are ``SHAPE:MEM_LEN:BATCH``; shapes: ``wt103-base`` (33,278 words), ``wt103-full`` (the real WT103
vocabulary, 267,735 words), ``demo`` (the demo model's shape: 4 layers, d_model 128, WikiText-2's 33,278 words,
div_val 4); random weights. With one thread every time is the thread's CPU time (``time.thread_time``), the read
pass included, so that other work on a shared machine does not count; with more, wall time. Each figure is the
best of ``--steps`` steps after three untimed ones (the first compiles).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import transformer_xl.inference.captured as captured
import transformer_xl.inference.decode as decode
from transformer_xl.experiments.bench.generate import shape_config
from transformer_xl.experiments.bench.yardstick import machine, read_rate, step_bytes
from transformer_xl.model import Recurrence, TransformerXLLM
from transformer_xl.model.presets import cpu_small, wt103_base

SHAPES = {
    "wt103-base": lambda: shape_config("wt103-base"),
    "wt103-full": wt103_base,
    "demo": lambda: cpu_small(33278),
}
NEW = {name: getattr(decode, name) for name in ("float_linear", "_dot_keys", "_dot_positions", "_mix_values")}


def _blas(x, weight, bias):  # the products as they were: BLAS for every batch
    return F.linear(x, weight, bias)


def _bmm_keys(q, k):
    return torch.matmul(k, q[..., None])[..., 0] if k.dtype == q.dtype else NEW["_dot_keys"](q, k)


def _bmm_positions(qv, pos):
    return torch.matmul(pos, qv.permute(1, 2, 0)).permute(2, 0, 1) if pos.dtype == qv.dtype else \
        NEW["_dot_positions"](qv, pos)


def _bmm_values(prob, v):
    return torch.matmul(prob[:, :, None, :], v)[:, :, 0] if v.dtype == prob.dtype else NEW["_mix_values"](prob, v)


BMM_ATTENTION = {"_dot_keys": _bmm_keys, "_dot_positions": _bmm_positions, "_mix_values": _bmm_values}
#: variant -> the functions of transformer_xl.inference.decode it runs with (the others: the module's own)
VARIANTS = {
    "blas": {"float_linear": _blas, **BMM_ATTENTION},  # every product through BLAS (before)
    "reduction-linear": BMM_ATTENTION,  # the weights' products as reductions, the ring's through BLAS
    "reduction": {},  # every product of a batch-1 step as a reduction (the step as it is)
}


def _best(fn, clock, n: int) -> tuple[float, float]:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t = clock()
        fn()
        ts.append(clock() - t)
    return min(ts), statistics.median(ts)


def _captured(model, mems, tok, mem_len: int, clock, n: int, variant: dict) -> dict:
    for name, fn in variant.items():
        setattr(decode, name, fn)
    torch._dynamo.reset()
    captured._COMPILED.clear()
    try:
        dec = captured.CapturedDecoder(model, batch=tok.size(0), mem_len=mem_len)
        state = {"mems": mems}

        def one() -> None:
            _, state["mems"] = dec.step(tok, state["mems"])

        dec.load(mems)
        best, median = _best(one, clock, n)
    finally:
        for name, fn in NEW.items():
            setattr(decode, name, fn)
    return {"best_s": best, "median_s": median, "compile_s": dec.compile_s, "bytes": step_bytes(dec)}


def run_case(shape: str, mem_len: int, batch: int, clock, n: int, rate: float) -> dict:
    cfg = SHAPES[shape]()
    torch.manual_seed(0)
    model = TransformerXLLM(cfg).eval()
    mems = [torch.randn(batch, mem_len, cfg.d_model) for _ in range(cfg.n_layer + 1)]
    tok = torch.randint(0, cfg.n_token, (batch,))
    rec = Recurrence(model, model.config.lengths(mem_len=mem_len, ext_len=0), mems=list(mems))
    plain = _best(lambda: model.log_prob(rec(tok[:, None]).hidden[:, -1]), clock, n)  # generation's plain step
    row = {"shape": shape, "n_token": cfg.n_token, "mem_len": mem_len, "batch": batch,
           "plain_step_s": {"best": plain[0], "median": plain[1]}}
    for name, variant in VARIANTS.items():
        if batch != 1 and name == "reduction-linear":
            continue  # the same step as "reduction" at batch > 1
        r = _captured(model, mems, tok, mem_len, clock, n, variant)
        total = r["bytes"]["total"]
        row[name] = {**r, "bytes_per_s": total / r["best_s"], "share_of_read_rate": total / r["best_s"] / rate,
                     "tok_per_s": batch / r["best_s"]}
        print(f"{shape} mem {mem_len} batch {batch} {name}: {r['best_s'] * 1e3:.2f} ms, "
              f"{total / r['best_s'] / 1e9:.1f} GB/s = {row[name]['share_of_read_rate']:.0%} of the read rate "
              f"(plain {plain[0] * 1e3:.2f} ms; compile {r['compile_s']:.0f} s)", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cases", nargs="+", default=["wt103-base:640:1"])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    rate = _read_pass(clock)
    report = {"command": "python benchmarks/decode_kernels.py " + " ".join(
        [f"--threads {args.threads}", "--cases", *args.cases, f"--steps {args.steps}"]),
        "machine": machine(), "torch": torch.__version__,
        "clock": "thread_time (CPU time of the one thread)" if args.threads == 1 else "wall",
        "read_rate_bytes_per_s": rate, "rows": []}
    print(f"read rate {rate / 1e9:.1f} GB/s ({report['clock']}); load {report['machine']['load_average']}", flush=True)
    rates = [rate]
    with torch.no_grad():
        for case in args.cases:
            shape, mem_len, batch = case.split(":")
            report["rows"].append(run_case(shape, int(mem_len), int(batch), clock, args.steps, rate))
            rates.append(_read_pass(clock))  # the load moves: the limit is the best read pass of the whole run
            _shares(report, rates)
            report["load_average_after"] = machine()["load_average"]
            if args.out:
                args.out.write_text(json.dumps(report, indent=1) + "\n")
    for row in report["rows"]:
        print(", ".join(f"{row['shape']} mem {row['mem_len']} batch {row['batch']} {name} "
                        f"{row[name]['share_of_read_rate']:.0%}" for name in VARIANTS if name in row))


def _read_pass(clock) -> float:
    buf = torch.ones(read_rate(passes=1)["buffer_bytes"] // 4)
    return buf.nbytes / _best(buf.sum, clock, 5)[0]  # the yardstick's read pass, on the steps' clock


def _shares(report: dict, rates: list[float]) -> None:
    """Every share against the best read rate of the run so far."""
    best = max(rates)
    report["read_rate_bytes_per_s"], report["read_rate_samples"] = best, rates
    for row in report["rows"]:
        for name in VARIANTS:
            if name in row:
                row[name]["share_of_read_rate"] = row[name]["bytes_per_s"] / best


if __name__ == "__main__":
    main()
