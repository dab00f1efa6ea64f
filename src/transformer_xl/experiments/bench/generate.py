"""``txl bench generate``: generation tokens/s of txl against Hugging Face's loop and the memory-bandwidth limit.

A decoding step reads every weight it uses once, and the keys/values of the memory, so its floor is the time it
takes to read those bytes at the machine's read rate. For every case (a model shape, a memory length, a batch
size) one run measures, alternating them over ``repeats`` rounds:

* **txl**: :func:`transformer_xl.inference.generate.stream`, greedy, after a prompt of ``mem_len`` tokens (the memory
  is full from the first step), decode steps only; the captured step (fp32, and int8 weights with a ``kv_dtype``
  ring) through :class:`~transformer_xl.inference.captured.CapturedDecoder`;
* **HF**: Hugging Face TransfoXL (same weights, :func:`transformer_xl.interop.hf.build_hf`) looping its forward with
  ``mems``, one token per step (its ``generate`` does not run on the deprecated model), decode steps only;
  the greedy tokens are compared with txl's;
* **txl int8** (``int8=True``): the same model after :meth:`~transformer_xl.model.TransformerXLLM.quantize`;
* **the limit** of each txl decoder (:mod:`~transformer_xl.experiments.bench.yardstick`): the bytes its step
  reads (the captured step's from its packed weights, ring and position-key table; the plain step's counted by
  running one under a dispatch mode) at the read rate of a buffer far larger than the last-level cache, measured
  once per run. A share above 100 % is refused. Beside the read rate, the rates of the ``F.linear`` chain over the
  weights (the limit this bench used before, a BLAS kernel's speed) and of the bare ``torch.mv`` skeleton.

Reported: tokens/s (all rows), ÷ HF (median of the per-round ratios), each decoder's bytes per step, limit and
share, and how many of the generated tokens (rows × steps) the others share with the plain step. Random weights
give nearly flat next-token distributions (top-2 gaps of 0.01 nats), so int8 rounding flips some greedy choices;
its accuracy cost is measured on a trained model instead (``docs/generation-speed.md``).
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

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.bench.measure import sync
from transformer_xl.experiments.bench.yardstick import (
    forward_flops,
    gemm_peak,
    linear_chain_rate,
    machine,
    mv_skeleton_rate,
    plain_step_bytes,
    read_rate,
    share,
    step_bytes,
)
from transformer_xl.inference.captured import KV_DTYPES, CapturedDecoder
from transformer_xl.inference.decode import supported
from transformer_xl.inference.generate import GenerationStep, stream
from transformer_xl.inference.loading import check_device
from transformer_xl.interop.hf import build_hf, hf_available, hf_compat
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.presets import enwik8_base, wt103_base
from transformer_xl.train.precision import CPU_CLASSES, device_description

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
    """The weight matrices one decoding step multiplies by, in step order: every layer's ``[W_q; W_k; W_v]``,
    ``W_o`` and feed-forward (not ``W_kR``: a step reads a table of position keys instead), then the output
    softmax's (the tied input embedding is that same matrix; an untied one is only indexed)."""
    mats = [p for n, p in model.layers.named_parameters() if p.dim() == 2 and "r_net" not in n]
    head = model.crit if hasattr(model, "crit") else model.out_layer
    return mats + [p for p in head.parameters() if p.dim() == 2]


def kernel_rates(model: TransformerXLLM, batch: int) -> dict[str, float]:
    """For comparison with the read rate: bytes/s of ``F.linear`` of ``batch`` rows over :func:`step_weights` (the
    limit this bench used before) and of the bare ``torch.mv`` skeleton of a batch-1 step."""
    weights = step_weights(model)
    return {"linear_chain": linear_chain_rate(weights, batch=batch), "mv_skeleton": mv_skeleton_rate(weights)}


def _shares(row: dict[str, Any], rate: float) -> None:
    """Every decoder's limit (tokens/s if a step took only the time to read its bytes once at ``rate``) and its
    share of it (refused above 100 %: :func:`~transformer_xl.experiments.bench.yardstick.share`)."""
    batch, tps = row["batch"], row["tok_per_s"]
    row["limit_tok_per_s"] = {k: batch * rate / n for k, n in row["step_bytes"].items()}
    row["share"] = {k: share(tps[k], lim, f"{row['shape']} mem_len {row['mem_len']} batch {batch} {k}")
                    for k, lim in row["limit_tok_per_s"].items()}


