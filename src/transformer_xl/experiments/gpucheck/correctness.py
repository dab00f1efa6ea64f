"""Part a of the GPU check: does txl compute the same numbers on the device?

* **Forward, device vs CPU** (:func:`forward_agreement`): for every attention type (``attn_type`` 0-3, paper Table 6;
  :data:`transformer_xl.model.config.ATTN_TYPES`), ``same_length``, ``pre_lnorm`` with ``untie_r``, the full and the
  adaptive softmax, two segments of a stream (the second over the first's memory), in eval mode: the device's
  default (fast) path against the CPU's in fp32 with TF32 off, the losses and the second segment's log-probabilities
  within :data:`FP32_TOL` (relative: ``max |a - b| / max |b|``), and under bf16 autocast on the device the losses
  within :data:`BF16_LOSS_TOL` (relative). On ``--device cpu`` the CPU's default path is compared with the paper's
  plain formulas instead (:meth:`~transformer_xl.model.TransformerXLLM.reference`).
* **Gradients** (:func:`attention_paths_gradients`): the default path (and on CUDA FlexAttention, switched on with
  ``flex_attention()``) against ``reference()`` on the device, fp32, training mode without dropout, the summed loss
  of the two segments: every parameter's gradient within
  :data:`GRAD_TOL` of the reference's, relative to that gradient's largest entry.
* **Mixed-precision training** (:func:`amp_training`): a few Adam steps on one repeated batch in fp16 with a
  ``torch.amp.GradScaler`` and in bf16: every loss finite, the last below the first; the scaler's scale reported.
* **The test suite's GPU tests** (:func:`gpu_tests`): ``pytest -m gpu`` over the test files that hold ``mark.gpu``,
  in a process of its own under what is left of the part's cap; passed / failed / skipped counts (on a CPU they
  all skip).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.runner import kill_group, one_line
from transformer_xl.experiments.gpucheck.throughput import tf32
from transformer_xl.model import TransformerXLLM, TXLConfig

#: Relative tolerance of fp32 losses and log-probabilities, device vs CPU (or default vs reference).
FP32_TOL = 1e-5
#: Relative tolerance of a loss under bf16 autocast against fp32.
BF16_LOSS_TOL = 1e-2
#: Tolerance of a gradient of the default path against ``reference()``'s, relative to its largest entry.
GRAD_TOL = 1e-4
#: The weights' standard deviation: at the default 0.02 the outputs barely depend on the layers (a 1 % change of
#: the first layer's attention weights moves the log-probabilities by 1e-5 relative, the tolerance); at 0.1 by 1e-3
#: to 5e-3, while the default and reference paths differ by 1e-7 to 1e-6 on a CPU.
INIT_STD = 0.1
#: The case whose gradients are also checked through FlexAttention on CUDA (the memory's shifted index read by the
#: ``score_mod``; the tests marked ``gpu`` check more shapes).
FLEX_CASE = "attn0 adaptive"
#: The variants compared: name -> config changes.
CASES: dict[str, dict[str, Any]] = {
    "attn0 adaptive": {},
    "attn0 same_length": {"same_length": True},
    "attn0 pre_lnorm untie_r": {"pre_lnorm": True, "untie_r": True},
    "attn0 full softmax": {"cutoffs": (), "div_val": 1, "tie_projs": (False,)},
    "attn1": {"attn_type": 1},
    "attn2": {"attn_type": 2},
    "attn3": {"attn_type": 3},
}


def case_config(name: str, tiny: bool) -> tuple[TXLConfig, int]:
    """``(config, batch)`` of a case of :data:`CASES`: 2 layers of d_model 64 (tiny) or 4 of 256, no dropout,
    weights of standard deviation :data:`INIT_STD`."""
    size = dict(n_token=1000, n_layer=2, n_head=2, d_model=64, d_head=32, d_inner=128, tgt_len=8, mem_len=8) if tiny \
        else dict(n_token=2000, n_layer=4, n_head=4, d_model=256, d_head=64, d_inner=1024, tgt_len=32, mem_len=32)
    base = dict(cutoffs=(200, 500) if tiny else (400, 1000), div_val=2, tie_projs=(False, True, True), dropout=0.0,
                dropatt=0.0, init_std=INIT_STD, proj_init_std=INIT_STD / 2)
    return TXLConfig(**{**size, **base, **CASES[name]}), 2 if tiny else 4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|`` in float64 (``b`` the reference)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def two_segments(model: TransformerXLLM, seq: torch.Tensor, *, autocast: torch.dtype | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(losses [2], log_probs of the second segment)`` of ``model`` reading ``seq [B, 2 T + 1]`` as two segments."""
    t = model.config.tgt_len
    device = next(model.parameters()).device
    seq = seq.to(device)
    with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        first = model(seq[:, :t], seq[:, 1:t + 1])
        second = model(seq[:, t:2 * t], seq[:, t + 1:2 * t + 1], first.mems, return_log_probs=True)
    return torch.stack([first.loss, second.loss]).float(), second.log_probs.float()


