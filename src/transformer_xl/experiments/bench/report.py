"""A benchmark run: every case timed side by side, the txl ÷ HF ratios, and the Markdown table."""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from transformer_xl.experiments.bench.cases import RECOMPUTE, BenchOptions, bench_case
from transformer_xl.experiments.bench.measure import peak_memory_cpu, peak_memory_cuda, sync
from transformer_xl.experiments.bench.runner import Runner, check_equal, setup
from transformer_xl.experiments.bench.skeleton import gemm_skeleton
from transformer_xl.experiments.bench.yardstick import forward_flops, gemm_peaks, machine, share, train_flops
from transformer_xl.interop.hf import build_hf, hf_available
from transformer_xl.train.precision import device_description

#: How a report's FLOPs were counted (``env["flops"]``): strictly, by the yardstick.
STRICT = "strict (yardstick)"
#: The optimizer of each side's training steps (``env["optimizer"]``; older reports: the same unfused Adam).
OPTIMIZERS = {"txl": "Adam, fused on the CPU and CUDA (as txl train)",
              "hf": "Adam, torch.optim's default (as the official train.py)"}


def time_interleaved(runners: list[Runner], step: Callable[[Runner], None], *, steps: int, repeats: int,
                      warmup: int, device: str, warmup_s: dict[str, float] | None = None) -> dict[str, list[float]]:
    """Seconds per step of each runner, ``repeats`` rounds, alternating runners (and their order); the wall
    seconds of each runner's warm-up steps (compilation included) go into ``warmup_s``."""
    for r in runners:
        sync(device)
        t = time.perf_counter()
        for _ in range(warmup):
            step(r)
        sync(device)
        if warmup_s is not None:
            warmup_s[r.name] = time.perf_counter() - t
    times: dict[str, list[float]] = {r.name: [] for r in runners}
    for rep in range(repeats):
        for r in runners if rep % 2 == 0 else runners[::-1]:
            sync(device)
            t = time.perf_counter()
            for _ in range(steps):
                step(r)
            sync(device)
            times[r.name].append((time.perf_counter() - t) / steps)
    return times


def _ratio_key(runner: str) -> str:
    """Where a txl runner's ÷ HF ratio is stored: ``ratio`` for ``txl`` (the report's main figure), else
    ``ratio_<runner>``."""
    return "ratio" if runner == "txl" else f"ratio_{runner}"


def _ratio_texts(values: dict[str, Any]) -> list[str]:
    """``"<runner>/hf <ratio>"`` for every ratio stored by :func:`_ratio_key` in ``values``."""
    return [f"{'txl' if k == 'ratio' else k[len('ratio_'):]}/hf {v:.2f}" for k, v in values.items()
            if k.startswith("ratio") and not k.endswith("_rounds")]


def _summary(times: dict[str, list[float]], tokens: int) -> dict[str, Any]:
    """Tokens/s of every runner; with HF, ``ratio`` (txl ÷ HF, median of the rounds) and, for other
    txl runners, ``ratio_<name>``."""
    out: dict[str, Any] = {name: {"tok_per_s": tokens / statistics.median(t), "step_s": t} for name, t in times.items()}
    if "hf" in times:
        for name in times:
            if name == "hf":
                continue
            ratios = [h / o for o, h in zip(times[name], times["hf"])]
            key = _ratio_key(name)
            out[key] = statistics.median(ratios)
            out[f"{key}_rounds"] = ratios
    return out


def _variants(case_name: str, opts: BenchOptions, bsz: int) -> list[Runner]:
    """txl eager/compiled x fp32/bf16 runners other than the main one (``BenchOptions.variants``)."""
    out = []
    for compile_ in (False, True):
        for dtype in ("fp32", "bf16"):
            if (compile_, dtype) == (opts.compile, opts.dtype):
                continue
            r, _, _ = setup(case_name, "txl", device=opts.device, dtype=dtype, compile=compile_, batch=bsz,
                            seed=opts.seed)
            r.name = f"txl-{'compiled' if compile_ else 'eager'}-{dtype}"
            out.append(r)
    return out


