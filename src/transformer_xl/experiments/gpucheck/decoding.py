"""Part d of the GPU check: batch-1 greedy decoding with the captured step, against the device's read rate.

The model is part b's NVIDIA ``base`` (16 layers, d_model 512, the 267,735-word adaptive softmax; random weights,
eval mode) at a memory of 640 (then 1600 when the part has the time). A row:

* reads a Zipfian prompt of ``mem_len`` tokens (the memory is full from the first step) and decodes greedily with the
  plain step (:func:`transformer_xl.inference.generate.stream`, ``captured=False``), timed;
* builds a :class:`~transformer_xl.inference.captured.CapturedDecoder` (compiled: CUDA graphs on CUDA; with ``--tiny``
  and no ``--compile`` the same step run eagerly), warms it up (its first step compiles: ``compile_s``), then times
  ``new_tokens`` steps after the same prompt (best of the rounds), as ``txl bench generate`` does
  (:mod:`transformer_xl.experiments.bench.generate`; :func:`greedy`);
* counts the bytes a captured step reads (:func:`~transformer_xl.experiments.bench.yardstick.step_bytes`: packed
  weights, the ring, the position keys) and gives the tokens/s those bytes allow at the read rate measured in the
  same run (:func:`~transformer_xl.experiments.bench.yardstick.read_rate`), and the share of it reached (the goal:
  :data:`GOAL_SHARE`);
* checks the captured step against the plain one: the same greedy tokens for :data:`CHECK_STEPS` steps, and the
  next-token log-probabilities after the prompt within :data:`LOGPROB_TOL` (absolute, fp32, TF32 off).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from transformer_xl.errors import TXLError
from transformer_xl.experiments.bench.runner import zipf_tokens
from transformer_xl.experiments.bench.yardstick import read_rate, share, step_bytes
from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.throughput import free, tf32, train_config
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.inference.generate import GenerationStep, advance, stream
from transformer_xl.model import TransformerXLLM

#: Share of the read-rate limit a captured batch-1 step should reach on a GPU.
GOAL_SHARE = 0.70
#: Greedy steps whose tokens must equal the plain step's.
CHECK_STEPS = 8
#: Largest |difference| of the next-token log-probabilities of the captured and plain steps (nats, fp32).
LOGPROB_TOL = 1e-3
MEM_LENS = (640, 1600)
TINY_MEM_LENS = (32, 64)
#: The read-rate buffer with ``--tiny`` (seconds, not a measurement: the default is 8x the last-level cache).
TINY_READ_BYTES = 64 * 2**20


def greedy(opts: CheckOptions, net: TransformerXLLM, first: GenerationStep, n: int, mem_len: int,
           captured: CapturedDecoder | bool) -> tuple[list[torch.Tensor], float]:
    """Greedy tokens from the prompt's step ``first`` on, and the seconds of the last ``n`` decode steps: the step
    after the prompt (a plain forward of its last token) is not timed, nor is loading the memory into the
    ``captured`` decoder's ring (as ``txl bench generate`` times them)."""
    steps = stream(net, first.tokens[:, None], mems=first.mems, max_new_tokens=n + 1, mem_len=mem_len,
                   captured=captured)
    head = next(steps)
    if isinstance(captured, CapturedDecoder):
        captured.load(head.mems)
    opts.sync()
    start = time.perf_counter()
    tokens = [first.tokens, head.tokens, *(s.tokens for s in steps)]
    opts.sync()
    return tokens, time.perf_counter() - start