def _models(name: str, opts: CheckOptions) -> tuple[TransformerXLLM, torch.Tensor, int]:
    cfg, batch = case_config(name, opts.tiny)
    torch.manual_seed(opts.seed)
    model = TransformerXLLM(cfg)
    gen = torch.Generator().manual_seed(opts.seed + 1)
    return model, torch.randint(0, cfg.n_token, (batch, 2 * cfg.tgt_len + 1), generator=gen), batch


def check(name: str, value: float, tol: float) -> dict[str, Any]:
    """A check of the report: ``value`` (a relative error) within ``tol``."""
    return {"name": name, "value": value, "tolerance": tol, "ok": bool(value <= tol)}


@torch.no_grad()
def forward_agreement(opts: CheckOptions) -> list[dict[str, Any]]:
    """Every case of :data:`CASES`, fp32 and bf16 (module docstring): one row per case."""
    rows = []
    for name in CASES:
        cpu, seq, _ = _models(name, opts)
        cpu.eval()
        if opts.cuda:
            ours, against = copy.deepcopy(cpu).to(opts.device), "cpu"
        else:
            ours, against = cpu, "reference"
            cpu = copy.deepcopy(cpu)
            cpu.reference(True)
        ref_loss, ref_lp = two_segments(cpu, seq)
        with tf32(False):
            loss, lp = two_segments(ours, seq)
        bf_loss, _ = two_segments(ours, seq, autocast=torch.bfloat16)
        row = {"case": name, "against": against, "loss": ref_loss.tolist(), "fp32_loss_rel": rel_err(loss, ref_loss),
               "fp32_logprob_rel": rel_err(lp, ref_lp), "bf16_loss": bf_loss.tolist(),
               "bf16_loss_rel": rel_err(bf_loss, ref_loss)}
        row["checks"] = [check(f"{name}: fp32 loss vs {against}", row["fp32_loss_rel"], FP32_TOL),
                         check(f"{name}: fp32 log-probs vs {against}", row["fp32_logprob_rel"], FP32_TOL),
                         check(f"{name}: bf16 autocast loss vs {against} fp32", row["bf16_loss_rel"], BF16_LOSS_TOL)]
        row["ok"] = all(c["ok"] for c in row["checks"])
        rows.append(row)
        opts.log(f"forward {name}: fp32 loss {row['fp32_loss_rel']:.1e}, log-probs {row['fp32_logprob_rel']:.1e} "
                 f"(tol {FP32_TOL:g}); bf16 loss {row['bf16_loss_rel']:.1e} (tol {BF16_LOSS_TOL:g}) vs {against}"
                 + ("" if row["ok"] else "  OUT OF TOLERANCE"))
    return rows


def _grads(model: TransformerXLLM, seq: torch.Tensor) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad(set_to_none=True)
    losses, _ = two_segments(model, seq)
    losses.sum().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def attention_paths_gradients(opts: CheckOptions) -> list[dict[str, Any]]:
    """Every case's gradients, each training attention path against the paper's plain formulas (``reference()``),
    on the device in fp32 with TF32 off (module docstring): the default path (on CUDA
    ``scaled_dot_product_attention`` with the position term as its bias) and, on CUDA, FlexAttention
    (``flex_attention()``: its backward runs only there, so this is where its gradients are checked); one row per
    case and path with the worst parameter."""
    rows = []
    for name in CASES:
        model, seq, _ = _models(name, opts)
        fast = model.to(opts.device)
        ref = copy.deepcopy(fast)
        ref.reference(True)
        paths = [("default", fast)]
        if opts.cuda and name == FLEX_CASE:  # one case: each shape is a compile of FlexAttention's two kernels
            flex = copy.deepcopy(fast)
            flex.flex_attention(True)
            paths.append(("flex", flex))
        with tf32(False):
            g_ref = _grads(ref, seq)
            for label, net in paths:
                rows.append(_gradient_row(opts, name, label, _grads(net, seq), g_ref))
    return rows


def _gradient_row(opts: CheckOptions, name: str, label: str, grads: dict[str, torch.Tensor],
                  g_ref: dict[str, torch.Tensor]) -> dict[str, Any]:
    if grads.keys() != g_ref.keys():
        raise RuntimeError(f"{name}: the {label} and reference paths give gradients to different parameters")
    errs = {n: rel_err(grads[n], g_ref[n]) for n in g_ref}
    worst = max(errs, key=errs.__getitem__)
    row = {"case": name, "paths": f"{label} vs reference", "params": len(errs), "worst_param": worst,
           "worst_rel": errs[worst]}
    row["checks"] = [check(f"{name}: gradients, {label} vs reference", errs[worst], GRAD_TOL)]
    row["ok"] = row["checks"][0]["ok"]
    opts.log(f"gradients {name} ({label}): worst {worst} {errs[worst]:.1e} (tol {GRAD_TOL:g})"
             + ("" if row["ok"] else "  OUT OF TOLERANCE"))
    return row


