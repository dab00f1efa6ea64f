"""Which int8 path for CPU inference: a matrix-vector pass over 55 M weights (the size of a WT103-base decoding
step) in fp32, bf16, PyTorch's dynamic quantization (what ``transformer_xl.model.int8`` uses) and, when installed,
torchao's
int8 configs. Each figure is the fastest of ``--repeats`` passes; run it at 1 and at 2 threads.

    python benchmarks/bench_int8_choice.py --threads 1
    pip install torchao==0.18.0 && python benchmarks/bench_int8_choice.py --threads 2   # torchao rows too
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
from torch import nn

from transformer_xl.model.int8 import quantize_linears


def _best(fn: Callable[[], None], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(410, 2100) for _ in range(64))  # 55.1 M weights, 220 MB in fp32
    x = torch.randn(1, 410)

    def run(mods: nn.ModuleList, inp: torch.Tensor) -> Callable[[], None]:
        def go() -> None:
            with torch.no_grad():
                for m in mods:
                    m(inp)
        return go

    rows = [("fp32", _best(run(layers, x), args.repeats), 0.0)]
    bf16 = copy.deepcopy(layers).bfloat16()
    rows.append(("bf16", _best(run(bf16, x.bfloat16()), args.repeats), 0.0))
    dyn = copy.deepcopy(layers)
    quantize_linears(dyn, [str(i) for i in range(len(dyn))])
    with torch.no_grad():
        err = (dyn[0](x) - layers[0](x)).abs().max().item()
    rows.append(("int8, torch.ao dynamic quantization (txl)", _best(run(dyn, x), args.repeats), err))
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        print("(torchao not installed: its rows are skipped)")
    else:
        for cfg in (Int8WeightOnlyConfig(), Int8DynamicActivationInt8WeightConfig()):
            q = copy.deepcopy(layers)
            quantize_(q, cfg)
            with torch.no_grad():
                err = (q[0](x) - layers[0](x)).abs().max().item()
            rows.append((f"int8, torchao {type(cfg).__name__}", _best(run(q, x), args.repeats), err))
    print(f"\n{torch.__version__}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}\n")
    print("| path | ms per pass | speed-up vs fp32 | max abs error of one layer's output |")
    print("|---|---:|---:|---:|")
    for name, secs, err in rows:
        print(f"| {name} | {secs * 1e3:.2f} | {rows[0][1] / secs:.2f}× | {err:.2e} |")


if __name__ == "__main__":
    main()