def decode_row(opts: CheckOptions, net: TransformerXLLM, mem_len: int, rate: float) -> dict[str, Any]:
    """One memory length (module docstring)."""
    cfg = net.config
    n_timed, rounds = (4, 1) if opts.tiny else (64, 3)
    gen = torch.Generator().manual_seed(opts.seed)
    prompt = zipf_tokens(cfg.n_token, (1, mem_len), gen).to(opts.device)
    first = next(stream(net, prompt, max_new_tokens=1, mem_len=mem_len, captured=False))  # the memory full
    plain_toks, plain_s = greedy(opts, net, first, CHECK_STEPS, mem_len, False)
    dec = CapturedDecoder(net, batch=1, mem_len=mem_len, compile=opts.cuda or opts.use_compile)
    start = time.perf_counter()
    greedy(opts, net, first, 4, mem_len, dec)  # compiles; on CUDA records the graph
    warm_s = time.perf_counter() - start
    best, cap_toks = float("inf"), []
    for _ in range(rounds):
        cap_toks, secs = greedy(opts, net, first, n_timed, mem_len, dec)
        best = min(best, secs)
    plain_lp, _ = advance(net, first.tokens[:, None], mems=first.mems, mem_len=mem_len)
    cap_lp, _ = dec.step(first.tokens, first.mems)
    lp_diff = (cap_lp.float() - plain_lp.float()).abs().max().item()
    n = min(len(plain_toks), len(cap_toks))
    same = int(sum(bool((a == b).all()) for a, b in zip(plain_toks[:n], cap_toks[:n])))
    nbytes = step_bytes(dec)
    tok_s = n_timed / best
    row: dict[str, Any] = {
        "mem_len": mem_len, "batch": 1, "compiled": dec.compiled, "cuda_graphs": dec.compiled and opts.cuda,
        "compile_s": dec.compile_s, "warmup_s": warm_s, "timed_steps": n_timed, "rounds": rounds,
        "tok_per_s": tok_s, "plain_tok_per_s": CHECK_STEPS / plain_s, "step_bytes": nbytes,
        "read_rate_bytes_per_s": rate, "limit_tok_per_s": rate / nbytes["total"],
        "same_tokens": f"{same}/{n}", "logprob_max_abs_diff": lp_diff, "goal_share": GOAL_SHARE}
    try:
        row["share"] = share(tok_s, row["limit_tok_per_s"], f"decoding mem_len {mem_len}")
    except TXLError as exc:  # above 100 %: the yardstick or the count is wrong
        row["share"], row["share_error"] = None, str(exc)
    row["meets_goal"] = row["share"] is not None and row["share"] >= GOAL_SHARE
    return row


def checks_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's comparisons of the captured step with the plain one, and its share's sanity."""
    same, n = (int(x) for x in row["same_tokens"].split("/"))
    out = [{"name": f"decoding mem {row['mem_len']}: captured greedy tokens equal the plain step's", "ok": same == n,
            "value": row["same_tokens"]},
           {"name": f"decoding mem {row['mem_len']}: captured log-probs within {LOGPROB_TOL} of the plain step's",
            "ok": row["logprob_max_abs_diff"] <= LOGPROB_TOL, "value": row["logprob_max_abs_diff"],
            "tolerance": LOGPROB_TOL}]
    if row.get("share_error"):
        out.append({"name": f"decoding mem {row['mem_len']}: share of the read rate at most 100 %", "ok": False,
                    "error": row["share_error"]})
    return out


def describe(row: dict[str, Any]) -> str:
    """One progress line of a row."""
    share_ = "?" if row["share"] is None else f"{row['share'] * 100:.1f} %"
    return (f"decode mem {row['mem_len']}: captured {row['tok_per_s']:,.0f} tok/s "
            f"(plain {row['plain_tok_per_s']:,.0f}), {row['step_bytes']['total'] / 1e6:.1f} MB/step, "
            f"limit {row['limit_tok_per_s']:,.0f} tok/s at "
            f"{row['read_rate_bytes_per_s'] / 1e9:.0f} GB/s: {share_} (goal {GOAL_SHARE * 100:.0f} %); same tokens "
            f"{row['same_tokens']}, log-prob diff {row['logprob_max_abs_diff']:.1e}; compile "
            f"{row['compile_s'] or 0:.1f} s")


def run(opts: CheckOptions) -> dict[str, Any]:
    """Part d (module docstring): the read rate, then each memory length while the part has the time."""
    rate = read_rate(opts.device, nbytes=TINY_READ_BYTES if opts.tiny else None)
    opts.log(f"read rate {rate['bytes_per_s'] / 1e9:.1f} GB/s ({rate['method']})")
    cfg = train_config("base", opts.tiny)[0].replace(dropout=0.0, dropatt=0.0)
    torch.manual_seed(opts.seed)
    net = TransformerXLLM(cfg).to(opts.device).eval()
    rows: list[dict[str, Any]] = []
    skipped = []
    with tf32(False):  # the comparison is fp32's (TF32 is off by default for products; kept off here)
        for mem_len in TINY_MEM_LENS if opts.tiny else MEM_LENS:
            last = rows[-1]["row_s"] if rows else 0.0
            if rows and opts.time_left() < 1.5 * last + (1 if opts.tiny else 10):
                skipped.append(mem_len)
                opts.log(f"decode mem {mem_len}: skipped ({opts.time_left():.0f} s left, the last row took {last:.0f})")
                continue
            start = time.perf_counter()
            row = decode_row(opts, net, mem_len, rate["bytes_per_s"])
            row["row_s"] = time.perf_counter() - start
            rows.append(row)
            opts.log(describe(row))
            free(opts)
    return {"model": "base", "n_token": cfg.n_token, "read_rate": rate, "rows": rows, "skipped_mem_lens": skipped,
            "checks": [c for r in rows for c in checks_of(r)]}
