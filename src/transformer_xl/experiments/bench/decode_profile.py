"""Where a captured decode step's time goes on this machine, in a form anyone can run and send (``txl bench decode``).

The step is one compiled graph (:class:`~transformer_xl.inference.captured.CapturedDecoder`): inductor fuses it, so a
profiler sees one kernel, or one kernel between two calls of txl's matrix kernels. This module times the step's
parts on their own, each in the form the step runs it (the same functions of :mod:`transformer_xl.inference.decode`
over the decoder's own packed weights and rings, compiled the same way), and the step itself:

* **groups**: each family of matrices over every layer (``qkv``, ``o``, ``ff1``, ``ff2``), the softmax's matrix (head
  and tail clusters, with their projections), the attention over the memory (every layer's ring: keys, position
  keys, values), the log-softmax over the vocabulary, the input embedding;
* **the step**: the compiled graph called alone, :meth:`~transformer_xl.inference.captured.CapturedDecoder.step`
  (the graph and the decoder's bookkeeping: the memories it returns), and a generation step (``step`` and the
  argmax of the next token);
* what is left: **beyond the groups** (the graph's time less the sum of its groups: layer norms, residuals, the
  launch of every kernel and parallel region, and what fusing the groups saves or costs) and **the decoder's
  wrapper** (``step`` less the graph).

Every group is timed after reading a buffer twice the last-level cache, so it starts from memory as in the step
(where the rest of the step's bytes pass through the cache between two reads of a group); the step is timed as a
generation runs it. The run is ``steps`` rounds; a round times every part once and makes one read pass (the
yardstick's ``Tensor.sum`` over a buffer far larger than the last-level cache, on huge pages), and each figure is
the best of its rounds (wall time): the parts and the read rate are sampled over the same moments of a machine
whose load and memory rate move. Beside each part: the bytes it must read
(:func:`~transformer_xl.experiments.bench.yardstick.step_bytes`' parts, the zeros that pad blocks not counted) and
its rate as a share of the best read pass. The report
records the CPU (model, vendor, flags, caches), torch's threads and kernels' instruction set, and the form each
choice took (:func:`~transformer_xl.model.dispatch.decode_products`).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.bench.yardstick import (
    YardstickError,
    llc_bytes,
    machine,
    read_buffer,
    share,
    step_bytes,
)
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.inference.decode import attend_ring, embed, head_logits, linear, log_probs_of, ring_position
from transformer_xl.inference.packing import Linear
from transformer_xl.model import TransformerXLLM, TXLConfig, native
from transformer_xl.model.fastpath import cpu_caches

#: The matrix families of a layer, by their key in the packed weights.
FAMILIES = ("qkv", "o", "ff1", "ff2")


def _linear_bytes(lins: list[Linear]) -> int:
    """Bytes a step must read of ``lins``: weights (less their padding), scales, biases."""
    return sum(lin.weight.nbytes - lin.padding_bytes + sum(t.nbytes for t in (lin.scale, lin.bias) if t is not None)
               for lin in lins)


def _once(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn``."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _groups(dec: CapturedDecoder, compile: bool, parts: dict[str, int]) -> dict[str, tuple[Callable[[], Any], int]]:
    """Each group of the step as a function of no arguments over the decoder's own buffers, and its bytes (``parts``:
    the step's, :func:`~transformer_xl.experiments.bench.yardstick.step_bytes`)."""
    spec, w, batch = dec.spec, dec.weights, dec.batch
    cfg = dec.model.config
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(batch, cfg.d_model, generator=gen, dtype=dec.dtype)
    inner = torch.randn(batch, cfg.d_inner, generator=gen, dtype=dec.dtype)
    qkv = torch.randn(batch, 3, cfg.n_head, cfg.d_head, generator=gen, dtype=dec.dtype).unbind(1)
    tok = torch.zeros(batch, dtype=torch.long)
    wrap = (lambda f: torch.compile(f, fullgraph=True, dynamic=False)) if compile else (lambda f: f)
    # txl's kernels are extern calls in the step's graph: the same calls made eagerly
    wrap_mm = wrap if dec.products == "compiled" else (lambda f: f)
    inputs = {"qkv": h, "o": h.new_zeros(batch, cfg.n_head * cfg.d_head).normal_(generator=gen), "ff1": h,
              "ff2": inner}
    groups: dict[str, tuple[Callable[[], Any], int]] = {}
    for fam in FAMILIES:
        lins = [layer[fam] for layer in w["layers"]]
        x = inputs[fam]
        groups[f"matrices {fam} ({len(lins)} layers)"] = (
            wrap_mm(lambda lins=lins, x=x: [linear(x, lin) for lin in lins]), _linear_bytes(lins))
    head_lins = [t for t in tree_leaves(w["head"], is_leaf=lambda t: isinstance(t, Linear)) if isinstance(t, Linear)]
    groups["softmax matrix (head and tails)"] = (wrap_mm(lambda: head_logits(spec, w["head"], h)),
                                                 _linear_bytes(head_lins))
    logits = head_logits(spec, w["head"], h)
    groups["log-softmax over the vocabulary"] = (wrap(lambda: log_probs_of(spec, logits)),
                                                 sum(t.nbytes for t in logits))
    # the ring is written at the slot of position cur: a copy of the position counters, so the decoder's stay
    slot_pos, cur = dec.slot_pos.clone(), dec.cur.clone()

    def attention() -> list[torch.Tensor]:
        where = ring_position(spec, slot_pos, cur)
        return [attend_ring(spec, layer, *qkv, dec.ks[i], dec.vs[i], dec.pos_keys[i], where)
                for i, layer in enumerate(w["layers"])]

    groups["attention over the memory"] = (wrap(attention), parts["ring"] + parts["position_keys"] + parts["slots"])
    emb_lins = [proj for _, proj in w["emb"] if proj is not None]
    groups["input embedding"] = (wrap(lambda: embed(spec, w["emb"], tok)),
                                 parts["embedding_rows"] + _linear_bytes(emb_lins))
    return groups


