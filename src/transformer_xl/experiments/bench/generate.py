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
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.bench.measure import matmul_peak, model_flops, sync
from transformer_xl.inference.captured import KV_DTYPES, CapturedDecoder
from transformer_xl.inference.decode import supported
from transformer_xl.inference.generate import GenerationStep, stream
from transformer_xl.inference.loading import check_device
from transformer_xl.interop.hf import build_hf, hf_available, hf_compat
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.presets import enwik8_base, wt103_base
from transformer_xl.train.precision import cpu_flags, cpu_model

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
    captured: bool = True  # the captured step (fp32, and int8 with int8)
    kv_dtype: str = "bfloat16"  # the key/value ring of the captured int8 step ("float32" or "bfloat16")
    prefill: bool = True  # time the prompt's forward too
    device: str = "cpu"
    seed: int = 0


# ---------------------------------------------------------------------------------------------- decoders
def _txl_decode(model: TransformerXLLM, prompt: torch.Tensor, n: int, mem_len: int,
                captured: CapturedDecoder | bool = False,
                prefilled: dict[int, GenerationStep] | None = None) -> tuple[list[torch.Tensor], float]:
    """Greedy tokens after ``prompt`` and the seconds of ``n`` decode steps. Not timed: the prompt's forward (with
    ``prefilled``, computed once per model and reused by every round: memories are never written in place), the
    first token's plain step after it, and loading the memory into a captured decoder's ring (once per text)."""
    first = None if prefilled is None else prefilled.get(id(model))
    if first is None:
        first = next(stream(model, prompt, max_new_tokens=1, mem_len=mem_len))
        if prefilled is not None:
            prefilled[id(model)] = first
    steps = stream(model, first.tokens[:, None], mems=first.mems, max_new_tokens=n + 1, mem_len=mem_len,
                   captured=captured)
    second = next(steps)
    toks = [first.tokens, second.tokens]
    if not isinstance(captured, bool):
        captured.load(second.mems)
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
    prefilled: dict[int, GenerationStep] = {}  # the prompt's forward, once per model
    decoders: dict[str, Callable[[int], tuple[list[torch.Tensor], float]]] = {
        "txl": lambda n: _txl_decode(model, prompt, n, mem_len, prefilled=prefilled)}
    counts = {"txl": opts.new_tokens}
    if opts.hf and hf_available():
        hf = build_hf(model).eval().to(opts.device)
        hf.reset_memory_length(mem_len)
        decoders["hf"] = lambda n: hf_greedy(hf, prompt, n, cfg.tgt_len)
        counts["hf"] = opts.hf_tokens
    model.to(opts.device)
    compile_s: dict[str, float] = {}
    if opts.captured and supported(model) is None:
        for name, kw in (("captured", {}), ("captured-int8", {"int8": True, "kv_dtype": opts.kv_dtype})):
            if kw and not (opts.int8 and opts.device == "cpu"):
                continue
            dec = CapturedDecoder(model, batch=batch, mem_len=mem_len, **kw)
            _txl_decode(model, prompt[:, :cfg.tgt_len], 1, mem_len, dec)  # compiles (once per model shape)
            compile_s[name] = dec.compile_s or 0.0
            decoders[name] = lambda n, dec=dec: _txl_decode(model, prompt, n, mem_len, dec, prefilled)
            counts[name] = opts.new_tokens
    if opts.int8 and opts.device == "cpu":
        q_model = TransformerXLLM(cfg)
        q_model.load_state_dict(model.state_dict())
        q_model.quantize("int8")
        decoders["txl-int8"] = lambda n: _txl_decode(q_model, prompt, n, mem_len, prefilled=prefilled)
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
                           "rounds": rates, "compile_s": compile_s, "kv_dtype": opts.kv_dtype}
    if opts.prefill:
        row["prefill"] = measure_prefill(model, prompt, mem_len, repeats=opts.repeats)
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
    for name in ("captured", "captured-int8"):
        if name in rates:
            row[f"fraction_{name}"] = {k: row["tok_per_s"][name] / v for k, v in row["limit_tok_per_s"].items()}
            row[f"{name}_same_tokens"] = f"{int((torch.stack(tokens[name], 1) == ref).sum())}/{ref.numel()}"
    if "captured-int8" in rates and "captured" in rates:
        row["captured_int8_over_fp32"] = statistics.median(
            a / b for a, b in zip(rates["captured-int8"], rates["captured"]))
    return row


