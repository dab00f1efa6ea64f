"""Parts b and c of the GPU check: training and evaluation throughput of NVIDIA's Transformer-XL configurations.

**Training (b)**: NVIDIA's WT103 ``base`` (16 layers, d_model 512, 8 heads of 64, d_inner 2048, tgt = mem = 192,
batch 32, dropout 0.1, dropatt 0) and ``large`` (18 layers, d_model 1024, 16 heads of 64, d_inner 4096,
tgt = mem = 384, batch 16, div_val 4, dropout = dropatt = 0.2), both with the adaptive softmax over WikiText-103's
267,735 words (cutoffs 20000, 40000, 200000), on Zipf-distributed ids
(:func:`~transformer_xl.experiments.bench.runner.zipf_tokens`, seeded). A row is full training steps (forward over
the carried memory, backward, Adam, fused where it can be) in one of three modes: ``bf16`` (autocast, eager),
``bf16-compile`` (the same compiled whole by :func:`~transformer_xl.model.fastpath.compiled`, in a process of its own
under a cap; its first steps, the compiles, are reported as ``compile_s``) and ``tf32`` (fp32 weights and
activations with ``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32`` on, restored after). Target
tokens/s is ``batch x tgt_len`` per step over the timed steps (warm-up excluded, the device synchronized before each
clock read); MFU is :func:`~transformer_xl.experiments.bench.yardstick.train_flops` per second over the bf16 GEMM
peak measured in the same run (:func:`~transformer_xl.experiments.bench.yardstick.gemm_peak`; the TF32 row over the
TF32 peak). A row that runs out of device memory is recorded as ``oom`` and the others go on.

**Evaluation (c)**: the same models scoring segments without a gradient under bf16 autocast, through
:class:`~transformer_xl.model.Recurrence` and its inference cache (what ``txl eval`` runs), over full memories of
random states: ``base`` at tgt 64 / mem 640, ``large`` at tgt 128 / mem 1600, batch 1 and 32.

NVIDIA's A100 figures are printed beside them (:data:`NVIDIA_A100`), with the goals set for an H100 in bf16
(:data:`GOALS`). ``tiny`` runs 2-layer models of d_model 64 over a 1,000-word vocabulary for 2-3 steps.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from transformer_xl.experiments.bench.runner import zipf_tokens
from transformer_xl.experiments.bench.yardstick import gemm_peak, train_flops
from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.runner import GRACE_S, isolate, one_line
from transformer_xl.model import Recurrence, TransformerXLLM, TXLConfig, dispatch
from transformer_xl.model.fastpath import compile_unavailable, compiled
from transformer_xl.model.presets import wt103_base, wt103_large
from transformer_xl.train.schedule import FUSED_ADAM_DEVICES

#: NVIDIA's published figures (target tokens/s), for comparison only: measured on other hardware and code.
NVIDIA_A100: dict[str, Any] = {
    "source": "NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/Transformer-XL README: A100 40GB, 1 GPU",
    "train": {"base": {"tf32": 41527, "mixed": 59961}, "large": {"mixed": 25084}},
    "eval_note": "inference, TorchScript, fp16",
    "eval": {"base": {1: 6936, 32: 107082}, "large": {1: 11068, 32: 32162}},
}
#: Training tokens/s this check aims at on one H100 in bf16.
GOALS = {"base": 120000, "large": 50000}
MODELS = ("base", "large")
TRAIN_MODES = ("bf16", "tf32", "bf16-compile", "bf16-explicit", "bf16-flex")
#: The rows of the training attention paths (``base`` only: ``large`` has attention dropout, which FlexAttention
#: lacks), each against the ``bf16`` row, which runs the path ``dispatch.choose`` takes.
PATH_MODES = ("bf16-explicit", "bf16-flex")
EVAL_LENGTHS = {"base": (64, 640), "large": (128, 1600)}  # (tgt_len, mem_len)
EVAL_BATCHES = (1, 32)
_THIS = "transformer_xl.experiments.gpucheck.throughput"


def train_config(model: str, tiny: bool) -> tuple[TXLConfig, int]:
    """``(config, batch)`` of NVIDIA's ``base`` or ``large`` training run (module docstring), or its tiny stand-in."""
    if tiny:
        cfg = TXLConfig(n_token=1000, n_layer=2, n_head=2, d_model=64, d_head=32, d_inner=128, tgt_len=16,
                        mem_len=16, cutoffs=(200, 500), div_val=1 if model == "base" else 2,
                        tie_projs=(False, True, True), dropout=0.1)
        return cfg, 2
    if model == "base":
        return wt103_base(n_layer=16, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=192, mem_len=192,
                          dropout=0.1, dropatt=0.0, div_val=1), 32
    if model == "large":
        return wt103_large(tgt_len=384, mem_len=384), 16
    raise ValueError(f"unknown model {model!r}: {', '.join(MODELS)}")