# ---------------------------------------------------------------------------------------------- a case
def run_case(shape: str, mem_len: int, batch: int, opts: GenerateBenchOptions, rate: float,
             log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """One case: tokens/s of every decoder, the ratios, the bytes of each decoder's step and its share of the limit
    they give at the read rate (bytes/s: the larger of ``rate`` and a measurement after the case's rounds; see the
    module docstring)."""
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
    nbytes: dict[str, int] = {}
    if opts.captured and supported(model) is None:
        for name, kw in (("captured", {}), ("captured-int8", {"int8": True, "kv_dtype": opts.kv_dtype})):
            if kw and not (opts.int8 and opts.device == "cpu"):
                continue
            dec = CapturedDecoder(model, batch=batch, mem_len=mem_len, **kw)
            _txl_decode(model, prompt[:, :cfg.tgt_len], 1, mem_len, dec)  # compiles (once per model shape)
            compile_s[name] = dec.compile_s or 0.0
            nbytes[name] = step_bytes(dec)["total"]
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
    plain = [("txl", model)] + ([("txl-int8", q_model)] if "txl-int8" in decoders else [])
    for name, m in plain:  # from the prompt's state, as the timed steps
        first = prefilled[id(m)]
        nbytes[name] = plain_step_bytes(m, first.tokens, first.mems, mem_len=mem_len)
    row: dict[str, Any] = {"shape": shape, "mem_len": mem_len, "batch": batch, "params": model.num_parameters(),
                           "tok_per_s": {k: statistics.median(v) for k, v in rates.items()}, "rounds": rates,
                           "compile_s": compile_s, "kv_dtype": opts.kv_dtype, "step_bytes": nbytes,
                           "kernel_bytes_per_s": kernel_rates(model, batch) if opts.device == "cpu" else {}}
    # the limit: the best read rate of the run so far, measured again after this case's rounds (the load moves)
    row["read_rate_bytes_per_s"] = max(rate, read_rate(opts.device)["bytes_per_s"])
    _shares(row, row["read_rate_bytes_per_s"])
    if opts.prefill:
        row["prefill"] = measure_prefill(model, prompt, mem_len, repeats=opts.repeats)
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
    for name in ("captured", "captured-int8"):
        if name in rates:
            row[f"{name}_same_tokens"] = f"{int((torch.stack(tokens[name], 1) == ref).sum())}/{ref.numel()}"
    if "captured-int8" in rates and "captured" in rates:
        row["captured_int8_over_fp32"] = statistics.median(
            a / b for a, b in zip(rates["captured-int8"], rates["captured"]))
    return row


def prefill_flops(cfg: TXLConfig, *, batch: int, prompt_len: int) -> float:
    """Matmul FLOPs of reading a prompt in segments of ``tgt_len`` over a growing memory (capped at the prompt):
    :func:`~transformer_xl.experiments.bench.yardstick.forward_flops` of a stream (keys/values and position keys
    from the inference cache), less the output softmax it counts at every position (a prompt needs it at the last)."""
    total = 0.0
    for start in range(0, prompt_len, cfg.tgt_len):
        parts = forward_flops(cfg, batch=batch, qlen=min(cfg.tgt_len, prompt_len - start), mlen=start, streaming=True)
        total += parts["total"] - parts["softmax"]
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
    peak = gemm_peak("fp32", prompt.device.type)
    return {"tok_per_s": prompt.numel() / best, "flop_per_s": flops / best, "peak_flop_per_s": peak,
            "share_of_compute": share(flops / best, peak, "prefill")}


def run_generate_bench(opts: GenerateBenchOptions, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every case of ``opts`` (shapes x memory lengths x batch sizes)."""
    check_device(opts.device)
    if opts.kv_dtype not in KV_DTYPES:
        raise ConfigError(f"unknown kv dtype {opts.kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
    for shape in opts.shapes:  # every name checked before any case runs
        shape_config(shape)
    rate = read_rate(opts.device)
    log(device_description(opts.device))
    log(f"read rate {rate['bytes_per_s'] / 1e9:.1f} GB/s ({rate['buffer_bytes'] / 2**20:.0f} MiB, {rate['method']})")
    rows = [run_case(s, m, b, opts, rate["bytes_per_s"], log)
            for s, m, b in itertools.product(opts.shapes, opts.mem_lens, opts.batches)]
    box = machine(opts.device)
    return {"options": asdict(opts), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": box.get("gpu", box["cpu"]), "cpu_flags": box["cpu_flags"], "env": box, "read_rate": rate,
            "hf": opts.hf and hf_available(), "rows": rows}


#: Decoders in table order, and what each is.
DECODERS = {"txl": "plain step", "captured": "captured step", "txl-int8": "plain step, int8 weights",
            "captured-int8": "captured step, int8 weights", "hf": "Hugging Face loop"}


def _num(v: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "–" if v is None else format(v, fmt) + unit


def to_markdown(report: dict[str, Any], command: str) -> str:
    """The report as Markdown: one row per case and decoder (tokens/s, the bytes of its step, the read rate, the limit
    they give and its share of it, ÷ HF, the same greedy tokens as the plain step), the kernels' rates beside the
    read rate, then the prefill; with the command, the CPU and its flags. A file written before the yardstick has
    no bytes, limits or shares: dashes."""
    flags = ", ".join(report.get("cpu_flags", [])) or "not recorded"
    env = report.get("env", {})
    load, cls = env.get("load_average", "not recorded"), env.get("cpu_class")
    kernels = f"; {CPU_CLASSES.get(cls, cls)} kernels" if cls else ""
    lines = [f"`{command}` (torch {report['torch']}, {report['threads']} threads, {report['machine']}; flags: {flags}"
             f"{kernels}; load average {load}; medians of {report['options']['repeats']} alternating rounds)", "",
             "| shape | mem_len | batch | decoder | tok/s | MB per step | read GB/s | limit tok/s | share of limit "
             "| ÷ HF | same tokens as plain |", "|" + "---|" * 11]
    for r in report["rows"]:
        same = {"hf": r.get("hf_same_tokens"), "txl-int8": r.get("int8_same_tokens"),
                "captured": r.get("captured_same_tokens"), "captured-int8": r.get("captured-int8_same_tokens")}
        nbytes, shares, rate = r.get("step_bytes", {}), r.get("share", {}), _row_rate(report, r)
        for name in (n for n in DECODERS if n in r["tok_per_s"]):
            lim = r["limit_tok_per_s"].get(name) if shares else None
            over_hf = None if name == "hf" or "hf" not in r["rounds"] else statistics.median(
                a / b for a, b in zip(r["rounds"][name], r["rounds"]["hf"]))
            lines.append(f"| {r['shape']} | {r['mem_len']} | {r['batch']} | {DECODERS[name]} | "
                         f"{_num(r['tok_per_s'][name])} | {_num(nbytes.get(name) and nbytes[name] / 1e6)} | "
                         f"{_num(rate / 1e9 if rate and name in shares else None)} | {_num(lim)} | "
                         f"{_num(shares[name] * 100 if name in shares else None, '.1f', ' %')} | "
                         f"{_num(over_hf, '.2f', '×')} | {same.get(name) or '–'} |")
    lines += ["", kernels_markdown(report)]
    if any("prefill" in r or r.get("compile_s") for r in report["rows"]):
        lines += ["", prefill_markdown(report)]
    return "\n".join(lines)


def _row_rate(report: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The read rate a row's shares are against (the run's first measurement in files that kept no other)."""
    return row.get("read_rate_bytes_per_s") or report.get("read_rate", {}).get("bytes_per_s")


def kernels_markdown(report: dict[str, Any]) -> str:
    """The read rate beside the rates of the BLAS kernels over each case's weight matrices (the ``F.linear`` chain
    was the limit before the yardstick; older files record it as ``limit``)."""
    lines = ["| shape | mem_len | batch | read GB/s (Tensor.sum, buffer ≫ LLC) | F.linear chain GB/s "
             "| torch.mv skeleton GB/s |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        k, old = r.get("kernel_bytes_per_s", {}), r.get("limit", {})
        chain = k.get("linear_chain") or (old and old["weights_bytes"] / old["weights_s"])
        rate = _row_rate(report, r)
        lines.append(f"| {r['shape']} | {r['mem_len']} | {r['batch']} | {_num(rate and rate / 1e9)} | "
                     f"{_num(chain and chain / 1e9)} | {_num(k.get('mv_skeleton') and k['mv_skeleton'] / 1e9)} |")
    return "\n".join(lines)


def prefill_markdown(report: dict[str, Any]) -> str:
    """The prompt's forward (tokens/s and its share of the fp32 GEMM peak) and the captured steps' compile seconds."""
    lines = ["| shape | mem_len | batch | compile s (fp32 / int8) | prefill tok/s | prefill share of fp32 GEMM peak |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        comp, pre = r.get("compile_s", {}), r.get("prefill")
        lines.append(f"| {r['shape']} | {r['mem_len']} | {r['batch']} | {_num(comp.get('captured'))} / "
                     f"{_num(comp.get('captured-int8'))} | {_num(pre and pre['tok_per_s'])} | "
                     f"{_num(pre and pre['share_of_compute'] * 100, '.0f', ' %')} |")
    return "\n".join(lines)