def prefill_flops(cfg: TXLConfig, *, batch: int, prompt_len: int) -> float:
    """Matmul FLOPs of reading a prompt in segments of ``tgt_len`` over a growing memory (capped at the prompt):
    :func:`~transformer_xl.experiments.bench.measure.model_flops` with every position's keys/values projected
    once (``streaming``), less the output softmax it counts at every position (a prompt needs it at the last)."""
    total, d_0 = 0.0, cfg.d_embed
    v_0 = (cfg.cutoffs[0] if cfg.cutoffs else cfg.n_token) + len(cfg.cutoffs)
    proj = 2 * cfg.d_model * d_0 if (cfg.div_val > 1 or cfg.d_embed != cfg.d_model) else 0
    for start in range(0, prompt_len, cfg.tgt_len):
        qlen = min(cfg.tgt_len, prompt_len - start)
        total += model_flops(cfg, batch=batch, qlen=qlen, mlen=start, targets=None, streaming=True)
        total -= batch * qlen * (proj + 2 * d_0 * v_0)
    return total


def measure_prefill(model: TransformerXLLM, prompt: torch.Tensor, mem_len: int, *, repeats: int) -> dict[str, float]:
    """Tokens/s of the prompt's forward as generation runs it (segments of ``tgt_len``, the inference cache), the
    fastest of ``repeats``, and its share of the compute limit: the FLOP/s of a large fp32 matmul in this run."""
    best = float("inf")
    for _ in range(repeats):
        sync(prompt.device.type)
        start = time.perf_counter()
        next(stream(model, prompt, max_new_tokens=1, mem_len=mem_len))
        sync(prompt.device.type)
        best = min(best, time.perf_counter() - start)
    flops = prefill_flops(model.config, batch=prompt.size(0), prompt_len=prompt.size(1))
    peak = matmul_peak(prompt.device.type, "fp32")
    return {"tok_per_s": prompt.numel() / best, "flop_per_s": flops / best, "peak_flop_per_s": peak,
            "share_of_compute": flops / best / peak}


def run_generate_bench(opts: GenerateBenchOptions, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every case of ``opts`` (shapes x memory lengths x batch sizes)."""
    check_device(opts.device)
    if opts.kv_dtype not in KV_DTYPES:
        raise ConfigError(f"unknown kv dtype {opts.kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
    for shape in opts.shapes:  # every name checked before any case runs
        shape_config(shape)
    rows = [run_case(s, m, b, opts, log) for s, m, b in itertools.product(opts.shapes, opts.mem_lens, opts.batches)]
    machine = torch.cuda.get_device_name() if opts.device.startswith("cuda") else cpu_model()
    return {"options": asdict(opts), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": machine, "cpu_flags": cpu_flags(wanted=FLAGS), "hf": opts.hf and hf_available(), "rows": rows}


#: The CPU flags that decide which kernels run (vector width, bf16 and int8 dot products, AMX tiles).
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


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
    if any("captured" in r["tok_per_s"] or "prefill" in r for r in report["rows"]):
        lines += ["", captured_markdown(report)]
    return "\n".join(lines)


def captured_markdown(report: dict[str, Any]) -> str:
    """The captured step and the prefill of the same run: tokens/s, shares of the limits, compile seconds."""
    flags = ", ".join(report.get("cpu_flags", [])) or "–"
    head = ("| shape | mem_len | batch | streaming GB/s | plain tok/s | captured tok/s | captured ÷ plain "
            "| captured share of limit (weights / +cache) | captured int8 tok/s (kv) | int8 ÷ fp32 (captured) "
            "| same tokens (fp32 / int8) | compile s (fp32 / int8) | prefill tok/s | prefill share of compute |")
    lines = [f"Captured step and prefill (CPU flags: {flags})", "", head, "|" + "---|" * 14]

    def num(v: float | None, fmt: str = ".1f") -> str:
        return "–" if v is None else format(v, fmt)

    for r in report["rows"]:
        tps, comp, lim = r["tok_per_s"], r.get("compile_s", {}), r["limit"]
        frac, pre = r.get("fraction_captured"), r.get("prefill")
        ratio = statistics.median(a / b for a, b in zip(r["rounds"]["captured"], r["rounds"]["txl"])) \
            if "captured" in r["rounds"] else None
        share = "–" if frac is None else f"{frac['weights']:.0%} / {frac['weights+cache']:.0%}"
        pre_share = "–" if pre is None else f"{pre['share_of_compute']:.0%}"
        lines.append(
            f"| {r['shape']} | {r['mem_len']} | {r['batch']} | {lim['weights_bytes'] / lim['weights_s'] / 1e9:.1f} | "
            f"{num(tps['txl'])} | {num(tps.get('captured'))} | {num(ratio, '.2f')}{'×' if ratio else ''} | "
            f"{share} | "
            f"{num(tps.get('captured-int8'))} ({r.get('kv_dtype', '–')}) | "
            f"{num(r.get('captured_int8_over_fp32'), '.2f')}{'×' if 'captured_int8_over_fp32' in r else ''} | "
            f"{r.get('captured_same_tokens', '–')} / {r.get('captured-int8_same_tokens', '–')} | "
            f"{num(comp.get('captured'))} / {num(comp.get('captured-int8'))} | "
            f"{num(pre and pre['tok_per_s'])} | {pre_share} |")
    return "\n".join(lines)
