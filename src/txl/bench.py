"""Throughput benchmark: txl against Hugging Face TransfoXL on the same configs, in the same run.

``run_benchmark(BenchOptions(...))`` measures, for every case:

* the outputs of both models (same weights, converted with :mod:`txl.convert`, dropout off): max |NLL diff|;
* training tokens/s: forward + backward + optimizer step (the same ``torch.optim.Adam`` on both sides),
  memories carried from step to step;
* evaluation tokens/s (``no_grad``, NLL of every token) at each requested ``mem_len``;
* peak training memory: on CPU the resident-set high-water mark of a fresh child process during the
  first training steps, above its RSS just before them (model, data and imports excluded, optimizer
  state and gradients included); on CUDA ``torch.cuda.max_memory_allocated``;
* model FLOPs utilization against the fp32 (or bf16) matmul peak measured in the same run.

Timings alternate between the two implementations (``repeats`` rounds of ``steps`` steps each) and the
ratio reported is the median of the per-round ratios, because absolute numbers on shared machines
drift by tens of percent within minutes. Hugging Face ``transformers`` (4.35-4.57, where TransfoXL
lives under ``models.deprecated``) is an optional, test-only dependency: without it only txl is timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from txl.adaptive import LogUniformSampler
from txl.config import TXLConfig
from txl.convert import to_hf_state_dict
from txl.errors import ConfigError
from txl.model import TransformerXLLM
from txl.presets import enwik8_base, wt103_base

# ---------------------------------------------------------------------------------------------- cases


@dataclass
class BenchCase:
    """A model config and the batch size to time it with (``tgt_len``/``mem_len`` come from the config)."""

    name: str
    config: TXLConfig
    batch_size: int


def _cpu_char(**kw: Any) -> TXLConfig:
    base = dict(n_token=204, n_layer=4, n_head=8, d_model=256, d_head=32, d_inner=1024, dropout=0.1,
                dropatt=0.0, tgt_len=128, mem_len=128)
    return TXLConfig(**{**base, **kw})


#: Case name -> (config factory, batch size). ``char``/``word`` are the issue's CPU configs; the
#: ``*-base`` ones are the paper's base models with the official run scripts' batch sizes (for a GPU).
CASES: dict[str, tuple[Callable[[], TXLConfig], int]] = {
    "char": (_cpu_char, 8),
    "word": (lambda: _cpu_char(n_token=33278, cutoffs=[2000, 10000], div_val=4, tie_projs=[False, True, True]), 8),
    "enwik8-base": (enwik8_base, 22),
    "wt103-base": (wt103_base, 60),
}


#: Name of the txl runner that trains with ``TransformerXLLM.recompute`` (``BenchOptions.recompute``).
RECOMPUTE = "txl-recompute"


def bench_case(name: str) -> BenchCase:
    if name not in CASES:
        raise ConfigError(f"unknown benchmark case {name!r}; known: {', '.join(CASES)}")
    factory, batch = CASES[name]
    return BenchCase(name, factory(), batch)


@dataclass
class BenchOptions:
    """What :func:`run_benchmark` measures (defaults: the issue's CPU settings)."""

    cases: list[str] = field(default_factory=lambda: ["char", "word"])
    eval_mem_lens: list[int] = field(default_factory=lambda: [128, 512, 1600])
    steps: int = 3  # timed steps per round
    repeats: int = 5  # interleaved rounds (the ratio is the median of per-round ratios)
    warmup: int = 2
    device: str = "cpu"
    dtype: str = "fp32"  # "fp32" or "bf16" (autocast, for both implementations)
    compile: bool = False  # torch.compile our model (Hugging Face's stays eager)
    threads: int | None = None  # torch.set_num_threads; None keeps torch's default
    hf: bool = True  # also time Hugging Face TransfoXL when transformers is installed
    memory: bool = True  # peak training memory (CPU: one child process per measurement)
    batch_size: int | None = None  # override the cases' batch size
    seed: int = 0
    recompute: bool = False  # also time/measure txl training with TransformerXLLM.recompute (runner "txl-recompute")


# ---------------------------------------------------------------------------------------------- models


@contextlib.contextmanager
def hf_type_as_patch() -> Iterator[None]:
    """transformers 4.35-4.57 TransfoXL calls ``Tensor.type_as(dtype=...)``, which torch rejects."""
    original = torch.Tensor.type_as

    def type_as(self, other=None, dtype=None):
        return self.to(dtype) if other is None else original(self, other)

    torch.Tensor.type_as = type_as  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.type_as = original  # type: ignore[method-assign]


def _hf_module():
    try:
        from transformers.models.deprecated.transfo_xl import modeling_transfo_xl
    except ImportError:
        return None
    return modeling_transfo_xl


def hf_available() -> bool:
    return _hf_module() is not None


def build_hf(model: TransformerXLLM):
    """Hugging Face ``TransfoXLLMHeadModel`` with the weights of ``model`` (attn_type 0)."""
    mod = _hf_module()
    if mod is None:
        raise ConfigError("Hugging Face transformers (4.35-4.57, with TransfoXL) is not installed")
    from transformers.models.deprecated.transfo_xl import TransfoXLConfig

    cfg = model.built_config
    hf_cfg = TransfoXLConfig(
        vocab_size=cfg.n_token, cutoffs=cfg.cutoffs, d_model=cfg.d_model, d_embed=cfg.d_embed,
        n_head=cfg.n_head, d_head=cfg.d_head, d_inner=cfg.d_inner, div_val=cfg.div_val,
        pre_lnorm=cfg.pre_lnorm, n_layer=cfg.n_layer, mem_len=cfg.mem_len, clamp_len=cfg.clamp_len,
        same_length=cfg.same_length, attn_type=0, sample_softmax=-1, adaptive=bool(cfg.cutoffs),
        dropout=cfg.dropout, dropatt=cfg.dropatt, untie_r=cfg.untie_r, layer_norm_epsilon=1e-5,
        tie_projs=cfg.tie_projs + [False] * (len(cfg.cutoffs) + 1 - len(cfg.tie_projs)),
        tie_word_embeddings=cfg.tie_weight,
    )
    hf = mod.TransfoXLLMHeadModel(hf_cfg)
    state = to_hf_state_dict(model)
    if not cfg.untie_r:  # HF also lists the shared u, v under every layer
        for i in range(cfg.n_layer):
            for key in ("r_w_bias", "r_r_bias"):
                state[f"transformer.layers.{i}.dec_attn.{key}"] = state[f"transformer.{key}"]
    hf.load_state_dict(state, strict=True)
    return hf


class _Runner:
    """One implementation's train/eval step with its memories carried between calls."""

    def __init__(self, name: str, model: torch.nn.Module, *, device: str, dtype: str, compile: bool) -> None:
        self.name, self.model, self.device = name, model.to(device), device
        self.is_hf = name == "hf"
        self.autocast = dtype == "bf16"
        self.fn = torch.compile(model) if compile else model
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.mems: list[torch.Tensor] | None = None

    def _ctx(self):
        stack = contextlib.ExitStack()
        if self.autocast:
            stack.enter_context(torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16))
        if self.is_hf:
            stack.enter_context(hf_type_as_patch())
        return stack

    def forward(self, x: torch.Tensor, y: torch.Tensor, mems, mem_kv: list[torch.Tensor] | None = None):
        with self._ctx():
            if self.is_hf:  # HF's public API: labels = input_ids, shifted inside (Q - 1 predictions)
                out = self.fn(input_ids=x, labels=x, mems=mems)
                return out.loss, out.mems
            out = self.fn(x, y, mems, mem_kv=mem_kv)
            return out.loss, out.mems

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        loss, self.mems = self.forward(x, y, self.mems)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def set_eval_mem(self, mem_len: int, batch: int, gen: torch.Generator) -> None:
        """Switch to evaluation with full memories of ``mem_len`` random states (steady state)."""
        self.model.eval()
        model = self.model
        if self.is_hf:
            model.reset_memory_length(mem_len)
            shape, n = (mem_len, batch, model.config.d_model), model.config.n_layer
        else:
            model.reset_length(mem_len=mem_len)
            shape, n = (batch, mem_len, model.config.d_model), model.config.n_layer + 1
        self.eval_mems = [torch.randn(shape, generator=gen).to(self.device) for _ in range(n)]
        self.eval_kv = None
        if not self.is_hf:  # txl evaluates with its memory key/value cache (as txl.evaluate): build it once
            x = torch.zeros(batch, model.config.tgt_len, dtype=torch.long, device=self.device)
            with torch.no_grad(), self._ctx():
                out = self.fn(x, None, self.eval_mems, mem_kv=[])
            self.eval_mems, self.eval_kv = out.mems, out.mem_kv

    def eval_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One segment over full memories (steady state: the memories are not advanced)."""
        with torch.no_grad():
            self.forward(x, y, self.eval_mems, mem_kv=self.eval_kv)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _zipf_tokens(n_token: int, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Token ids drawn from a Zipfian (log-uniform) law, so adaptive-softmax clusters fill as in text."""
    dist = LogUniformSampler(n_token, 1).dist
    return torch.multinomial(dist, math.prod(shape), replacement=True, generator=gen).view(shape)


