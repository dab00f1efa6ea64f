"""The captured decode step against its limit, the time to read the bytes it reads at the machine's read rate: every
case of the issue's targets in one run, beside the plain step.

    python benchmarks/decode_kernels.py --threads 2 --out benchmarks/results/decode_kernels_cpu_2t.json

Cases are ``SHAPE:MEM_LEN:BATCH`` or ``SHAPE:MEM_LEN:BATCH:int8`` (int8 weights and a bf16 key/value ring, as
``txl bench generate`` runs its int8 decoder); the default is :data:`TARGETS`. Shapes: ``wt103-base`` (WT103's base
model with a 33,278-word softmax), ``wt103-full`` (the real WT103 vocabulary, 267,735 words), ``demo`` (the demo
model's shape: 4 layers, d_model 128, WikiText-2's 33,278 words, div_val 4; its 10 MB fit in the last-level cache,
so its step is bound by the cost per operation, not by reading memory); random weights.

The limit (:mod:`transformer_xl.experiments.bench.yardstick`): the bytes the step needs
(:func:`~transformer_xl.experiments.bench.yardstick.step_bytes`: weights, key/value ring, position keys, slot
positions; not the zeros that pad blocks, reported apart) at the read rate, the best ``Tensor.sum`` pass over a
buffer far larger than the last-level cache, on huge pages as the step's own buffers
(:func:`~transformer_xl.experiments.bench.yardstick.read_rate`), measured before the first case and after every
case; every share is against the best of the run. The read rate on 4 KiB pages is recorded beside it (earlier
result files were measured against that one). With one thread every time is the thread's CPU time
(``time.thread_time``), the read passes included, so that other work on a shared machine does not count (memory
traffic of other work still does); with more, wall time. ``--products`` picks the form of the step's matrix
products (txl's kernels or inductor's reductions; default: the rule for this CPU), recorded in the report.
Each figure is the best of ``--steps`` steps after three
untimed ones (the first compiles); the plain step is generation's (``Recurrence`` + ``log_prob``), of the int8
model (``model.quantize("int8")``) in the int8 cases.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from transformer_xl.experiments.bench.generate import shape_config
from transformer_xl.experiments.bench.yardstick import YardstickError, machine, read_buffer, share, step_bytes
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.model import Recurrence, TransformerXLLM, native
from transformer_xl.model.presets import cpu_small, wt103_base
from transformer_xl.train.precision import isa_limits

SHAPES = {
    "wt103-base": lambda: shape_config("wt103-base"),
    "wt103-full": wt103_base,
    "demo": lambda: cpu_small(33278),
}
#: The cases of the issue and the share of the read rate each should reach (None: reported, no target).
TARGETS = {"wt103-base:640:1": 0.85, "wt103-base:1600:1": 0.80, "wt103-base:640:8": 0.70,
           "wt103-base:640:1:int8": 0.75, "wt103-full:640:1": 0.85, "demo:128:1": None}


def _best(fn, clock, n: int) -> tuple[float, float]:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t = clock()
        fn()
        ts.append(clock() - t)
    return min(ts), statistics.median(ts)


def run_case(case: str, clock, n: int, products: str | None = None) -> dict:
    shape, mem_len, batch, *rest = case.split(":")
    mem_len, batch, int8 = int(mem_len), int(batch), rest == ["int8"]
    cfg = SHAPES[shape]()
    torch.manual_seed(0)
    model = TransformerXLLM(cfg).eval()
    mems = [torch.randn(batch, mem_len, cfg.d_model) for _ in range(cfg.n_layer + 1)]
    tok = torch.randint(0, cfg.n_token, (batch,))
    plain_model = model
    if int8:
        plain_model = TransformerXLLM(cfg).eval()
        plain_model.load_state_dict(model.state_dict())
        plain_model.quantize("int8")
    rec = Recurrence(plain_model, plain_model.config.lengths(mem_len=mem_len, ext_len=0), mems=list(mems))
    plain = _best(lambda: plain_model.log_prob(rec(tok[:, None]).hidden[:, -1]), clock, n)  # generation's plain step
    dec = CapturedDecoder(model, batch=batch, mem_len=mem_len, int8=int8, kv_dtype="bfloat16" if int8 else "float32",
                          products=products)
    state = {"mems": mems}

    def one() -> None:
        _, state["mems"] = dec.step(tok, state["mems"])

    dec.load(mems)
    best, median = _best(one, clock, n)
    nbytes = step_bytes(dec)
    return {"case": case, "shape": shape, "n_token": cfg.n_token, "mem_len": mem_len, "batch": batch, "int8": int8,
            "kv_dtype": dec.kv_dtype, "target": TARGETS.get(case), "products": dec.products,
            "plain_step_s": {"best": plain[0], "median": plain[1]},
            "captured": {"best_s": best, "median_s": median, "compile_s": dec.compile_s, "bytes": nbytes,
                         "bytes_per_s": nbytes["total"] / best, "tok_per_s": batch / best}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cases", nargs="+", default=list(TARGETS))
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--out", type=Path)
    p.add_argument("--products", choices=["native", "compiled"], default=None,
                   help="the form of the step's matrix products (default: the rule for this CPU, "
                   "transformer_xl.model.dispatch.decode_products)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    rates = [_read_pass(clock)]
    report = {"command": isa_limits() + "python benchmarks/decode_kernels.py " + " ".join(
        [f"--threads {args.threads}", "--cases", *args.cases, f"--steps {args.steps}"]
        + ([f"--products {args.products}"] if args.products else [])),
        "machine": machine() | {"vendor": native.vendor()}, "torch": torch.__version__,
        "products": args.products or native.products(),
        "clock": "thread_time (CPU time of the one thread)" if args.threads == 1 else "wall",
        "read_rate_4k_pages_bytes_per_s": _read_pass(clock, huge_pages=False), "rows": []}
    print(f"read rate {rates[0] / 1e9:.1f} GB/s on huge pages, {report['read_rate_4k_pages_bytes_per_s'] / 1e9:.1f} "
          f"GB/s on 4 KiB pages ({report['clock']}); load {report['machine']['load_average']}", flush=True)
    with torch.no_grad():
        for case in args.cases:
            row = run_case(case, clock, args.steps, args.products)
            report["rows"].append(row)
            rates.append(_read_pass(clock))  # the load moves: the limit is the best read pass of the whole run
            _shares(report, rates)
            report["load_average_after"] = machine()["load_average"]
            c = row["captured"]
            print(f"{case}: captured {c['best_s'] * 1e3:.2f} ms, {c['bytes_per_s'] / 1e9:.1f} GB/s = "
                  f"{c['share_of_read_rate']:.0%} of the read rate (target {row['target'] or '-'}; plain "
                  f"{row['plain_step_s']['best'] * 1e3:.2f} ms; compile {c['compile_s']:.0f} s)", flush=True)
            if args.out:
                args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"best read rate of the run {report['read_rate_bytes_per_s'] / 1e9:.1f} GB/s; load after "
          f"{report['load_average_after']}")
    for row in report["rows"]:
        print(f"{row['case']}: {row['captured']['share_of_read_rate']:.0%} (target {row['target'] or '-'})")


def _read_pass(clock, huge_pages: bool = True) -> float:
    buf = read_buffer(huge_pages=huge_pages)
    return buf.nbytes / _best(buf.sum, clock, 5)[0]  # the yardstick's read pass, on the steps' clock


def _shares(report: dict, rates: list[float]) -> None:
    """Every share against the best read rate of the run so far."""
    best = max(rates)
    report["read_rate_bytes_per_s"], report["read_rate_samples"] = best, rates
    for row in report["rows"]:
        c = row["captured"]
        c["share_of_read_rate"] = share(c["bytes_per_s"], best, row["case"])


if __name__ == "__main__":
    try:
        main()
    except YardstickError as exc:  # a share above its limit: the load moved too much between the passes
        raise SystemExit(f"decode_kernels: {exc}") from None
