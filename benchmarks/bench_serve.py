"""``txl serve`` under concurrent clients: tokens/s and time to first token at 1, 8 and 32 clients, against one
``model.generate`` loop that serves the same requests one after another.

One model with random weights (4 layers, d_model 128, a 10,000-word vocabulary of made-up words, ``mem_len`` 64),
served in this process on 127.0.0.1 (``--max-batch`` = the most clients). Every client asks, at the same moment,
for ``--new-tokens`` greedy tokens after its own ``--prompt-len``-word prompt, streamed, through the official
``openai`` client (one thread per client). The baseline reads the same prompts with ``model.stream`` one request
after another, all of them waiting from the start: its time to first token of request *i* includes the
requests served before it. Tokens/s: every generated token over the wall time of the whole round.

Writes JSON (``--out``) and prints a Markdown table; the CPU, torch threads and the machine's other load go with
the figures (compare rows of one run only). Usage::

    python benchmarks/bench_serve.py --clients 1 8 32 --new-tokens 32 --threads 1 \\
        --out benchmarks/results/serve_concurrency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.serve.conftest starts the server in-process

from tests.serve.conftest import start_server

from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.data import Vocab


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        flags = [f for f in info.get("Flags", "").split() if f.startswith(("avx", "amx", "fma"))]
        return f"{info['Model name'].strip()} ({' '.join(flags)})"
    except (OSError, subprocess.CalledProcessError, KeyError):
        return platform.processor() or platform.machine()


def _model_dir(root: Path, n_token: int) -> Path:
    torch.manual_seed(0)
    cfg = TXLConfig(n_token=n_token, n_layer=4, n_head=4, d_model=128, d_head=32, d_inner=512, tgt_len=64,
                    mem_len=64, cutoffs=[2000, 6000], div_val=1, tie_projs=[False, False, False], init_std=0.05)
    model = TransformerXLLM(cfg)
    model.save_pretrained(root / "bench")
    Vocab(["<eos>", "<unk>", *(f"w{i}" for i in range(n_token - 2))], special=["<eos>", "<unk>"], eos="<eos>",
          unk="<unk>").save(root / "bench" / "vocab.json")
    return root / "bench"


def _prompts(n: int, length: int, n_token: int) -> list[str]:
    g = torch.Generator().manual_seed(1)
    return [" ".join(f"w{int(i)}" for i in torch.randint(0, n_token - 2, (length,), generator=g)) for _ in range(n)]


def _served_round(served, prompts: list[str], new_tokens: int) -> dict:
    first: list[float] = [0.0] * len(prompts)
    counts = [0] * len(prompts)
    barrier = threading.Barrier(len(prompts) + 1)

    def client(i: int) -> None:
        own = served.client()
        barrier.wait()
        stream = own.completions.create(model="tiny", prompt=prompts[i], max_tokens=new_tokens, temperature=0,
                                        stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text and not first[i]:
                first[i] = time.perf_counter()
            if chunk.usage is not None:
                counts[i] = chunk.usage.completion_tokens

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"tokens": sum(counts), "wall_s": wall, "tokens_per_s": sum(counts) / wall,
            "ttft_s": [f - t0 for f in first]}


def _loop_round(model, codec, prompts: list[str], new_tokens: int) -> dict:
    first = []
    tokens = 0
    t0 = time.perf_counter()
    for p in prompts:
        for step in model.stream(codec.encode(p), max_new_tokens=new_tokens):
            if step.index == 0:
                first.append(time.perf_counter() - t0)
            tokens += 1
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "ttft_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-token", type=int, default=10000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(_model_dir(Path(tmp), args.n_token), max_batch=max(args.clients))
        served = next(server)
        try:
            _served_round(served, _prompts(2, args.prompt_len, args.n_token), 4)  # warm-up
            for n in args.clients:
                prompts = _prompts(n, args.prompt_len, args.n_token)
                for name, res in (("txl serve", _served_round(served, prompts, args.new_tokens)),
                                  ("model.generate loop", _loop_round(served.model, served.codec, prompts,
                                                                      args.new_tokens))):
                    ttft = res.pop("ttft_s")
                    rows.append({"clients": n, "server": name, **res, "ttft_median_s": statistics.median(ttft),
                                 "ttft_max_s": max(ttft)})
        finally:
            server.close()
    doc = {"cpu": _cpu(), "torch_threads": args.threads, "torch": torch.__version__,
           "cores_available": len(os.sched_getaffinity(0)), "load_average": os.getloadavg(),
           "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "model": "4 layers, d_model 128, "
           f"{args.n_token} words, mem_len 64, random weights", "rows": rows}
    print(table(doc))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        args.out.with_suffix(".md").write_text(table(doc), encoding="utf-8")


def table(doc: dict) -> str:
    """The results as Markdown: the machine, then one row per clients x server."""
    load = ", ".join(f"{x:.1f}" for x in doc["load_average"])
    lines = [f"CPU: {doc['cpu']}; {doc['cores_available']} cores available, torch threads {doc['torch_threads']}, "
             f"load average {load} (other work shared the machine). Model: {doc['model']}; prompts of "
             f"{doc['prompt_len']} words, {doc['new_tokens']} greedy tokens per client.", "",
             "| clients | server | tokens/s | median TTFT (s) | max TTFT (s) |", "|---|---|---|---|---|"]
    lines += [f"| {r['clients']} | {r['server']} | {r['tokens_per_s']:.0f} | {r['ttft_median_s']:.3f} | "
              f"{r['ttft_max_s']:.3f} |" for r in doc["rows"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