# ---------------------------------------------------------------------------------------------- FLOPs


def model_flops(cfg: TXLConfig, *, batch: int, qlen: int, mlen: int, targets: torch.Tensor | None,
                streaming: bool = False) -> float:
    """Matmul FLOPs of one forward segment (2 per multiply-add), counting the math, not any implementation.

    Per layer: ``W_q`` on the segment, ``W_k, W_v`` on memory + segment, ``W_kR`` on the ``K`` position
    rows, the three ``[Q, K]`` score/value products, ``W_o`` and the feed-forward. Plus the adaptive
    input projections and the (adaptive) softmax: the head for every target, a tail for those in it.
    ``streaming`` (evaluation of a long text): ``W_k, W_v`` only on the segment, since every memory
    position was projected once already, when it was a segment token (the work a stream really needs;
    an implementation that projects the memory again does more).
    """
    d, hd, klen, n = cfg.d_model, cfg.n_head * cfg.d_head, qlen + mlen, batch * qlen
    kv_rows = batch * (qlen if streaming else klen)
    layer = 2 * (n * d * hd + kv_rows * d * 2 * hd + klen * d * hd + 3 * batch * qlen * klen * hd
                 + n * hd * d + 2 * n * d * cfg.d_inner)
    bounds = [0, *cfg.cutoffs, cfg.n_token]
    tgt = targets.reshape(-1) if targets is not None else torch.zeros(n, dtype=torch.long)
    out = 0.0
    for i in range(len(bounds) - 1):
        d_i = cfg.d_embed // cfg.div_val**i
        n_i = int(((tgt >= bounds[i]) & (tgt < bounds[i + 1])).sum()) if i else n
        proj = 2 * d * d_i if (cfg.div_val > 1 or cfg.d_embed != d) else 0
        v_i = bounds[i + 1] - bounds[i] + (len(cfg.cutoffs) if i == 0 else 0)
        out += n_i * (proj + 2 * d_i * v_i) + (n_i * proj if cfg.div_val > 1 else 0)  # softmax + input
    return cfg.n_layer * layer + out


