"""Peak memory of an echoed prompt with log-probabilities (``echo: true, logprobs: 1``) in ``txl serve``'s engine: the
old path (every position's log-probabilities as one ``[T, V]`` table, the row's next-token vector a view of it)
against the new one (:func:`transformer_xl.inference.prompt_scores.score_prompt`: one segment's table at a time).

The model has WikiText-103's vocabulary size (267,735 words) with its adaptive softmax (cutoffs 20,000, 40,000,
200,000; ``div_val`` 4) and a small body (2 layers, ``d_model`` 64, ``tgt_len`` = ``mem_len`` = 150): the memory of
the prompt's log-probabilities is the whole story, the body's is small. Each measurement runs in a fresh process
(``ru_maxrss`` is a process's peak): the resident size before the prompt (model, vocabulary and a warm-up read), the
peak while it is read, and the resident size after (the old path: while the row still holds its view; the new: when
the request is done). The new path is a real :class:`~transformer_xl.serve.engine.Engine` job; the old one is the
call the old engine made (``advance(..., every_position=True)``), which at 8,192 tokens needs about 17.5 GB
(the segments' tables and their concatenation), so it is measured at shorter prompts and grows linearly in ``T``.

Usage (one torch thread; about two minutes)::

    python benchmarks/serve_prompt_memory.py --out benchmarks/results/serve_prompt_memory.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import queue
import resource
import subprocess
import sys
import time
from pathlib import Path

N_TOKEN = 267_735
CUTOFFS = [20_000, 40_000, 200_000]
TGT_LEN = 150


def _rss_mb() -> float:
    """The resident size now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10  # KiB on Linux


def _child(path: str, tokens: int) -> dict:
    import torch

    from transformer_xl import TransformerXLLM, TXLConfig
    from transformer_xl.data import Vocab
    from transformer_xl.data.codec import TextCodec
    from transformer_xl.inference.generate import advance
    from transformer_xl.serve.engine import Done, Engine, Failed, Job, PromptScores, Sampling

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = TXLConfig(n_token=N_TOKEN, n_layer=2, n_head=2, d_model=64, d_head=32, d_inner=128, tgt_len=TGT_LEN,
                    mem_len=TGT_LEN, cutoffs=CUTOFFS, div_val=4, tie_projs=[False, True, True, True])
    model = TransformerXLLM(cfg).eval()
    codec = TextCodec(Vocab([f"w{i}" for i in range(N_TOKEN)]), "word")
    ids = torch.randint(0, N_TOKEN, (tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    advance(model, ids[:TGT_LEN])  # warm-up: the first forward's allocations are not the prompt's
    gc.collect()
    before = _rss_mb()
    start = time.perf_counter()
    if path == "old":
        table, _ = advance(model, [ids], every_position=True)  # [1, T, V], as the old engine read it
        scores = table[0, :-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
        row = table[0, -1]  # the old row's next-token vector: a view that keeps the table
        del table
        gc.collect()
        seconds, after = time.perf_counter() - start, _rss_mb()
        assert row.untyped_storage().nbytes() == tokens * N_TOKEN * 4 and len(scores) == tokens - 1
    else:
        events: queue.Queue = queue.Queue()
        engine = Engine(model, codec, max_batch=1).start()
        engine.submit(Job(prompts=[ids], emit=events.put, max_tokens=1, sampling=Sampling(temperature=0),
                          score_prompt=True, top_logprobs=1))
        seen = []
        while not isinstance(seen[-1] if seen else None, (Done, Failed)):
            seen.append(events.get(timeout=600))
        engine.stop()
        seconds = time.perf_counter() - start
        scored = next(e for e in seen if isinstance(e, PromptScores))
        assert isinstance(seen[-1], Done) and len(scored.log_probs) == len(scored.top) == tokens
        del seen, scored
        gc.collect()
        after = _rss_mb()
    return {"path": path, "prompt_tokens": tokens, "rss_before_mb": round(before, 1),
            "peak_rss_mb": round(_peak_mb(), 1), "rss_after_mb": round(after, 1),
            "peak_over_before_mb": round(_peak_mb() - before, 1), "seconds": round(seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-tokens", type=int, nargs="*", default=[1024, 2048])
    ap.add_argument("--new-tokens", type=int, nargs="*", default=[1024, 2048, 8192])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_prompt_memory.json"))
    ap.add_argument("--child", nargs=2, metavar=("PATH", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return
    runs = []
    for path, sizes in (("old", args.old_tokens), ("new", args.new_tokens)):
        for tokens in sizes:
            out = subprocess.run([sys.executable, __file__, "--child", path, str(tokens)], capture_output=True,
                                 text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]))
    table_mb = TGT_LEN * N_TOKEN * 4 / 2 ** 20
    doc = {"what": "peak resident memory of one echoed prompt with logprobs=1 (txl serve engine), old vs new path",
           "model": {"n_token": N_TOKEN, "cutoffs": CUTOFFS, "div_val": 4, "n_layer": 2, "d_model": 64,
                     "tgt_len": TGT_LEN, "mem_len": TGT_LEN},
           "bound_new": f"model + about 2 x tgt_len x V x 4 bytes (one segment's table, {table_mb:.0f} MB, and the "
                        "adaptive softmax's parts while it is assembled) + T x (1 + logprobs) numbers",
           "old_at_8192_tokens": "about 2 x 8192 x 267735 x 4 bytes = 17.5 GB (segment tables and their "
                                 "concatenation), 8.8 GB held while the row lives: not run here",
           "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
           "command": "python benchmarks/serve_prompt_memory.py --out " + str(args.out), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