def oom_error() -> type[BaseException]:
    """The exception of an allocation the device cannot satisfy (``torch.OutOfMemoryError``, its CUDA alias)."""
    return getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 products on CUDA (cuBLAS and cuDNN) on or off inside the block; the settings restored after. (The
    legacy ``allow_tf32`` flags only, as the rest of txl: torch 2.9+ objects to mixing them with ``fp32_precision``.)"""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def free(opts: CheckOptions) -> None:
    """Give the memory of the last row back (Python's cycles, then the CUDA allocator's cache)."""
    gc.collect()
    if opts.cuda:
        torch.cuda.empty_cache()


def peaks(opts: CheckOptions) -> dict[str, float]:
    """FLOP/s of the best square GEMM in bf16, fp32 and TF32 on the device, measured now (tiny: 256^3 only)."""
    sizes = (256,) if opts.tiny else None
    out = {"bf16": gemm_peak("bf16", opts.device, sizes), "fp32": gemm_peak("fp32", opts.device, sizes)}
    with tf32(True):
        out["tf32"] = gemm_peak("fp32", opts.device, sizes)
    return out


# ---------------------------------------------------------------------------------------------- training (b)
def train_row(opts: CheckOptions, model: str, mode: str) -> dict[str, Any]:
    """One training row (module docstring): tokens/s, seconds per step and FLOPs of a step, the warm-up's seconds
    (the compiles of ``bf16-compile``), the first and last losses. Raises on a failure (``training`` records it)."""
    if mode not in TRAIN_MODES:
        raise ValueError(f"unknown mode {mode!r}: {', '.join(TRAIN_MODES)}")
    cfg, batch = train_config(model, opts.tiny)
    compile_ = mode == "bf16-compile" and opts.use_compile
    if compile_ and (why := compile_unavailable(opts.device)):
        raise RuntimeError(f"torch.compile cannot run here: {why}")
    # warm-up: the first step (no memory yet) and the first over a full memory (new shapes); compiled, one more
    warm, timed = (3 if compile_ else 2), (2 if opts.tiny else (10 if model == "base" else 6))
    if opts.cuda:
        torch.cuda.reset_peak_memory_stats(opts.device)
    torch.manual_seed(opts.seed)
    net = TransformerXLLM(cfg).to(opts.device).train()
    gen = torch.Generator().manual_seed(opts.seed)
    segs = 4  # steps cycle over 4 segments of one Zipfian stream per row
    seq = zipf_tokens(cfg.n_token, (batch, segs * cfg.tgt_len + 1), gen).to(opts.device)
    if mode == "bf16-flex":
        net.flex_attention(True)
    fn = compiled(net) if compile_ else net
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, fused=(opts.device_type in FUSED_ADAM_DEVICES) or None)
    autocast = torch.autocast(opts.device_type, dtype=torch.bfloat16, enabled=mode != "tf32")
    mems: list[torch.Tensor] | None = None
    losses: list[torch.Tensor] = []

    def step(k: int) -> None:
        nonlocal mems
        i = (k % segs) * cfg.tgt_len
        with autocast:
            out = fn(seq[:, i:i + cfg.tgt_len], seq[:, i + 1:i + 1 + cfg.tgt_len], mems)
        mems = out.mems
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.detach())

    forced = training_path(dispatch.EXPLICIT) if mode == "bf16-explicit" else contextlib.nullcontext()
    with tf32(mode == "tf32"), forced:
        opts.sync()
        t0 = time.perf_counter()
        for k in range(warm):
            step(k)
        opts.sync()
        t1 = time.perf_counter()
        for k in range(warm, warm + timed):
            step(k)
        opts.sync()
        t2 = time.perf_counter()
    step_s = (t2 - t1) / timed
    flops = train_flops(cfg, batch=batch, qlen=cfg.tgt_len, mlen=cfg.mem_len, targets=seq[:, 1:1 + cfg.tgt_len])
    row = {"model": model, "mode": mode, "compiled": compile_, "batch": batch, "tgt_len": cfg.tgt_len,
           "mem_len": cfg.mem_len, "params": net.num_parameters(), "warmup_steps": warm, "timed_steps": timed,
           "warmup_s": t1 - t0, "step_s": step_s, "tok_per_s": batch * cfg.tgt_len / step_s,
           "train_flops": flops, "first_loss": losses[0].item(), "last_loss": losses[-1].item(),
           "fused_adam": opts.device_type in FUSED_ADAM_DEVICES}
    if compile_:
        row["compile_s"] = max(row["warmup_s"] - warm * step_s, 0.0)  # the warm-up beyond its steps' own time
    if opts.cuda:
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(opts.device) / 2**30
    return row


def _guarded_row(opts: CheckOptions, model: str, mode: str) -> dict[str, Any]:
    """:func:`train_row` in this process, an out-of-memory or other failure recorded as the row."""
    try:
        return {"status": "ok", **train_row(opts, model, mode)}
    except oom_error() as exc:
        return {"model": model, "mode": mode, "status": "oom", "error": one_line(exc)}
    except Exception as exc:
        return {"model": model, "mode": mode, "status": "failed", "error": one_line(exc)}
    finally:
        free(opts)


def _isolated_row(opts: CheckOptions, model: str, mode: str, min_s: float) -> dict[str, Any]:
    """:func:`train_row` in a process of its own, capped at what is left of the part (less a margin): a compile that
    takes too long is stopped and reported ``timed_out``; ``skipped`` when less than ``min_s`` is left."""
    cap = opts.time_left() - (2 * GRACE_S + 3.0)  # stopped (SIGTERM, then SIGKILL) before the part's own cap
    if cap < min_s:
        return {"model": model, "mode": mode, "status": "skipped",
                "error": f"{max(cap, 0):.0f} s left in the part, {min_s:.0f} s needed"}
    out = isolate(f"{_THIS}:train_row", opts, cap, name=f"b-{model}-{mode}", kwargs={"model": model, "mode": mode})
    if out["status"] == "failed" and "OutOfMemoryError" in (out["error"] or ""):
        out["status"] = "oom"
    return {"model": model, "mode": mode, **(out["result"] or {}), "status": out["status"], "error": out["error"],
            "process_s": out["seconds"]}


@contextlib.contextmanager
def training_path(path: dispatch.Path) -> Iterator[None]:
    """``dispatch.choose`` answering ``path`` whenever a gradient is recorded (its other rows as they are), to time a
    training path it would not take on this device (the explicit path, CUDA's before the fused one)."""
    real = dispatch.choose

    def forced(**facts: Any) -> dispatch.Choice:
        return dispatch.Choice(path) if facts["grad"] and not facts.get("plain") else real(**facts)

    dispatch.choose = forced
    try:
        yield
    finally:
        dispatch.choose = real


def compare_training(row: dict[str, Any], peak: dict[str, float]) -> dict[str, Any]:
    """``row`` with its MFU (over the TF32 peak for ``tf32``, else the bf16 one), NVIDIA's A100 figure of the same
    model and precision and the H100 goal beside it."""
    if row.get("status") != "ok":
        return row
    limit = peak["tf32"] if row["mode"] == "tf32" else max(peak["bf16"], peak["fp32"])
    row["mfu"] = row["train_flops"] / row["step_s"] / limit
    row["peak_flop_per_s"] = limit
    row["nvidia_a100_tok_per_s"] = NVIDIA_A100["train"][row["model"]].get("tf32" if row["mode"] == "tf32" else "mixed")
    if row["mode"] != "tf32":
        row["goal_tok_per_s"] = GOALS[row["model"]]
        row["meets_goal"] = row["tok_per_s"] >= GOALS[row["model"]]
    return row


def training(opts: CheckOptions) -> dict[str, Any]:
    """Part b (module docstring): the GEMM peaks, then every model's eager rows, then the compiled ones."""
    peak = peaks(opts)
    opts.log(f"GEMM peaks: bf16 {peak['bf16'] / 1e12:.1f}, fp32 {peak['fp32'] / 1e12:.1f}, "
             f"tf32 {peak['tf32'] / 1e12:.1f} TFLOP/s")
    rows = []
    order = [(m, mode) for mode in ("bf16", "tf32") for m in MODELS] + [("base", "bf16-explicit")]
    order += [(m, "bf16-compile") for m in MODELS] + [("base", "bf16-flex")]
    for model, mode in order:
        if mode == "bf16-flex" and not opts.cuda:
            row = {"model": model, "mode": mode, "status": "skipped", "error": "FlexAttention's backward runs on CUDA"}
        elif mode == "bf16-flex":  # its kernels compile: in a process of its own, as the compiled rows
            row = _isolated_row(opts, model, mode, min_s=20.0)
        elif mode == "bf16-compile" and not opts.use_compile:
            row = {"model": model, "mode": mode, "status": "skipped", "error": "not compiling (--tiny or --no-compile)"}
        elif mode == "bf16-compile":
            row = _isolated_row(opts, model, mode, min_s=5.0 if opts.tiny else 40.0)
        elif opts.time_left() < (1.0 if opts.tiny else 15.0):
            row = {"model": model, "mode": mode, "status": "skipped", "error": "no time left in the part"}
        else:
            row = _guarded_row(opts, model, mode)
        rows.append(compare_training(row, peak))
        opts.log(describe_train(rows[-1]))
    checks = [{"name": f"training {r['model']} {r['mode']}: losses finite", "ok": all(
        math.isfinite(r[k]) for k in ("first_loss", "last_loss"))} for r in rows if r.get("status") == "ok"]
    checks += [{"name": f"training {r['model']} {r['mode']} ran", "ok": False, "error": r["error"]}
               for r in rows if r.get("status") == "failed"]
    if not opts.tiny:  # above 100 % the peak is wrong (tiny rows on a busy CPU time too little to say)
        checks += [{"name": f"training {r['model']} {r['mode']}: MFU at most 100 % of the measured peak",
                    "ok": r["mfu"] <= 1.0, "value": r["mfu"]} for r in rows if r.get("status") == "ok"]
    return {"peaks_flop_per_s": peak, "rows": rows, "nvidia_a100": NVIDIA_A100, "goals_h100_bf16": GOALS,
            "checks": checks}


def describe_train(row: dict[str, Any]) -> str:
    """One progress line of a training row."""
    head = f"train {row['model']} {row['mode']}"
    if row.get("status") != "ok":
        return f"{head}: {row.get('status')} ({row.get('error')})"
    line = f"{head}: {row['tok_per_s']:,.0f} tok/s, {row['step_s'] * 1e3:.1f} ms/step, MFU {row['mfu'] * 100:.1f} %"
    if row.get("nvidia_a100_tok_per_s"):
        line += f" (NVIDIA A100: {row['nvidia_a100_tok_per_s']:,})"
    if "compile_s" in row:
        line += f"; compile {row['compile_s']:.1f} s"
    return line


# ---------------------------------------------------------------------------------------------- evaluation (c)
def eval_config(model: str, tiny: bool) -> TXLConfig:
    """The model of ``train_config`` with the evaluation's lengths (tiny: tgt 8, mem 32)."""
    cfg, _ = train_config(model, tiny)
    tgt, mem = (8, 32) if tiny else EVAL_LENGTHS[model]
    return cfg.replace(tgt_len=tgt, mem_len=mem, dropout=0.0, dropatt=0.0)


def eval_row(opts: CheckOptions, net: TransformerXLLM, model: str, batch: int) -> dict[str, Any]:
    """Tokens/s of scoring segments of ``net`` (bf16 autocast, no gradient) over a full memory of ``batch`` rows."""
    cfg = net.config
    warm, timed = (1, 2) if opts.tiny else (2, 8)
    gen = torch.Generator().manual_seed(opts.seed)
    seq = zipf_tokens(cfg.n_token, (batch, (warm + timed) * cfg.tgt_len + 1), gen).to(opts.device)
    dev_gen = torch.Generator(device=opts.device).manual_seed(opts.seed)
    mems = [torch.randn(batch, cfg.mem_len, cfg.d_model, device=opts.device, generator=dev_gen)
            for _ in range(cfg.n_layer + 1)]
    rec = Recurrence(net, cfg.lengths(), mems=mems)
    nll = []
    with torch.no_grad(), torch.autocast(opts.device_type, dtype=torch.bfloat16):
        for k in range(warm + timed):
            if k == warm:
                opts.sync()
                start = time.perf_counter()
            i = k * cfg.tgt_len
            nll.append(rec(seq[:, i:i + cfg.tgt_len], seq[:, i + 1:i + 1 + cfg.tgt_len]).loss)
        opts.sync()
    secs = (time.perf_counter() - start) / timed
    a100 = NVIDIA_A100["eval"][model].get(batch)
    return {"model": model, "batch": batch, "tgt_len": cfg.tgt_len, "mem_len": cfg.mem_len, "status": "ok",
            "timed_segments": timed, "segment_s": secs, "tok_per_s": batch * cfg.tgt_len / secs,
            "loss_finite": bool(torch.stack(nll).isfinite().all()), "nvidia_a100_tok_per_s": a100}


def evaluation(opts: CheckOptions) -> dict[str, Any]:
    """Part c (module docstring): each model, batch 1 and 32 (tiny: 1 and 2)."""
    rows = []
    for model in MODELS:
        net = None
        try:
            torch.manual_seed(opts.seed)
            net = TransformerXLLM(eval_config(model, opts.tiny)).to(opts.device).eval()
            for batch in (1, 2) if opts.tiny else EVAL_BATCHES:
                try:
                    rows.append(eval_row(opts, net, model, batch))
                except oom_error() as exc:
                    rows.append({"model": model, "batch": batch, "status": "oom", "error": one_line(exc)})
                free(opts)
                opts.log(describe_eval(rows[-1]))
        except oom_error() as exc:
            rows.append({"model": model, "batch": None, "status": "oom", "error": one_line(exc)})
            opts.log(describe_eval(rows[-1]))
        del net
        free(opts)
    checks = [{"name": f"evaluation {r['model']} batch {r['batch']}: losses finite", "ok": r["loss_finite"]}
              for r in rows if r["status"] == "ok"]
    return {"rows": rows, "precision": "bf16 autocast", "nvidia_a100": NVIDIA_A100, "checks": checks}


def describe_eval(row: dict[str, Any]) -> str:
    """One progress line of an evaluation row."""
    head = f"eval {row['model']} batch {row['batch']}"
    if row.get("status") != "ok":
        return f"{head}: {row.get('status')} ({row.get('error')})"
    a100 = row.get("nvidia_a100_tok_per_s")
    return (f"{head} (tgt {row['tgt_len']}, mem {row['mem_len']}): {row['tok_per_s']:,.0f} tok/s"
            + (f" (NVIDIA A100 TorchScript fp16: {a100:,})" if a100 else ""))