def matmul_peak(device: str, dtype: str, n: int = 1024, reps: int = 5) -> float:
    """Best FLOP/s of an ``n x n x n`` matmul in this process (the MFU denominator)."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    n = 8192 if device.startswith("cuda") else n
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    best = float("inf")
    for _ in range(reps + 1):
        _sync(device)
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - t) / 3)
    return 2 * n**3 / best


# ---------------------------------------------------------------------------------------------- memory


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise OSError(f"{field_name} not in /proc/self/status")


def _memory_child(spec: str) -> None:
    """Entry point of the child process that measures one implementation's peak training memory."""
    args = json.loads(spec)
    runner, x, y = _setup(args["case"], args["impl"], device="cpu", dtype=args["dtype"], compile=False,
                          batch=args["batch"], seed=0)
    before = _rss_kib("VmRSS")
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset the high-water mark to the current RSS
    for _ in range(3):
        runner.train_step(x, y)
    print(json.dumps({"rss_before_mib": before / 1024, "peak_rss_mib": _rss_kib("VmHWM") / 1024}))


def _peak_memory_cpu(case: str, impl: str, dtype: str, batch: int) -> dict[str, float]:
    spec = json.dumps(dict(case=case, impl=impl, dtype=dtype, batch=batch))
    # A fixed mmap threshold makes glibc return every large freed block, so RSS follows live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    code = f"from txl.bench import _memory_child; _memory_child({spec!r})"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"memory probe failed for {impl}/{case}:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["step_peak_mib"] = out["peak_rss_mib"] - out["rss_before_mib"]
    return out


