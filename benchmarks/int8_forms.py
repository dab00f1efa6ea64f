"""The two forms of the captured step's int8 product, one matrix at a time, at the shapes of WikiText-103's base model:
int8 lanes (``packing.block_rows``: the compiler widens int8 lanes as it reads them) and 32-bit words
(``packing.block_words``: 4 weights of a row per word, taken out by shifts). Which one a step uses is
``packing.int8_words()``, by the width of the compiler's vectors; this measures both on the CPU it runs on.

    python benchmarks/int8_forms.py --threads 2 --out benchmarks/results/int8_forms_amx_2t.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/int8_forms.py --threads 2 --out benchmarks/results/int8_forms_avx2_2t.json

Each figure is the best of ``--passes`` calls of one compiled product (``[1, in]`` by the matrix, its row scales
applied), in GB/s of the matrix's bytes, beside the machine's read rate measured in the same run (the yardstick's
``Tensor.sum`` pass over a buffer far larger than the last-level cache). A matrix of under a megabyte is bound by the
cost of a call, not by reading it; the largest ones (the softmax, 13.7 MB) show the loop's speed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from transformer_xl.experiments.bench.yardstick import machine, read_rate
from transformer_xl.inference.decode import blocked_linear
from transformer_xl.inference.packing import pack_linear
from transformer_xl.model.fastpath import allow_graphs
from transformer_xl.train.precision import isa_limits

#: ``(out, in)`` of WT103-base's matrices: the attention's [W_q; W_k; W_v] and output, the feed-forward's two, the
#: softmax of a 33,278-word vocabulary.
SHAPES = ((1230, 410), (410, 410), (2100, 410), (410, 2100), (33278, 410))


def best_seconds(fn, passes: int) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--passes", type=int, default=50)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    allow_graphs()
    torch.manual_seed(0)
    product = torch.compile(blocked_linear, fullgraph=True, dynamic=False)
    rows = []
    with torch.no_grad():
        rate = read_rate()["bytes_per_s"]
        for out, n_in in SHAPES:
            w, x = torch.randn(out, n_in), torch.randn(1, n_in)
            row = {"out": out, "in": n_in}
            ref = None
            for form in ("lanes", "words"):
                lin = pack_linear(w, None, int8=True, words=form == "words")
                y = product(x, lin)
                ref = y if ref is None else ref
                torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())  # the same product
                secs = best_seconds(lambda lin=lin, x=x: product(x, lin), args.passes)
                row[form] = {"seconds": secs, "bytes": lin.weight.nbytes, "gb_per_s": lin.weight.nbytes / secs / 1e9}
            rows.append(row)
            print(f"{out} x {n_in} ({row['lanes']['bytes'] / 1e6:.2f} MB): lanes {row['lanes']['gb_per_s']:.1f} GB/s, "
                  f"words {row['words']['gb_per_s']:.1f} GB/s", flush=True)
        rate = max(rate, read_rate()["bytes_per_s"])
    command = f"python benchmarks/int8_forms.py --threads {args.threads} --passes {args.passes}"
    report = {"command": isa_limits() + command,
              "machine": machine(), "torch": torch.__version__,
              "read_rate_gb_per_s": rate / 1e9, "rows": rows}
    box = report["machine"]
    print(f"{box['cpu_class']}; read rate {rate / 1e9:.1f} GB/s; load {box['load_average']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
