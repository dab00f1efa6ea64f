"""``txl bench generate``: generation tokens/s of txl against Hugging Face's loop and the memory-bandwidth limit.

At batch 1 a decoding step multiplies one vector by every weight matrix once, so its floor is the time it takes
to read those bytes (and, per row, the cached keys/values of the memory). For every case (a model shape, a
memory length, a batch size) one run measures, alternating them over ``repeats`` rounds:

* **txl**: :func:`transformer_xl.inference.generate.stream`, greedy, after a prompt of ``mem_len`` tokens (the memory
  is full from the first step), decode steps only;
* **HF**: Hugging Face TransfoXL (same weights, :func:`transformer_xl.interop.hf.build_hf`) looping its forward with
  ``mems``, one token per step (its ``generate`` does not run on the deprecated model), decode steps only;
  the greedy tokens are compared with txl's;
* **txl int8** (``int8=True``): the same model after :meth:`~transformer_xl.model.TransformerXLLM.quantize`;
* **the bandwidth limit**: a matrix-vector pass (``F.linear`` of ``batch`` rows) over every weight matrix a
  step reads, with the model's own tensors (``weights``), and the same plus one ``bmm`` read of every layer's
  cached keys and values of that memory length and batch (``weights+cache``); its inverse is the tokens/s a
  step could reach if it did nothing but read those bytes once.

Reported: tokens/s (all rows), txl ÷ HF (median of the per-round ratios), txl's fraction of each limit, and how
many of the generated tokens (rows × steps) HF and int8 share with txl. Random weights give nearly flat
next-token distributions (top-2 gaps of 0.01 nats), so int8 rounding flips some greedy choices; its accuracy
cost is measured on a trained model instead (``docs/performance.md``).
Shapes: ``wt103-base`` is the paper's WT103 base model (16 layers, d_model 410, 10 heads of 41, d_inner 2100)
with a 33,278-word adaptive softmax (cutoffs 2000/10000, the size of WikiText-2's vocabulary), ``enwik8-base``
the enwik8 base model (12 layers, d_model 512, 8 heads of 64, d_inner 2048, 204 characters); random weights.
"""

from __future__ import annotations

import itertools
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.bench.measure import sync
from transformer_xl.inference.generate import stream
from transformer_xl.inference.loading import check_device
from transformer_xl.interop.hf import build_hf, hf_available, hf_compat
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.presets import enwik8_base, wt103_base

#: Shape name -> config (random weights).
SHAPES: dict[str, Callable[[], TXLConfig]] = {
    "wt103-base": lambda: wt103_base().replace(n_token=33278, cutoffs=(2000, 10000), tie_projs=(False, True, True)),
    "enwik8-base": enwik8_base,
}


def shape_config(shape: str) -> TXLConfig:
    """The config of a shape of :data:`SHAPES`, or a one-line :class:`ConfigError`."""
    if shape not in SHAPES:
        raise ConfigError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return SHAPES[shape]()


@dataclass
class GenerateBenchOptions:
    """What :func:`run_generate_bench` measures (defaults: the issue's grid)."""

    shapes: list[str] = field(default_factory=lambda: ["wt103-base", "enwik8-base"])
    mem_lens: list[int] = field(default_factory=lambda: [640, 1600])
    batches: list[int] = field(default_factory=lambda: [1, 8])
    new_tokens: int = 24  # decode steps timed per round for txl (and txl int8)
    hf_tokens: int = 8  # decode steps timed per round for Hugging Face (its steps are slow at long memories)
    repeats: int = 3  # alternating rounds
    hf: bool = True
    int8: bool = True  # CPU only
    device: str = "cpu"
    seed: int = 0


# ---------------------------------------------------------------------------------------------- decoders
def _txl_decode(model: TransformerXLLM, prompt: torch.Tensor, n: int, mem_len: int) -> tuple[list[torch.Tensor], float]:
    """Greedy tokens after ``prompt`` and the seconds of the decode steps (the first token, which comes from the
    prompt's forward, is not timed)."""
    steps = stream(model, prompt, max_new_tokens=n + 1, mem_len=mem_len)
    toks = [next(steps).tokens]
    sync(prompt.device.type)
    start = time.perf_counter()
    toks += [s.tokens for s in steps]
    sync(prompt.device.type)
    return toks, time.perf_counter() - start