def _peak_memory_cuda(runner: _Runner, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    runner.mems = None
    runner.opt.state.clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(2):
        runner.train_step(x, y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"rss_before_mib": base / 2**20, "peak_rss_mib": peak / 2**20, "step_peak_mib": (peak - base) / 2**20}


# ---------------------------------------------------------------------------------------------- runs


def _setup(case_name: str, impl: str, *, device: str, dtype: str, compile: bool, batch: int | None,
           seed: int) -> tuple[_Runner, torch.Tensor, torch.Tensor]:
    case = bench_case(case_name)
    torch.manual_seed(seed)
    ours = TransformerXLLM(case.config)
    if impl == RECOMPUTE:
        ours.recompute(True)
    model = build_hf(ours) if impl == "hf" else ours
    bsz = batch or case.batch_size
    gen = torch.Generator().manual_seed(seed)
    seq = _zipf_tokens(case.config.n_token, (bsz, case.config.tgt_len + 1), gen).to(device)
    runner = _Runner(impl, model, device=device, dtype=dtype, compile=compile and impl == "txl")
    return runner, seq[:, :-1], seq[:, 1:]


def check_equal(ours: TransformerXLLM, hf, x: torch.Tensor, y: torch.Tensor, n_seg: int = 2) -> float:
    """Max |NLL difference| between txl (evaluation path: memory key/value cache) and HF over ``n_seg``
    segments (eval mode, empty first memory)."""
    ours.eval()
    hf.eval()
    bsz, qlen = x.shape
    d = ours.config.d_model
    hf_mems = [x.new_empty(0, bsz, d, dtype=torch.float32) for _ in range(ours.config.n_layer)]
    mems, kv, worst = None, [], 0.0
    with torch.no_grad(), hf_type_as_patch():
        for _ in range(n_seg):
            h = hf.transformer(input_ids=x, mems=hf_mems)
            hf_mems = h.mems
            hidden = torch.cat([h.last_hidden_state, h.last_hidden_state.new_zeros(bsz, 1, d)], dim=1)
            hf_nll = hf.crit(hidden, torch.cat([x[:, :1], y], dim=1), keep_order=True).view(bsz, qlen)
            out = ours(x, y, mems, mem_kv=kv)  # the evaluation path, with the memory key/value cache
            mems, kv = out.mems, out.mem_kv
            worst = max(worst, (out.nll - hf_nll).abs().max().item())
    return worst


def _time_interleaved(runners: list[_Runner], step: Callable[[_Runner], None], *, steps: int, repeats: int,
                      warmup: int, device: str) -> dict[str, list[float]]:
    """Seconds per step of each runner, ``repeats`` rounds, alternating runners (and their order)."""
    for r in runners:
        for _ in range(warmup):
            step(r)
    times: dict[str, list[float]] = {r.name: [] for r in runners}
    for rep in range(repeats):
        for r in runners if rep % 2 == 0 else runners[::-1]:
            _sync(device)
            t = time.perf_counter()
            for _ in range(steps):
                step(r)
            _sync(device)
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


def run_case(case_name: str, opts: BenchOptions, peak_flops: float,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """All measurements of one case (see the module docstring)."""
    case = bench_case(case_name)
    bsz = opts.batch_size or case.batch_size
    cfg = case.config
    use_hf = opts.hf and hf_available() and cfg.attn_type == 0 and cfg.sample_softmax <= 0
    if use_hf and opts.dtype == "bf16":
        log(f"[{case_name}] HF's softmax criterion fails under bf16 autocast (index_put dtype); txl only")
        use_hf = False
    ours, x, y = _setup(case_name, "txl", device=opts.device, dtype=opts.dtype, compile=opts.compile,
                        batch=bsz, seed=opts.seed)
    runners = [ours]
    res: dict[str, Any] = {"case": case_name, "config": cfg.to_dict(), "batch_size": bsz, "hf": use_hf}
    if use_hf:
        hf = build_hf(ours.model).to(opts.device)
        res["max_abs_nll_diff"] = check_equal(ours.model, hf, x, y)
        log(f"[{case_name}] max |nll(txl) - nll(hf)| = {res['max_abs_nll_diff']:.2e}")
        runners.append(_Runner("hf", hf, device=opts.device, dtype=opts.dtype, compile=False))
    tokens = bsz * cfg.tgt_len
    train_runners = list(runners)
    if opts.recompute:  # training only: without a gradient nothing is recomputed
        rc, _, _ = _setup(case_name, RECOMPUTE, device=opts.device, dtype=opts.dtype, compile=opts.compile,
                          batch=bsz, seed=opts.seed)
        train_runners.insert(1, rc)

    times = _time_interleaved(train_runners, lambda r: r.train_step(x, y), steps=opts.steps,
                              repeats=opts.repeats, warmup=opts.warmup, device=opts.device)
    res["train"] = _summary(times, tokens)
    flops = 3 * model_flops(cfg, batch=bsz, qlen=cfg.tgt_len, mlen=cfg.mem_len, targets=y)
    for r in train_runners:
        res["train"][r.name]["mfu"] = flops * res["train"][r.name]["tok_per_s"] / tokens / peak_flops
    log(f"[{case_name}] train: " + _fmt(res["train"]))

    res["eval"] = {}
    gen = torch.Generator().manual_seed(opts.seed + 1)
    for mem_len in opts.eval_mem_lens:
        for r in runners:
            r.set_eval_mem(mem_len, bsz, gen)
        times = _time_interleaved(runners, lambda r: r.eval_step(x, y), steps=opts.steps, repeats=opts.repeats,
                                  warmup=1, device=opts.device)
        ev = _summary(times, tokens)
        flops = model_flops(cfg, batch=bsz, qlen=cfg.tgt_len, mlen=mem_len, targets=y, streaming=True)
        for r in runners:
            ev[r.name]["mfu"] = flops * ev[r.name]["tok_per_s"] / tokens / peak_flops
        res["eval"][str(mem_len)] = ev
        log(f"[{case_name}] eval mem_len {mem_len}: " + _fmt(ev))

    if opts.memory:
        res["memory"] = {}
        for r in train_runners:
            if opts.device.startswith("cuda"):
                r.eval_mems = []
                if r.is_hf:
                    r.model.reset_memory_length(cfg.mem_len)
                else:
                    r.model.reset_length(mem_len=cfg.mem_len)
                res["memory"][r.name] = _peak_memory_cuda(r, x, y)
            else:
                res["memory"][r.name] = _peak_memory_cpu(case_name, r.name, opts.dtype, bsz)
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
    peak = matmul_peak(opts.device, opts.dtype)
    env = {"torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
           "device": torch.cuda.get_device_name() if opts.device.startswith("cuda") else platform.processor()
           or platform.machine(), "matmul_peak_gflops": peak / 1e9}
    if hf_available():
        import transformers

        env["transformers"] = transformers.__version__
    log(f"matmul peak ({opts.dtype}): {peak / 1e9:,.1f} GFLOP/s, {env['threads']} threads, torch {torch.__version__}")
    results = [run_case(name, opts, peak, log) for name in opts.cases]
    return {"options": dataclasses.asdict(opts), "env": env, "results": results}


def to_markdown(report: dict[str, Any], command: str) -> str:
    """A Markdown table of one report; every row carries the command that produced it."""
    opts, env = report["options"], report["env"]
    lines = [f"Device: {env['device']}, torch {env['torch']}, {env['threads']} threads, {opts['dtype']}"
             f"{', torch.compile (txl)' if opts['compile'] else ''}; matmul peak "
             f"{env['matmul_peak_gflops']:,.0f} GFLOP/s; transformers {env.get('transformers', '-')}.", "",
             "| case | measure | txl | HF | txl ÷ HF | txl MFU | command |", "|---|---|---|---|---|---|---|"]
    for res in report["results"]:
        rows = [("train tok/s", res["train"], "txl")]
        if RECOMPUTE in res["train"]:
            rows.append(("train tok/s, recompute", res["train"], RECOMPUTE))
        rows += [(f"eval tok/s, mem {m}", ev, "txl") for m, ev in res["eval"].items()]
        for label, s, name in rows:
            hf = f"{s['hf']['tok_per_s']:,.0f}" if "hf" in s else "-"
            key = _ratio_key(name)
            ratio = f"**{s[key]:.2f}**" if key in s else "-"
            lines.append(f"| {res['case']} | {label} | {s[name]['tok_per_s']:,.0f} | {hf} | {ratio} | "
                         f"{s[name]['mfu']:.1%} | `{command}` |")
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
                       batch: int | None = None) -> str:
    """``torch.profiler`` table (self CPU time) of ``steps`` training steps of one implementation."""
    from torch.profiler import ProfilerActivity, profile

    runner, x, y = _setup(case_name, impl, device="cpu", dtype="fp32", compile=False, batch=batch, seed=0)
    for _ in range(2):
        runner.train_step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.train_step(x, y)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
