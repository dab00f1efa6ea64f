"""Part e of the GPU check (:func:`train_resume`): ``txl train`` killed and resumed, as a user runs it.

``txl train --resume auto`` on the embedded WikiText-2 in bf16, once undisturbed and once SIGKILLed after a checkpoint
it wrote mid-run, then started again with the same command line (what a relaunch after a crash does). The losses the
resumed run logs after its resume point are compared with the undisturbed run's at the same steps
(:func:`compare_losses`). On the CPU a resume is bit-exact (``tests/train/test_state.py``): the check asks for equal
losses. On CUDA, kernels that accumulate with atomics are not deterministic from run to run (``txl train`` does not
turn on ``torch.use_deterministic_algorithms``): the difference is reported, with the drift the two runs already show
before the resume point for scale, and checked against :data:`CUDA_LOSS_TOL`.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.processes import last_line, stop, txl_command, txl_env

#: The largest |loss difference| (nats) between the resumed and the undisturbed run accepted on CUDA, where
#: non-deterministic kernels make two runs of the same command drift apart; a lost optimizer state, data position or
#: learning-rate schedule moves the loss by more (tenths of a nat at the demo's steps).
CUDA_LOSS_TOL = 0.05
#: Seconds kept back from the part's cap, to report what happened instead of being stopped by the driver.
MARGIN_S = 3.0

# The runs. GPU: the ``make demo`` model (cpu-small, 4 layers of 128, adaptive softmax) for 300 steps, a checkpoint
# every 100, killed once step 100 is on disk. Tiny (CPU): the ``tiny`` preset (2 layers of 32) on batches of 2 for
# 12 steps, a checkpoint every 3, one thread (seconds even where bf16 products are slow, on an AVX2-only CPU). Both
# validate only at their ends (the tiny run on a few tokens), with no final evaluation.
GPU_RUN = dict(preset="demo", max_step=300, save_interval=100, log_interval=5, eval_interval=100000)
TINY_RUN = dict(preset="tiny", max_step=12, batch_size=2, save_interval=3, log_interval=1, eval_interval=100000,
                eval_max_tokens=200)


def train_args(opts: CheckOptions, out_dir: Path) -> list[str]:
    """The one ``txl train`` command line (after ``train``) of every run of part e: with ``--resume auto`` it starts
    a run in ``out_dir`` or continues the one there."""
    run = TINY_RUN if opts.tiny else GPU_RUN
    args = ["--resume", "auto", "--out-dir", str(out_dir), "--device", opts.device, "--precision", "bf16",
            "--seed", str(opts.seed), "--no-progress", "--no-final-eval", "--keep-checkpoints", "2"]
    for key, value in run.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args + (["--threads", "1"] if opts.tiny else [])


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` (a torn last line, what a kill may leave, skipped)."""
    out = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def train_losses(records: list[dict[str, Any]], *, after: int = -1, upto: float = math.inf) -> dict[int, float]:
    """Step -> logged training loss of the ``train`` records with ``after < step <= upto``."""
    return {r["step"]: r["train_loss"] for r in records if r.get("kind") == "train" and after < r["step"] <= upto}


def compare_losses(reference: Mapping[int, float], other: Mapping[int, float]) -> dict[str, Any]:
    """How ``other`` (step -> loss) matches ``reference`` at the same steps: ``steps`` compared, the steps either
    lacks (``missing``), ``max_abs_diff`` (``None`` when nothing compares or a loss is not finite) and ``bit_exact``
    (the same steps, each loss equal to the bit; JSON keeps a float exactly)."""
    common = sorted(set(reference) & set(other))
    missing = sorted(set(reference) ^ set(other))
    diffs = [abs(other[s] - reference[s]) for s in common]
    max_diff = max(diffs) if diffs and all(math.isfinite(d) for d in diffs) else None
    exact = bool(common) and not missing and all(other[s] == reference[s] for s in common)
    return {"steps": len(common), "first_step": common[0] if common else None,
            "last_step": common[-1] if common else None, "missing": missing[:20], "max_abs_diff": max_diff,
            "bit_exact": exact}