def _is_compiled(fn: Callable[[], Any]) -> bool:
    return hasattr(fn, "_torchdynamo_orig_callable")  # what torch.compile returns for a function


def _share(nbytes: int, seconds: float, rate: float) -> float | None:
    try:
        return share(nbytes / seconds, rate, "read share")
    except YardstickError:  # a group that stayed in a cache: no share of the read rate
        return None


def profile_decode(config: TXLConfig, *, shape: str = "custom", mem_len: int = 640, batch: int = 1,
                   int8: bool = False, kv_dtype: str = "float32", products: str | None = None, steps: int = 20,
                   compile: bool = True, seed: int = 0, log: Callable[[str], None] = lambda line: None) -> dict:
    """The profile of one captured step (module docstring) of a random-weight model of ``config``, its memory full
    (``mem_len``) from the first step; ``products``: the form of the matrix products (default: the rule's);
    ``compile=False`` runs everything eagerly (tests, and a machine without a compiler: the figures are then not
    the compiled step's). A dict for JSON; :func:`profile_markdown` makes its table."""
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    torch.manual_seed(seed)
    model = TransformerXLLM(config).eval()
    dec = CapturedDecoder(model, batch=batch, mem_len=mem_len, int8=int8, kv_dtype=kv_dtype, products=products,
                          compile=compile)
    log(f"profile: {shape}, mem_len {mem_len}, batch {batch}, {'int8' if int8 else 'fp32'} weights, {kv_dtype} "
        f"ring, products {dec.products}, {torch.get_num_threads()} threads")
    mems = [torch.randn(batch, mem_len, config.d_model) for _ in range(config.n_layer + 1)]
    tok = torch.zeros(batch, dtype=torch.long)
    dec.load(mems)
    first = time.perf_counter()
    lp, mems = dec.step(tok, mems)  # the first step compiles
    first_s = time.perf_counter() - first
    evict = torch.ones(max(2 * llc_bytes(), 2**20) // 4)
    state = {"mems": mems, "tok": lp.argmax(-1)}

    def gen_step() -> None:
        lp, state["mems"] = dec.step(state["tok"], state["mems"])
        state["tok"] = lp.argmax(-1)

    def dec_step() -> None:
        state["mems"] = dec.step(state["tok"], state["mems"])[1]

    args = (dec.spec, dec.weights, tok, dec.ks, dec.vs, dec.slot_pos, dec.cur, dec.pos_keys)
    steps_fns = {"generation step (step + argmax)": gen_step, "decoder.step": dec_step,
                 "compiled graph alone": lambda: dec._fn(*args)}
    log("  compiling the groups")
    need = step_bytes(dec)
    groups_fns = _groups(dec, compile, need)
    # every compiled group pays the cost of one call of a compiled function (guards, its Python wrapper), which the
    # step pays once: measured on a function of one addition, and taken off every compiled group
    one = torch.zeros(1)
    call_fn = torch.compile(lambda: one + 1, fullgraph=True) if compile else None
    for fn in [*steps_fns.values(), *(f for f, _ in groups_fns.values()), *([call_fn] if call_fn else [])]:
        fn()  # warm: every group compiled before the rounds
    # rounds: every part (and a read pass) timed once per round, each part's best kept, so that every figure and
    # the read rate come from the same moments of a machine whose load and memory rate move
    best: dict[str, float] = {}
    rates = []
    buf = read_buffer()
    for _ in range(steps):
        rates.append(buf.nbytes / _once(buf.sum))
        for name, fn in steps_fns.items():
            best[name] = min(best.get(name, math.inf), _once(fn))
        for name, (fn, _) in groups_fns.items():
            evict.sum()
            best[name] = min(best.get(name, math.inf), _once(fn))
        if call_fn is not None:
            best["call"] = min(best.get("call", math.inf), _once(call_fn))
    del buf
    call_s = best.get("call", 0.0)
    whole = {name: best[name] for name in steps_fns}
    log(f"  step: {whole['generation step (step + argmax)'] * 1e3:.2f} ms")
    timed = {name: (max(best[name] - call_s, 1e-9) if _is_compiled(fn) else best[name], nbytes)
             for name, (fn, nbytes) in groups_fns.items()}
    rate = max(rates)
    groups = [{"group": name, "ms": s * 1e3, "bytes": n, "gb_per_s": n / s / 1e9, "read_share": _share(n, s, rate)}
              for name, (s, n) in timed.items()]
    graph = whole["compiled graph alone"]
    groups.append({"group": "beyond the groups (norms, residuals, launches, fusion)",
                   "ms": (graph - sum(s for s, _ in timed.values())) * 1e3, "bytes": None, "gb_per_s": None,
                   "read_share": None})
    groups.append({"group": "the decoder's wrapper (step less the graph)",
                   "ms": (whole["decoder.step"] - graph) * 1e3, "bytes": None, "gb_per_s": None, "read_share": None})
    step_s = whole["generation step (step + argmax)"]
    info = machine()
    info.update({"vendor": native.vendor(), "caches": {f"L{k}": v for k, v in sorted(cpu_caches().items())},
                 "torch": torch.__version__, "kernels_isa": torch.backends.cpu.get_cpu_capability(),
                 "python": platform.python_version()})
    return {
        "compiled_call_ms": call_s * 1e3,
        "what": "txl bench decode: the captured decode step's time by group, against the read rate",
        "shape": shape, "config": config.to_dict(), "mem_len": mem_len, "batch": batch,
        "weights": "int8" if int8 else "float32", "kv_dtype": kv_dtype, "compiled": compile,
        "forms": {"products": dec.products, "native_kernels": native.unavailable() or "available",
                  "int8_form": dec.weights["layers"][0]["qkv"].form if int8 else None},
        "machine": info, "read_rates_gb_per_s": [r / 1e9 for r in rates], "read_rate_gb_per_s": rate / 1e9,
        "first_step_s": first_s, "steps": steps,
        "step": {name: s * 1e3 for name, s in whole.items()} | {"unit": "ms"},
        "step_bytes": need, "tokens_per_s": batch / step_s,
        "step_read_share": _share(need["total"], step_s, rate),
        "graph_read_share": _share(need["total"], graph, rate),
        "groups": groups,
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def profile_markdown(report: dict, title: str = "") -> str:
    """The report of :func:`profile_decode` as a markdown table, with its machine and forms above it."""
    m, f = report["machine"], report["forms"]
    lines = [title or f"`txl bench decode` ({report['shape']}, mem_len {report['mem_len']}, batch {report['batch']})",
             "",
             f"CPU: {m['cpu']} ({m['vendor'] or 'unknown vendor'}; flags {', '.join(m['cpu_flags']) or 'none'}; "
             f"caches {', '.join(f'{k} {v // 1024} KiB' for k, v in m['caches'].items())}); {m['threads']} "
             f"threads; kernels {m['kernels_isa']}; torch {m['torch']}; load average {m['load_average']}.",
             f"Forms: products **{f['products']}** (txl's kernels: {f['native_kernels']}); weights "
             f"{report['weights']}{' (' + f['int8_form'] + ')' if f['int8_form'] else ''}; ring {report['kv_dtype']}"
             f"{'' if report['compiled'] else '; not compiled (eager)'}.",
             f"Read rate {report['read_rate_gb_per_s']:.1f} GB/s; a step reads "
             f"{report['step_bytes']['total'] / 2**20:.1f} MiB: "
             f"{report['step']['generation step (step + argmax)']:.2f} ms a token "
             f"({report['tokens_per_s']:.1f} tok/s), {_pct(report['step_read_share'])} of the read limit "
             f"(the graph alone: {_pct(report['graph_read_share'])}).",
             f"A compiled group's time is less one call of a compiled function ({report['compiled_call_ms']:.3f} ms),"
             " which the step pays once.",
             "",
             "| part | ms | MiB | GB/s | share of the read rate |",
             "|---|---:|---:|---:|---:|"]
    for name, ms in report["step"].items():
        if name != "unit":
            lines.append(f"| **{name}** | {ms:.2f} | | | |")
    for g in report["groups"]:
        mib = "" if g["bytes"] is None else f"{g['bytes'] / 2**20:.1f}"
        rate = "" if g["gb_per_s"] is None else f"{g['gb_per_s']:.1f}"
        lines.append(f"| {g['group']} | {g['ms']:.2f} | {mib} | {rate} | {_pct(g['read_share'])} |")
    return "\n".join(lines)