def hf_greedy(hf: Any, prompt: torch.Tensor, n: int, chunk: int) -> tuple[list[torch.Tensor], float]:
    """The same with Hugging Face's forward with ``mems`` (the prompt in segments of ``chunk`` tokens)."""
    with hf_compat(), torch.no_grad():
        # An empty memory, as txl starts (mems=None would give mem_len zero vectors to attend to: README, interop)
        mems = [prompt.new_zeros(0, prompt.size(0), hf.config.d_model, dtype=torch.float32)
                for _ in range(hf.config.n_layer)]
        for i in range(0, prompt.size(1), chunk):
            out = hf(input_ids=prompt[:, i:i + chunk], mems=mems)
            mems = out.mems
        tok = out.prediction_scores[:, -1].argmax(-1)
        toks = [tok]
        sync(prompt.device.type)
        start = time.perf_counter()
        for _ in range(n):
            out = hf(input_ids=tok[:, None], mems=mems)
            mems = out.mems
            tok = out.prediction_scores[:, -1].argmax(-1)
            toks.append(tok)
        sync(prompt.device.type)
        return toks, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------- the limit
def step_weights(model: TransformerXLLM) -> list[torch.Tensor]:
    """The weight matrices one decoding step of ``model`` multiplies by: every matrix of the blocks (``W_kR``
    too: a one-query step takes the query to d_model through it) and of the output softmax (the tied input
    embedding is that same matrix; an untied one is only indexed)."""
    mats = [p for p in model.layers.parameters() if p.dim() == 2]
    head = model.crit if hasattr(model, "crit") else model.out_layer
    return mats + [p for p in head.parameters() if p.dim() == 2]


def stream_limit(weights: list[torch.Tensor], *, batch: int, n_layer: int, n_head: int, d_head: int,
                 mem_len: int, repeats: int = 5) -> dict[str, float]:
    """Seconds of one pass that reads ``weights`` once (``F.linear`` of ``batch`` rows), and of the same pass
    plus the keys and values of ``mem_len`` positions per layer and row (``bmm``, one query per head): the
    fastest of ``repeats`` passes each."""
    device = weights[0].device
    xs = {w.size(1): torch.randn(batch, w.size(1), device=device) for w in weights}
    kv = [torch.randn(2, batch * n_head, mem_len, d_head, device=device) for _ in range(n_layer)]
    q = torch.randn(batch * n_head, 1, d_head, device=device)

    def weights_pass() -> None:
        for w in weights:
            F.linear(xs[w.size(1)], w)

    def cache_pass() -> None:
        for k_v in kv:
            torch.bmm(torch.bmm(q, k_v[0].transpose(1, 2)), k_v[1])

    def best(fn: Callable[[], None]) -> float:
        fn()
        times = []
        for _ in range(repeats):
            sync(device.type)
            t = time.perf_counter()
            fn()
            sync(device.type)
            times.append(time.perf_counter() - t)
        return min(times)

    w, c = best(weights_pass), best(cache_pass)
    return {"weights_s": w, "cache_s": c, "weights_cache_s": w + c,
            "weights_bytes": sum(t.numel() * t.element_size() for t in weights),
            "cache_bytes": sum(t.numel() * t.element_size() for t in kv)}