def _run(cmd: list[str], env: dict[str, str], log: Path, deadline: float) -> tuple[int | None, float]:
    """Run ``cmd`` to its end (output to ``log``): its exit status (``None``: stopped at ``deadline``), seconds."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            code: int | None = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stop(proc)
            code = None
    return code, time.monotonic() - start


def _run_and_kill(cmd: list[str], env: dict[str, str], log: Path, run_dir: Path, deadline: float,
                  max_step: int) -> tuple[int | None, int | None, float]:
    """Start ``cmd`` and SIGKILL it once a checkpoint below ``max_step`` is on disk (a ``step_*`` directory: a
    checkpoint is written to a temporary name and renamed). Returns its exit status, the step of the checkpoint
    seen, seconds."""
    start = time.monotonic()
    ckpts, seen = run_dir / "checkpoints", None
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                steps = _checkpoint_steps(ckpts)
                if any(0 < s < max_step for s in steps):
                    seen = min(steps)
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.005)
            code = proc.wait(timeout=30) if seen is not None else proc.poll()
        finally:
            if proc.poll() is None:
                stop(proc)
    return code, seen, time.monotonic() - start


def _checkpoint_steps(ckpts: Path) -> list[int]:
    """The steps of the finished checkpoints in ``ckpts`` (``step_*``; one being written has a temporary name)."""
    names = [p.name for p in ckpts.glob("step_*")] if ckpts.is_dir() else []
    return [int(n[5:]) for n in names if n[5:].isdigit()]


def _environment(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run's ``environment`` event says about its arithmetic (precision, TF32)."""
    env = next((r for r in records if r.get("event") == "environment"), {})
    return {k: env[k] for k in ("device", "device_name", "torch", "precision", "float32_matmul_precision",
                                "cuda_matmul_tf32", "cudnn_tf32") if k in env}