def run_case(case_name: str, opts: BenchOptions, peaks: dict[str, float],
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """All measurements of one case (see the module docstring)."""
    case = bench_case(case_name)
    bsz = opts.batch_size or case.batch_size
    cfg = case.config
    use_hf = opts.hf and hf_available() and cfg.attn_type == 0 and cfg.sample_softmax <= 0
    if use_hf and opts.dtype == "bf16":
        log(f"[{case_name}] HF's softmax criterion fails under bf16 autocast (index_put dtype); txl only")
        use_hf = False
    ours, x, y = setup(case_name, "txl", device=opts.device, dtype=opts.dtype, compile=opts.compile,
                        batch=bsz, seed=opts.seed)
    runners = [ours]
    res: dict[str, Any] = {"case": case_name, "config": cfg.to_dict(), "batch_size": bsz, "hf": use_hf}
    if use_hf:
        hf = build_hf(ours.model).to(opts.device)
        res["max_abs_nll_diff"] = check_equal(ours.model, hf, x, y)
        log(f"[{case_name}] max |nll(txl) - nll(hf)| = {res['max_abs_nll_diff']:.2e}")
        runners.append(Runner("hf", hf, device=opts.device, dtype=opts.dtype, compile=False))
    tokens = bsz * cfg.tgt_len
    train_runners = list(runners)
    if opts.recompute:  # training only: without a gradient nothing is recomputed
        rc, _, _ = setup(case_name, RECOMPUTE, device=opts.device, dtype=opts.dtype, compile=opts.compile,
                          batch=bsz, seed=opts.seed)
        train_runners.insert(1, rc)
    variants = _variants(case_name, opts, bsz) if opts.variants else []
    train_runners += variants
    runners += variants

    warm: dict[str, float] = {}
    times = time_interleaved(train_runners, lambda r: r.train_step(x, y), steps=opts.steps,
                              repeats=opts.repeats, warmup=opts.warmup, device=opts.device, warmup_s=warm)
    res["train"] = _summary(times, tokens)
    flops = train_flops(cfg, batch=bsz, qlen=cfg.tgt_len, mlen=cfg.mem_len, targets=y)
    res["train_flops_per_token"] = flops / tokens
    for r in train_runners:
        row = res["train"][r.name]
        row["flop_per_s"], row["dtype"] = flops * row["tok_per_s"] / tokens, r.dtype
        row["mfu"] = row["flop_per_s"] / peaks[r.dtype]  # for the log; refused above 100 % by _final_mfu
        row["warmup_s"] = warm[r.name]  # compiled runners: the compilation of their graphs, plus warm-up steps
    log(f"[{case_name}] warm-up, {opts.warmup} training steps (compilation included): "
        + ", ".join(f"{r.name} {warm[r.name]:.1f} s" for r in train_runners))
    for r in variants:
        res["train"][f"speedup_{r.name}"] = res["train"][r.name]["tok_per_s"] / res["train"]["txl"]["tok_per_s"]
    log(f"[{case_name}] train: " + _fmt(res["train"]))
    if opts.skeleton:
        res["skeleton"] = {}
        for r in train_runners:
            if r.compiled:  # a compiled graph's products are not dispatched one by one
                continue
            sk = gemm_skeleton(lambda r=r: r.train_step(x, y), device=opts.device)
            res["skeleton"][r.name] = {**sk, "tok_per_s": tokens / sk["seconds"], "dtype": r.dtype,
                                       "flop_per_s": flops / sk["seconds"],
                                       "step_over_skeleton": statistics.median(times[r.name]) / sk["seconds"]}
        skeleton = res["skeleton"]
        if "hf" in skeleton:
            hf_step = statistics.median(times["hf"])
            for name in [n for n in skeleton if n != "hf"]:
                skeleton[_ratio_key(name)] = skeleton["hf"]["seconds"] / skeleton[name]["seconds"]
                # the most the step's ratio could be if all but txl's products were free: txl's skeleton vs HF's step
                skeleton[name]["ceiling_ratio"] = hf_step / skeleton[name]["seconds"]
        log(f"[{case_name}] GEMM skeleton (the step's matrix products alone): " + ", ".join(
            f"{k} {v['tok_per_s']:,.0f} tok/s, step {v['step_over_skeleton']:.2f}x its time, "
            f"{v['ops']:.0f} operators per step" for k, v in res["skeleton"].items()
            if isinstance(v, dict)))

    res["eval"] = {}
    gen = torch.Generator().manual_seed(opts.seed + 1)
    for mem_len in opts.eval_mem_lens:
        for r in runners:
            r.set_eval_mem(mem_len, bsz, gen)
        times = time_interleaved(runners, lambda r: r.eval_step(x, y), steps=opts.steps, repeats=opts.repeats,
                                  warmup=1, device=opts.device)
        ev = _summary(times, tokens)
        flops = forward_flops(cfg, batch=bsz, qlen=cfg.tgt_len, mlen=mem_len, targets=y, streaming=True)["total"]
        for r in runners:
            ev[r.name]["flop_per_s"], ev[r.name]["dtype"] = flops * ev[r.name]["tok_per_s"] / tokens, r.dtype
            ev[r.name]["mfu"] = ev[r.name]["flop_per_s"] / peaks[r.dtype]
        res["eval"][str(mem_len)] = ev
        log(f"[{case_name}] eval mem_len {mem_len}: " + _fmt(ev))

    if opts.memory:
        res["memory"] = {}
        for r in train_runners:
            if opts.device.startswith("cuda"):
                if r.is_hf:  # HF keeps its memory length as model state; txl's training uses the config's
                    r.model.reset_memory_length(cfg.mem_len)
                res["memory"][r.name] = peak_memory_cuda(r, x, y)
            else:
                res["memory"][r.name] = peak_memory_cpu(case_name, r.name, opts.dtype, bsz)
        if use_hf:
            hf_peak = res["memory"]["hf"]["step_peak_mib"]
            for r in train_runners:
                if not r.is_hf:
                    res["memory"][_ratio_key(r.name)] = res["memory"][r.name]["step_peak_mib"] / hf_peak
        log(f"[{case_name}] train peak memory (MiB above pre-step): "
            + ", ".join(f"{k} {v['step_peak_mib']:.0f}" for k, v in res["memory"].items() if isinstance(v, dict))
            + "".join(f", {t}" for t in _ratio_texts(res["memory"])))
    return res


def _fmt(summary: dict[str, Any]) -> str:
    parts = [f"{k} {v['tok_per_s']:,.0f} tok/s (MFU {v.get('mfu', 0):.1%})" for k, v in summary.items()
             if isinstance(v, dict)]
    parts += [f"{t}x" for t in _ratio_texts(summary)]
    return ", ".join(parts)


def run_benchmark(opts: BenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every case of ``opts``; returns a JSON-serializable dict (see :func:`to_markdown`)."""
    if opts.threads:
        torch.set_num_threads(opts.threads)
    peaks, box = gemm_peaks(opts.device), machine(opts.device)
    env = {"torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
           "device": device_description(opts.device), "load_average": box["load_average"], "machine": box,
           "matmul_peak_gflops": peaks[opts.dtype] / 1e9, "matmul_peaks_gflops": {k: v / 1e9 for k, v in peaks.items()},
           "flops": STRICT, "optimizer": OPTIMIZERS}
    if hf_available():
        import transformers

        env["transformers"] = transformers.__version__
    log(f"{env['device']}; load average {env['load_average']}; GEMM peaks fp32 {peaks['fp32'] / 1e9:,.1f}, bf16 "
        f"{peaks['bf16_gemm'] / 1e9:,.1f} GFLOP/s (bf16 {peaks['bf16_gemm'] / peaks['fp32']:.2f}x), "
        f"{env['threads']} threads, torch {torch.__version__}")
    results = [run_case(name, opts, peaks, log) for name in opts.cases]
    # the limit: the best peaks of the run, measured again at its end (the load moves)
    peaks = {k: max(v, peaks[k]) for k, v in gemm_peaks(opts.device).items()}
    env.update(matmul_peak_gflops=peaks[opts.dtype] / 1e9, matmul_peaks_gflops={k: v / 1e9 for k, v in peaks.items()})
    _final_mfu(results, peaks)
    return {"options": dataclasses.asdict(opts), "env": env, "results": results}


def _final_mfu(results: list[dict[str, Any]], peaks: dict[str, float]) -> None:
    """Every row's MFU against the run's best peak of its precision, refused above 100 %
    (:func:`~transformer_xl.experiments.bench.yardstick.share`)."""
    for res in results:
        sections = [("training", res["train"]), ("GEMM skeleton", res.get("skeleton", {}))]
        for what, section in sections + [(f"evaluation at mem_len {m}", ev) for m, ev in res["eval"].items()]:
            for name, row in section.items():
                if isinstance(row, dict) and "flop_per_s" in row:
                    row["mfu"] = share(row["flop_per_s"], peaks[row["dtype"]], f"{res['case']} {name} {what} MFU")


def to_markdown(report: dict[str, Any], command: str) -> str:
    """A Markdown table of one report; every row carries the command that produced it. MFU only where the report
    counted FLOPs strictly (:mod:`~transformer_xl.experiments.bench.yardstick`; older files: a dash)."""
    opts, env = report["options"], report["env"]
    peaks = env.get("matmul_peaks_gflops", {opts["dtype"]: env["matmul_peak_gflops"]})
    strict = env.get("flops") == STRICT
    lines = [f"Device: {env['device']}, torch {env['torch']}, {env['threads']} threads, {opts['dtype']}"
             f"{', torch.compile (txl)' if opts['compile'] else ''}; GEMM peaks "
             + ", ".join(f"{k} {v:,.0f}" for k, v in peaks.items())
             + (" GFLOP/s (MFU: strict FLOPs against the peak of each row's precision)" if strict else
                " GFLOP/s (MFU not shown: measured before FLOPs were counted strictly)")
             + f"; load average {env.get('load_average', '-')}; transformers {env.get('transformers', '-')}; "
             + ("optimizer: txl " + env["optimizer"]["txl"] + ", HF " + env["optimizer"]["hf"] if "optimizer" in env
                else "optimizer: the same unfused torch.optim.Adam on both sides") + ".", "",
             "| case | measure | txl | HF | txl ÷ HF | txl MFU | command |", "|---|---|---|---|---|---|---|"]
    for res in report["results"]:
        rows = [("train tok/s", res["train"], "txl")]
        if RECOMPUTE in res["train"]:
            rows.append(("train tok/s, recompute", res["train"], RECOMPUTE))
        variants = [k for k, v in res["train"].items()
                    if k.startswith("txl-") and k != RECOMPUTE and isinstance(v, dict)]
        rows += [(f"train tok/s, {v[4:]}", res["train"], v) for v in variants]
        for m, ev in res["eval"].items():
            rows += [(f"eval tok/s, mem {m}", ev, "txl")] + [(f"eval tok/s, mem {m}, {v[4:]}", ev, v) for v in variants]
        rows += [(f"train tok/s, GEMM skeleton{'' if v == 'txl' else ', ' + v[4:]}", res["skeleton"], v)
                 for v, row in res.get("skeleton", {}).items() if v != "hf" and isinstance(row, dict)]
        for label, s, name in rows:
            hf = f"{s['hf']['tok_per_s']:,.0f}" if "hf" in s else "-"
            key = _ratio_key(name)
            ratio = f"**{s[key]:.2f}**" if key in s else "-"
            lines.append(f"| {res['case']} | {label} | {s[name]['tok_per_s']:,.0f} | {hf} | {ratio} | "
                         f"{format(s[name]['mfu'], '.1%') if strict else '–'} | `{command}` |")
        for name, row in res.get("skeleton", {}).items():
            if isinstance(row, dict) and "ceiling_ratio" in row:
                label = "train txl ÷ HF ceiling (txl's GEMM skeleton ÷ HF's step)"
                label += "" if name == "txl" else f", {name[4:]}"
                lines.append(f"| {res['case']} | {label} | | | **{row['ceiling_ratio']:.2f}** | | `{command}` |")
        if "memory" in res:
            m = res["memory"]
            hf = f"{m['hf']['step_peak_mib']:,.0f}" if "hf" in m else "-"
            for name, label in (("txl", "train peak MiB"), (RECOMPUTE, "train peak MiB, recompute")):
                if name not in m:
                    continue
                key = _ratio_key(name)
                ratio = f"**{m[key]:.2f}**" if key in m else "-"
                lines.append(f"| {res['case']} | {label} | {m[name]['step_peak_mib']:,.0f} | {hf} | {ratio} | "
                             f"| `{command}` |")
        if "max_abs_nll_diff" in res:
            lines.append(f"| {res['case']} | max abs NLL diff | {res['max_abs_nll_diff']:.1e} | | | | `{command}` |")
    return "\n".join(lines) + "\n"


def profile_train_step(case_name: str, impl: str = "txl", *, steps: int = 3, row_limit: int = 15,
                       batch: int | None = None, dtype: str = "fp32", compile: bool = False) -> str:
    """``torch.profiler`` table (self CPU time) of ``steps`` training steps of one implementation (txl compiled with
    ``compile``: its graphs are made in the two warm-up steps, outside the profile)."""
    from torch.profiler import ProfilerActivity, profile

    runner, x, y = setup(case_name, impl, device="cpu", dtype=dtype, compile=compile, batch=batch, seed=0)
    for _ in range(2):
        runner.train_step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.train_step(x, y)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