# ---------------------------------------------------------------------------------------------- a case
def run_case(shape: str, mem_len: int, batch: int, opts: GenerateBenchOptions,
             log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """One case: tokens/s of every decoder, the ratios and the limits (see the module docstring)."""
    torch.manual_seed(opts.seed)
    cfg = shape_config(shape)
    model = TransformerXLLM(cfg).eval()
    gen = torch.Generator().manual_seed(opts.seed + 1)
    prompt = torch.randint(0, cfg.n_token, (batch, mem_len), generator=gen).to(opts.device)
    decoders: dict[str, Callable[[int], tuple[list[torch.Tensor], float]]] = {
        "txl": lambda n: _txl_decode(model, prompt, n, mem_len)}
    counts = {"txl": opts.new_tokens}
    if opts.hf and hf_available():
        hf = build_hf(model).eval().to(opts.device)
        hf.reset_memory_length(mem_len)
        decoders["hf"] = lambda n: hf_greedy(hf, prompt, n, cfg.tgt_len)
        counts["hf"] = opts.hf_tokens
    model.to(opts.device)
    if opts.int8 and opts.device == "cpu":
        q_model = TransformerXLLM(cfg)
        q_model.load_state_dict(model.state_dict())
        q_model.quantize("int8")
        decoders["txl-int8"] = lambda n: _txl_decode(q_model, prompt, n, mem_len)
        counts["txl-int8"] = opts.new_tokens
    rates: dict[str, list[float]] = {name: [] for name in decoders}
    tokens: dict[str, list[torch.Tensor]] = {}
    names = list(decoders)
    for rnd in range(opts.repeats):
        for name in names if rnd % 2 == 0 else names[::-1]:
            toks, secs = decoders[name](counts[name])
            rates[name].append(batch * counts[name] / secs)
            tokens[name] = toks
            log(f"  {shape} mem {mem_len} batch {batch} round {rnd + 1}: {name} {rates[name][-1]:.1f} tok/s")
    limit = stream_limit(step_weights(model), batch=batch, n_layer=cfg.n_layer, n_head=cfg.n_head,
                         d_head=cfg.d_head, mem_len=mem_len)
    row: dict[str, Any] = {"shape": shape, "mem_len": mem_len, "batch": batch, "params": model.num_parameters(),
                           "limit": limit, "tok_per_s": {k: statistics.median(v) for k, v in rates.items()},
                           "rounds": rates}
    txl = row["tok_per_s"]["txl"]
    row["limit_tok_per_s"] = {"weights": batch / limit["weights_s"], "weights+cache": batch / limit["weights_cache_s"]}
    row["fraction"] = {k: txl / v for k, v in row["limit_tok_per_s"].items()}
    ref = torch.stack(tokens["txl"], 1)
    if "hf" in rates:
        row["txl_over_hf"] = statistics.median(a / b for a, b in zip(rates["txl"], rates["hf"]))
        hf_toks = torch.stack(tokens["hf"], 1)
        n = hf_toks.size(1)
        row["hf_same_tokens"] = f"{int((hf_toks == ref[:, :n]).sum())}/{hf_toks.numel()}"
    if "txl-int8" in rates:
        row["int8_over_fp32"] = statistics.median(a / b for a, b in zip(rates["txl-int8"], rates["txl"]))
        q_toks = torch.stack(tokens["txl-int8"], 1)
        row["int8_same_tokens"] = f"{int((q_toks == ref).sum())}/{ref.numel()}"
        row["fraction_int8"] = {k: row["tok_per_s"]["txl-int8"] / v for k, v in row["limit_tok_per_s"].items()}
    return row


def run_generate_bench(opts: GenerateBenchOptions, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every case of ``opts`` (shapes x memory lengths x batch sizes)."""
    check_device(opts.device)
    for shape in opts.shapes:  # every name checked before any case runs
        shape_config(shape)
    rows = [run_case(s, m, b, opts, log) for s, m, b in itertools.product(opts.shapes, opts.mem_lens, opts.batches)]
    machine = torch.cuda.get_device_name() if opts.device.startswith("cuda") else platform.processor() or \
        platform.machine()
    return {"options": asdict(opts), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": machine, "hf": opts.hf and hf_available(), "rows": rows}


def to_markdown(report: dict[str, Any], command: str) -> str:
    """The report as a Markdown table, with the command that measured it."""
    head = ("| shape | mem_len | batch | txl tok/s | HF tok/s | txl ÷ HF | same tokens as HF | limit tok/s (weights) "
            "| limit tok/s (weights+cache) | txl share of limit (weights / +cache) | int8 tok/s | int8 ÷ fp32 "
            "| int8 same tokens |")
    lines = [f"`{command}` (torch {report['torch']}, {report['threads']} threads, {report['machine']}; medians of "
             f"{report['options']['repeats']} alternating rounds)", "", head, "|" + "---|" * 13]
    for r in report["rows"]:
        tps = r["tok_per_s"]
        lim = r["limit_tok_per_s"]
        frac = r["fraction"]

        def num(v: float | None, fmt: str = ".1f") -> str:
            return "–" if v is None else format(v, fmt)

        lines.append(
            f"| {r['shape']} | {r['mem_len']} | {r['batch']} | {num(tps['txl'])} | {num(tps.get('hf'))} | "
            f"{num(r.get('txl_over_hf'), '.2f')}{'×' if 'txl_over_hf' in r else ''} | {r.get('hf_same_tokens', '–')} | "
            f"{num(lim['weights'])} | {num(lim['weights+cache'])} | "
            f"{frac['weights']:.0%} / {frac['weights+cache']:.0%} | {num(tps.get('txl-int8'))} | "
            f"{num(r.get('int8_over_fp32'), '.2f')}{'×' if 'int8_over_fp32' in r else ''} | "
            f"{r.get('int8_same_tokens', '–')} |")
    return "\n".join(lines)