def train_resume(opts: CheckOptions) -> dict[str, Any]:
    """Part e (module docstring): train undisturbed, train again killed after a checkpoint, resume; compare."""
    start = time.monotonic()
    deadline = start + min(opts.cap("e"), opts.time_left()) - MARGIN_S
    run = TINY_RUN if opts.tiny else GPU_RUN
    max_step = int(run["max_step"])
    result: dict[str, Any] = {"status": "failed", "device": opts.device, "precision": "bf16", "max_step": max_step,
                              "preset": run["preset"], "log_interval": run["log_interval"], "checks": []}
    if opts.cuda:
        result["cuda_deterministic_algorithms"] = False  # as `txl train` runs: no determinism flag is set
    tmp = Path(tempfile.mkdtemp(prefix="txl-check-e-"))
    keep = opts.out_dir / "e"
    keep.mkdir(parents=True, exist_ok=True)
    env = txl_env(opts, cache=tmp / "cache")
    full, killed = tmp / "full", tmp / "killed"
    try:
        opts.log(f"txl train {' '.join(train_args(opts, full))}")
        if why := _train(opts, full, env, keep / "full.log", deadline, result, "full_s", "the undisturbed run"):
            return _fail(result, why)
        ref = read_records(full)
        speeds = [r["tokens_per_s"] for r in ref if r.get("kind") == "train"][1:]
        result["tokens_per_s"] = round(statistics.median(speeds), 1) if speeds else None
        result["environment"] = _environment(ref)
        opts.log(f"undisturbed run of {max_step} steps in {result['full_s']:.1f} s; now the run to kill")
        code, seen, secs = _run_and_kill(txl_command("train", *train_args(opts, killed)), env, keep / "killed.log",
                                         killed, deadline, max_step)
        result["killed_s"] = round(secs, 2)
        if seen is None:
            return _fail(result, f"the run to kill {_ended(code)} before a checkpoint below step {max_step} was seen"
                         + last_line(keep / "killed.log"))
        result["killed_after_checkpoint"], result["killed_status"] = seen, code
        opts.log(f"SIGKILLed after the checkpoint of step {seen} appeared (status {code}); resuming")
        if why := _train(opts, killed, env, keep / "resumed.log", deadline, result, "resumed_s", "the resumed run"):
            return _fail(result, why)
        got = read_records(killed)
        at = next((r["step"] for r in got if r.get("event") == "resume"), None)
        if at is None:
            return _fail(result, "the second start of the killed run logged no resume event: it did not resume")
        result["resumed_at"] = at
        after = compare_losses(train_losses(ref, after=at), train_losses(got, after=at))
        before = compare_losses(train_losses(ref, upto=at), train_losses(got, upto=at))
        result.update(compared_steps=after["steps"], max_abs_diff=after["max_abs_diff"],
                      bit_exact=after["bit_exact"], missing_steps=after["missing"],
                      before_resume_max_abs_diff=before["max_abs_diff"], before_resume_bit_exact=before["bit_exact"])
        valid = compare_losses(*({r["step"]: r["valid_loss"] for r in rs if r.get("kind") == "valid" and r["step"] > at}
                                 for rs in (ref, got)))
        result.update(valid_steps=valid["steps"], valid_max_abs_diff=valid["max_abs_diff"])
        result["checks"] = _checks(opts, after)
        result["status"] = "ok" if all(c["ok"] for c in result["checks"]) else "failed"
        opts.log(f"resumed at step {at}; {after['steps']} steps compared, max |diff| {after['max_abs_diff']}"
                 f" ({'bit-exact' if after['bit_exact'] else 'not bit-exact'}; before the resume: "
                 f"{before['max_abs_diff']})")
        return result
    finally:
        for name in ("full", "killed"):
            if (tmp / name / "metrics.jsonl").is_file():
                shutil.copyfile(tmp / name / "metrics.jsonl", keep / f"{name}.metrics.jsonl")
        shutil.rmtree(tmp, ignore_errors=True)
        result["wall_s"] = round(time.monotonic() - start, 2)


def _checks(opts: CheckOptions, after: dict[str, Any]) -> list[dict[str, Any]]:
    """CPU: every loss after the resume bit-exact. CUDA: within :data:`CUDA_LOSS_TOL`."""
    ran = after["steps"] > 0 and not after["missing"]
    if not opts.cuda:
        return [{"name": "resumed losses equal the undisturbed run's, bit for bit", "ok": ran and after["bit_exact"],
                 "max_abs_diff": after["max_abs_diff"], "steps": after["steps"]}]
    diff = after["max_abs_diff"]
    within = ran and diff is not None and diff <= CUDA_LOSS_TOL
    return [{"name": f"resumed losses within {CUDA_LOSS_TOL} of the undisturbed run's (CUDA, non-deterministic "
                     "kernels)", "ok": within, "max_abs_diff": diff, "tol": CUDA_LOSS_TOL, "steps": after["steps"],
             "bit_exact": after["bit_exact"]}]


def _ended(code: int | None) -> str:
    if code is None:
        return "was stopped at the part's cap"
    return f"ended with status {code}" if code >= 0 else f"died of signal {-code}"


def _train(opts: CheckOptions, run_dir: Path, env: dict[str, str], log: Path, deadline: float,
           result: dict[str, Any], key: str, what: str) -> str | None:
    """One ``txl train`` of ``run_dir`` to its end, its seconds in ``result[key]``; why it failed, or None."""
    code, secs = _run(txl_command("train", *train_args(opts, run_dir)), env, log, deadline)
    result[key] = round(secs, 2)
    return None if code == 0 else f"{what} {_ended(code)}{last_line(log)}"


def _fail(result: dict[str, Any], why: str) -> dict[str, Any]:
    result.update(status="failed", error=why)
    result["checks"] = [{"name": "train, kill and resume ran", "ok": False, "error": why}]
    return result
