"""Generation on ONNX Runtime against the PyTorch plain step and the captured step: decode tokens/s at batch 1.

For each model shape (random weights): the model is exported (``transformer_xl.interop.onnx_export``), then greedy
generation after a prompt of ``mem_len`` tokens runs on the three backends in alternating rounds: the plain step
(``generate(model, ...)``), the captured step (``captured=True``, compiled once before the rounds) and ONNX Runtime
(``generate(OnnxRuntimeLM(export), ...)``). Tokens/s counts the decode steps only (from the first new token to the
last); the ratio of each round is taken against the plain step of the same round, and the median over rounds is
reported. The tokens of every backend are compared. The CPU and the thread count go with the figures; on a shared
machine compare ratios of one run only.

Usage::

    python benchmarks/bench_onnx.py --threads 1 --out benchmarks/results/onnx_generate.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.inference.generate import stream
from transformer_xl.interop.onnx_export import export_onnx
from transformer_xl.interop.onnx_runtime import OnnxRuntimeLM
from transformer_xl.train.precision import device_description

#: The shapes measured: the demo's model (``--preset demo``: cpu-small on WikiText-2's word vocabulary) and a
#: mid-size one (8 layers, d_model 512).
SHAPES = {
    "demo (4L, d 128, 33k words)": dict(n_token=33278, n_layer=4, n_head=4, d_model=128, d_head=32, d_inner=512,
                                        tgt_len=64, mem_len=64, cutoffs=[2000, 10000], div_val=4,
                                        tie_projs=[False, True, True]),
    "mid (8L, d 512, 33k words)": dict(n_token=33278, n_layer=8, n_head=8, d_model=512, d_head=64, d_inner=2048,
                                       tgt_len=128, mem_len=128, cutoffs=[2000, 10000], div_val=4,
                                       tie_projs=[False, True, True]),
}


def _decode(lm, ids: torch.Tensor, new_tokens: int, **kw) -> tuple[float, list[int]]:
    """Decode tokens/s (after the first new token) and the greedy tokens."""
    tokens, start = [], 0.0
    for step in stream(lm, ids, max_new_tokens=new_tokens, **kw):
        tokens.append(int(step.tokens[0]))
        if step.index == 0:
            start = time.perf_counter()
    return (new_tokens - 1) / (time.perf_counter() - start), tokens


def _shape(name: str, arch: dict, root: Path, *, new_tokens: int, rounds: int) -> dict:
    torch.manual_seed(0)
    model = TransformerXLLM(TXLConfig(**arch, init_std=0.05)).eval()
    began = time.perf_counter()
    export_onnx(model, root / "export")
    export_s = time.perf_counter() - began
    lm = OnnxRuntimeLM(root / "export")
    ids = torch.randint(0, arch["n_token"], (1, arch["mem_len"]), generator=torch.Generator().manual_seed(1))
    backends = {"plain step": (model, {}), "captured step": (model, {"captured": True}), "onnxruntime": (lm, {})}
    _decode(model, ids, 3, captured=True)  # compiles the captured step once, outside the rounds
    rates: dict[str, list[float]] = {b: [] for b in backends}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):
        for backend, (target, kw) in backends.items():
            rate, tokens[backend] = _decode(target, ids, new_tokens, **kw)
            rates[backend].append(rate)
    ratios = {b: statistics.median(r / p for r, p in zip(rates[b], rates["plain step"])) for b in backends}
    return {"shape": name, "config": arch, "export_s": round(export_s, 1),
            "same_tokens": all(t == tokens["plain step"] for t in tokens.values()),
            "rows": [{"backend": b, "tokens_per_s": round(statistics.median(rates[b]), 1),
                      "vs_plain": round(ratios[b], 2)} for b in backends]}


def markdown(report: dict) -> str:
    """The table of a report, with its CPU, threads and command."""
    lines = [f"CPU: {report['cpu']}; torch and ONNX Runtime threads {report['threads']}; load average "
             f"{report['load']} (other work shared the machine: compare ratios within a shape). Batch 1, greedy, "
             f"{report['new_tokens']} new tokens after a prompt of mem_len tokens, median of {report['rounds']} "
             f"alternating rounds, random weights. Command: `{report['command']}`.", "",
             "| model | backend | tokens/s | vs plain step | same tokens |", "|---|---|---|---|---|"]
    for shape in report["shapes"]:
        for row in shape["rows"]:
            lines.append(f"| {shape['shape']} | {row['backend']} | {row['tokens_per_s']:.0f} | "
                         f"{row['vs_plain']:.2f}x | {'yes' if shape['same_tokens'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/onnx_generate.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report = {"cpu": device_description("cpu"), "threads": args.threads, "new_tokens": args.new_tokens,
              "rounds": args.rounds,
              "command": "python " + " ".join(["benchmarks/bench_onnx.py", *sys.argv[1:]]),
              "torch": torch.__version__, "shapes": []}
    import onnxruntime

    report["onnxruntime"] = onnxruntime.__version__
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, arch) in enumerate(SHAPES.items()):
            report["shapes"].append(_shape(name, arch, Path(tmp) / str(i), new_tokens=args.new_tokens,
                                           rounds=args.rounds))
            print(json.dumps(report["shapes"][-1]["rows"]), file=sys.stderr)
    report["load"] = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
