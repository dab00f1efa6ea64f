"""Generation speed: incremental decoding (memory as cache) vs naive recompute vs Hugging Face TransfoXL.

One tiny model (random weights, 4 layers, d_model 128, 10k-word vocabulary), greedy decoding of
``--new-tokens`` tokens after a ``--prompt-len`` prompt, memory covering the whole text so that all three
compute the same thing:

* ``txl incremental``: :func:`transformer_xl.inference.generate.generate`: each step is a ``[B, 1]`` segment over the
memories;
* ``naive recompute``: :func:`transformer_xl.inference.generate.reference_generate` (``mode="full"``): a forward over
the
  whole context at every step (what a Transformer without a cache does);
* ``HF TransfoXL``: transformers' deprecated ``TransfoXLLMHeadModel`` (same weights via
  :func:`transformer_xl.interop.hf.build_hf`), its forward with ``mems`` looped by hand from an empty memory
  (:func:`transformer_xl.experiments.bench.generate.hf_greedy`); ``txl bench generate`` times the paper's shapes.

Prints a Markdown table and writes JSON (``--out``). Usage::

    python benchmarks/bench_generate.py --new-tokens 1000 --threads 1 --out runs/bench_generate.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.experiments.bench.generate import hf_greedy
from transformer_xl.inference.generate import generate, reference_generate
from transformer_xl.interop.hf import build_hf


def _model(n_token: int, seed: int) -> TransformerXLLM:
    torch.manual_seed(seed)
    cfg = TXLConfig(n_token=n_token, n_layer=4, n_head=4, d_model=128, d_head=32, d_inner=512, tgt_len=64,
                    mem_len=64, cutoffs=[2000, 6000], div_val=1, tie_projs=[False, False, False],
                    init_std=0.05)
    return TransformerXLLM(cfg).eval()


def _hf_model(model: TransformerXLLM, mem_len: int):
    hf = build_hf(model).eval()  # the same weights, loaded strictly
    hf.reset_memory_length(mem_len)
    return hf


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _hf_run(hf, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, str]:
    """Hugging Face's forward with ``mems``, one token per step, from an empty memory (its ``generate`` is gone
    from the deprecated model, and ``mems=None`` would attend to ``mem_len`` zero vectors)."""
    toks, _ = hf_greedy(hf, prompt, n - 1, chunk=prompt.size(1))
    return torch.stack(toks, 1), "forward-with-mems loop"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=1000)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--n-token", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: steady timings on a shared machine; 0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = _model(args.n_token, seed=0).to(args.device)
    prompt = torch.randint(0, args.n_token, (1, args.prompt_len), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(args.device)
    n, mem_len = args.new_tokens, args.prompt_len + args.new_tokens
    generate(model, prompt, max_new_tokens=8, mem_len=mem_len)  # warm-up

    rows = []
    inc, t_inc = _timed(lambda: generate(model, prompt, max_new_tokens=n, mem_len=mem_len))
    rows.append({"method": "txl incremental (memory cache)", "seconds": t_inc, "same_tokens": True})
    (naive, _), t_naive = _timed(lambda: reference_generate(model, prompt, n, mode="full", mem_len=mem_len))
    rows.append({"method": "naive recompute (full context each step)", "seconds": t_naive,
                 "same_tokens": bool(torch.equal(naive, inc.new_tokens))})
    if not args.skip_hf:
        hf = _hf_model(model.cpu(), mem_len).to(args.device)
        model.to(args.device)
        (hf_toks, note), t_hf = _timed(lambda: _hf_run(hf, prompt, n))
        rows.append({"method": f"HF TransfoXL ({note})", "seconds": t_hf,
                     "same_tokens": bool(torch.equal(hf_toks, inc.new_tokens))})
    for r in rows:
        r["tokens_per_s"] = n / r["seconds"]
        r["speedup_vs_naive"] = t_naive / r["seconds"]
    result = {"device": args.device, "new_tokens": n, "prompt_len": args.prompt_len, "mem_len": mem_len,
              "n_token": args.n_token,
              "model": {k: v for k, v in model.config.to_dict().items() if k in (
                  "n_layer", "d_model", "n_head", "d_head", "d_inner", "cutoffs")},
              "params": model.num_parameters(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "rows": rows}
    print(f"\n{n} new tokens after a {args.prompt_len}-token prompt, greedy, batch 1, mem_len {mem_len}, "
          f"{result['params']:,} parameters, torch {torch.__version__}, {args.device}, "
          f"{result['threads']} threads\n")
    print("| method | seconds | tokens/s | speed-up vs naive | same tokens as txl |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['method']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} | {r['speedup_vs_naive']:.1f}x | "
              f"{'yes' if r['same_tokens'] else 'no'} |")
    print("\n" + json.dumps(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
