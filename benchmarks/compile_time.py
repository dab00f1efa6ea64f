"""What the first step of a captured decoder costs: inductor compiling its graph into an empty cache ("cold") and
taking it from that cache in a new process ("warm"), the figures behind
:data:`transformer_xl.inference.captured.COMPILE_S`.

    python benchmarks/compile_time.py --threads 1 --out benchmarks/results/compile_time_cpu_1t.json

Every measurement is a fresh Python process (``TORCHINDUCTOR_CACHE_DIR`` a new temporary directory for the cold
one, the same directory for the warm one right after it) that builds a
:class:`~transformer_xl.inference.captured.CapturedDecoder` for a case ``SHAPE:MEM_LEN:BATCH[:int8]`` (shapes as
``benchmarks/decode_kernels.py``) and records ``compile_s``, the seconds of its first step. Wall time: other work on
the machine slows compilation too (the load average is recorded before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from transformer_xl.experiments.bench.yardstick import machine

CASES = ["demo:128:1", "wt103-base:640:1"]

_CHILD = """
import json, sys, torch
sys.path.insert(0, {bench!r})
from decode_kernels import SHAPES
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.model import TransformerXLLM
shape, mem_len, batch, *rest = {case!r}.split(":")
torch.set_num_threads({threads})
cfg = SHAPES[shape]()
torch.manual_seed(0)
model = TransformerXLLM(cfg).eval()
int8 = rest == ["int8"]
dec = CapturedDecoder(model, batch=int(batch), mem_len=int(mem_len), int8=int8,
                      kv_dtype="bfloat16" if int8 else "float32")
mems = [torch.randn(int(batch), int(mem_len), cfg.d_model) for _ in range(cfg.n_layer + 1)]
dec.load(mems)
with torch.no_grad():
    dec.step(torch.zeros(int(batch), dtype=torch.long), mems)
print(json.dumps({{"compile_s": dec.compile_s}}))
"""


def first_step_seconds(case: str, cache: str, threads: int) -> float:
    """``compile_s`` of a decoder for ``case`` built in a new process whose inductor cache is ``cache``."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads)}
    code = _CHILD.format(bench=str(Path(__file__).resolve().parent), case=case, threads=threads)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["compile_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cases", nargs="+", default=CASES)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report = {"command": "python benchmarks/compile_time.py " + " ".join(
        [f"--threads {args.threads}", "--cases", *args.cases]), "machine": machine(), "torch": torch.__version__,
        "rows": []}
    for case in args.cases:
        with tempfile.TemporaryDirectory(prefix="txl-inductor-") as cache:
            cold = first_step_seconds(case, cache, args.threads)
            warm = first_step_seconds(case, cache, args.threads)
        report["rows"].append({"case": case, "cold_s": cold, "warm_s": warm})
        print(f"{case}: cold {cold:.1f} s, warm {warm:.1f} s", flush=True)
        report["load_average_after"] = machine()["load_average"]
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