def amp_training(opts: CheckOptions, steps: int | None = None) -> list[dict[str, Any]]:
    """fp16 with a GradScaler and bf16: ``steps`` Adam steps (default 6 tiny, 12 full) on one repeated segment."""
    steps = steps or (6 if opts.tiny else 12)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        model, seq, _ = _models("attn0 adaptive", opts)
        model.to(opts.device).train()
        seq = seq.to(opts.device)
        t = model.config.tgt_len
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(opts.device_type, enabled=dtype == torch.float16)
        losses = []
        for _ in range(steps):
            with torch.autocast(opts.device_type, dtype=dtype):
                loss = model(seq[:, :t], seq[:, 1:t + 1]).loss
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        finite = all(torch.isfinite(torch.tensor(losses)).tolist())
        label = "fp16 + GradScaler" if dtype == torch.float16 else "bf16"
        row = {"precision": label, "steps": steps, "losses": losses,
               "scale": scaler.get_scale() if scaler.is_enabled() else None,
               "checks": [{"name": f"{label} training: losses finite", "ok": finite},
                          {"name": f"{label} training: loss decreases on a repeated batch",
                           "ok": finite and losses[-1] < losses[0], "value": [losses[0], losses[-1]]}]}
        row["ok"] = all(c["ok"] for c in row["checks"])
        rows.append(row)
        opts.log(f"{label}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {steps} steps"
                 + (f", scale {row['scale']:g}" if row["scale"] is not None else ""))
    return rows


# ---------------------------------------------------------------------------------------------- pytest -m gpu
def repo_root() -> Path:
    """The checkout this package runs from (``src/transformer_xl/...`` -> the directory above ``src``)."""
    return Path(__file__).resolve().parents[4]


def gpu_test_files(root: Path) -> list[Path]:
    """The test files under ``root/tests`` that hold ``mark.gpu``, sorted."""
    return sorted(p for p in (root / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text(encoding="utf-8", errors="replace"))


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed, failed, errors, skipped and the failing tests' ids of a pytest ``--junitxml`` file."""
    cases = ET.parse(path).getroot().iter("testcase")
    out: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in cases:
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
        key = {"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[kind]
        out[key] += 1
        if kind in ("failure", "error"):
            out["failures"].append(f"{case.get('classname')}::{case.get('name')}")
    return out


def gpu_tests(opts: CheckOptions, cap: float) -> dict[str, Any]:
    """``pytest -m gpu`` on :func:`gpu_test_files` for at most ``cap`` seconds (module docstring)."""
    root = repo_root()
    files = gpu_test_files(root) if (root / "tests").is_dir() else []
    if not files:
        return {"status": "no tests", "files": [], "checks": []}
    logs = opts.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    xml, out_file = logs / "pytest_gpu.xml", logs / "pytest_gpu.txt"
    xml.unlink(missing_ok=True)
    src = str(root / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    # no addopts: the machine may lack pytest-timeout/xdist/randomly (--strict-markers would refuse their markers)
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
           "-m", "gpu", f"--junitxml={xml}", *(str(f.relative_to(root)) for f in files)]
    start = time.monotonic()
    with open(out_file, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(cap, 1.0))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            code = None
    res: dict[str, Any] = {"files": [str(f.relative_to(root)) for f in files], "seconds": time.monotonic() - start,
                           "returncode": code, "log": str(out_file)}
    if code is None:
        res.update(status="timed_out", checks=[{"name": f"pytest -m gpu finished within {cap:.0f} s", "ok": False}])
        return res
    if xml.exists():
        res.update(junit_counts(xml))
    res["status"] = "ok" if code in (0, 5) and not res.get("failed") and not res.get("errors") else "failed"
    res["checks"] = [{"name": "pytest -m gpu: no failures", "ok": res["status"] == "ok",
                      "value": {k: res.get(k) for k in ("passed", "failed", "errors", "skipped")}}]
    return res


def run(opts: CheckOptions) -> dict[str, Any]:
    """Part a (module docstring): the GPU tests first, with at most half of the part's time on CUDA (their compiles
    take the longest), then the comparisons; a step that raises (a kernel the device refuses, say) is one failed
    check, and the others' results are kept."""
    left = opts.time_left() - 3.0 if opts.deadline is not None else 300.0
    tests = gpu_tests(opts, left / 2 if opts.cuda else left)
    opts.log(f"pytest -m gpu: {tests['status']}, " + ", ".join(
        f"{tests[k]} {k}" for k in ("passed", "failed", "errors", "skipped") if k in tests))
    out: dict[str, Any] = {}
    failed = []
    for key, step in (("forward", forward_agreement), ("gradients", attention_paths_gradients),
                      ("amp_training", amp_training)):
        try:
            out[key] = step(opts)
        except Exception as exc:  # recorded as a failed check; the next step still runs
            out[key] = []
            failed.append({"name": f"{key} ran", "ok": False, "error": one_line(exc)})
            opts.log(f"{key}: FAILED: {one_line(exc)}")
    checks = [c for key in out for row in out[key] for c in row["checks"]] + failed + tests["checks"]
    return {"tolerances": {"fp32_rel": FP32_TOL, "bf16_loss_rel": BF16_LOSS_TOL, "grad_rel": GRAD_TOL,
                           "relative_error": "max |a - b| / max |b|"},
            **out, "gpu_tests": tests, "checks": checks}
