"""The driver of the GPU check: every part in a process of its own, under its time cap; the results in one JSON file
and a Markdown summary.

Each part is a function ``fn(opts: CheckOptions) -> dict`` named in :data:`PARTS` (imported in the part's process
only, so that a part whose module is missing or broken fails alone). The driver starts
``python -m transformer_xl.experiments.gpucheck.runner --child ...`` for it, with the import path of this process,
its stdout shared (progress lines, prefixed ``[part]``) and its stderr kept in ``OUT/logs/<part>.stderr.txt``; the
child writes the function's dict to a JSON file. A part that is still running at its cap (or at what is left of the
whole run's budget) is killed with its process group (a compile, a server) and reported ``timed_out``; one that
raised, crashed or ran out of memory is ``failed`` with the error's one line. A process per part also keeps one
part's CUDA state (an illegal address, a fragmented allocator, a compile cache) from another's figures.

A part's dict may hold ``checks``: ``[{"name", "ok", ...}]``, comparisons against a stated tolerance; the exit status
is 1 when any part did not end ``ok`` or any check is not ``ok``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformer_xl.experiments.gpucheck.options import PARTS as PART_NAMES
from transformer_xl.experiments.gpucheck.options import CheckOptions, print_flush

_PKG = "transformer_xl.experiments.gpucheck"
#: Part -> (title, ``module:function``).
PARTS: dict[str, tuple[str, str]] = {
    "a": ("correctness", f"{_PKG}.correctness:run"),
    "b": ("training throughput", f"{_PKG}.throughput:training"),
    "c": ("evaluation throughput", f"{_PKG}.throughput:evaluation"),
    "d": ("batch-1 decoding", f"{_PKG}.decoding:run"),
    "e": ("train, kill and resume", f"{_PKG}.train_check:train_resume"),
    "f": ("concurrent serving", f"{_PKG}.serve_check:serve_concurrent"),
}
assert tuple(PARTS) == PART_NAMES
#: Seconds a killed part's process group gets between SIGTERM and SIGKILL.
GRACE_S = 5.0
JSON_NAME, MD_NAME = "gpu_check.json", "gpu_check.md"
SCHEMA = 1


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (the first line of the message, at most 300 characters)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}"[:300] if msg else type(exc).__name__


def resolve(spec: str) -> Callable[..., dict[str, Any]]:
    """The function ``module:function`` names."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------------------- a process per call
def isolate(spec: str, opts: CheckOptions, cap: float, *, name: str, kwargs: dict[str, Any] | None = None,
            ) -> dict[str, Any]:
    """Run ``spec(opts, **kwargs)`` in a child process for at most ``cap`` seconds (module docstring). Returns
    ``{"status": "ok" | "failed" | "timed_out" | "skipped", "seconds", "error", "result"}`` (skipped: the part said
    so, with its ``reason``); never raises for the child's failures. ``name`` labels its progress lines and its
    stderr file (``OUT/logs/<name>.stderr.txt``)."""
    logs = opts.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    result_file, err_file = logs / f"{name}.result.json", logs / f"{name}.stderr.txt"
    result_file.unlink(missing_ok=True)
    start = time.monotonic()
    child = CheckOptions.from_dict({**opts.to_dict(), "deadline": start + cap})
    cmd = [sys.executable, "-m", f"{_PKG}.runner", "--child", spec, "--name", name, "--result", str(result_file),
           "--options", json.dumps(child.to_dict()), "--kwargs", json.dumps(kwargs or {})]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PYTHONUNBUFFERED": "1"}
    status, error = "ok", None
    with open(err_file, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, stdout=None, stderr=err, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=max(cap, 0.1))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            status, error, code = "timed_out", f"still running at its cap of {cap:.0f} s: stopped", None
        except BaseException:  # this process stopped (Ctrl-C, SIGTERM: exit_on_sigterm): no part left behind
            kill_group(proc)
            raise
    seconds = time.monotonic() - start
    result = _read_json(result_file)
    if status == "ok":
        if result is not None and "error" in result:
            status, error = "failed", result["error"]
        elif code != 0 or result is None:
            status = "failed"
            error = f"its process ended with status {code} without a result" + _last_line(err_file)
    part_result = (result or {}).get("result")
    if status == "ok" and isinstance(part_result, dict) and part_result.get("status") == "skipped":
        status, error = "skipped", part_result.get("reason") or "skipped"  # e.g. part f without the serve extra
    out = {"status": status, "seconds": round(seconds, 2), "cap_s": round(cap, 1), "error": error,
           "result": part_result}
    if result and result.get("traceback"):
        out["traceback"] = result["traceback"]
    return out


def exit_on_sigterm() -> None:
    """Make SIGTERM a ``SystemExit`` in this process, so that :func:`isolate` stops the part it waits for (a part
    runs in a session of its own: a signal to this process's group does not reach it)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, SIGKILL after :data:`GRACE_S`."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _last_line(path: Path) -> str:
    """``": <last non-empty line of path>"``, or ``""``."""
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:300]}" if lines else ""


def child_main(spec: str, name: str, result_file: str, options: str, kwargs: str) -> int:
    """A part's process: run ``spec`` and write ``{"result": ...}`` or ``{"error": ..., "traceback": ...}``."""
    opts = CheckOptions.from_dict(json.loads(options), log=lambda m: print_flush(f"[{name}] {m}"))
    try:
        payload: dict[str, Any] = {"result": resolve(spec)(opts, **json.loads(kwargs))}
        code = 0
    except BaseException as exc:  # a part's every failure is its result; the driver goes on
        payload, code = {"error": one_line(exc), "traceback": traceback.format_exc()[-4000:]}, 1
        opts.log(f"failed: {payload['error']}")
    tmp = Path(result_file + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_jsonable), encoding="utf-8")
    tmp.replace(result_file)
    return code


def _jsonable(obj: Any) -> Any:
    """What ``json.dumps`` writes for values it does not know: numpy and torch values as numbers and lists, the rest
    (paths, dtypes) as text."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


# ---------------------------------------------------------------------------------------------- the whole check
def environment(opts: CheckOptions) -> dict[str, Any]:
    """What every figure is read with: the device, torch, CUDA, the TF32 settings, the date, the command."""
    import torch

    from transformer_xl.devices import float32_matmul_settings
    from transformer_xl.train.precision import device_description

    try:
        name = device_description(opts.device)
    except Exception as exc:  # a broken CUDA install: the parts say more
        name = f"unknown ({one_line(exc)})"
    return {"device": opts.device, "device_name": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"), "tf32": float32_matmul_settings(), "command": opts.command, "tiny": opts.tiny,
            "seed": opts.seed, "compile": opts.use_compile, "budget_s": opts.budget}


def failed_checks(parts: dict[str, dict[str, Any]]) -> list[str]:
    """``"<part>: <check name>"`` of every check of every part that is not ``ok``."""
    out = []
    for name, part in parts.items():
        res = part.get("result")
        for check in res.get("checks", []) if isinstance(res, dict) else []:
            if not (isinstance(check, dict) and check.get("ok")):
                out.append(f"{name}: {check.get('name', '?') if isinstance(check, dict) else check}")
    return out


def run_check(opts: CheckOptions, registry: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """Run the parts of ``opts`` in order (each in its process, under ``min(cap, budget left)``), write
    ``gpu_check.json`` and ``gpu_check.md`` into ``opts.out_dir`` and return the report."""
    from transformer_xl.experiments.gpucheck.report import to_markdown

    registry = PARTS if registry is None else registry
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    report: dict[str, Any] = {"schema": SCHEMA, "environment": environment(opts), "parts": {}}
    env = report["environment"]
    opts.log(f"gpu check on {env['device_name']} (torch {env['torch']}, CUDA {env['cuda']}); parts "
             f"{', '.join(opts.parts)}; budget {opts.budget:.0f} s")
    for name in opts.parts:
        title, spec = registry[name]
        left = opts.budget - (time.monotonic() - start)
        if left < 1:
            part = {"status": "skipped", "seconds": 0.0, "cap_s": 0.0, "error": "no time left in the budget",
                    "result": None}
        else:
            cap = min(opts.cap(name), left)
            opts.log(f"part {name} ({title}): cap {cap:.0f} s")
            part = isolate(spec, opts, cap, name=name)
        part = {"title": title, **part}
        report["parts"][name] = part
        opts.log(f"part {name} ({title}): {part['status']} in {part['seconds']:.1f} s"
                 + (f" - {part['error']}" if part["error"] else ""))
        _write(opts, report, start, to_markdown)  # after every part: a run stopped from outside keeps what it did
    report = _write(opts, report, start, to_markdown)
    opts.log(f"wrote {opts.out_dir / JSON_NAME} and {opts.out_dir / MD_NAME}: "
             + ("all parts ok" if report["ok"] else f"NOT OK ({', '.join(report['problems'])})"))
    return report


def _write(opts: CheckOptions, report: dict[str, Any], start: float,
           to_markdown: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    parts = report["parts"]
    report["failed_checks"] = failed_checks(parts)
    report["problems"] = [f"{n}: {p['status']}" for n, p in parts.items() if p["status"] != "ok"] + \
        report["failed_checks"]
    report["ok"] = not report["problems"]
    report["total_s"] = round(time.monotonic() - start, 1)
    for name, text in ((JSON_NAME, json.dumps(report, indent=1, default=_jsonable)), (MD_NAME, to_markdown(report))):
        tmp = opts.out_dir / f".{name}.tmp"
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(opts.out_dir / name)
    return report


# ---------------------------------------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=(
        "The prepared GPU check of txl: correctness on the device, training and evaluation throughput of NVIDIA's "
        "Transformer-XL configurations, batch-1 decoding, train-kill-resume and concurrent serving; every part "
        "under a time cap, results in OUT/gpu_check.json and OUT/gpu_check.md. See "
        "transformer_xl.experiments.gpucheck."))
    p.add_argument("--out", required=True, type=Path, help="directory of the results")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny models and a few steps (a CPU run of seconds)")
    p.add_argument("--parts", default=",".join(PART_NAMES), help="comma-separated parts to run (default: all)")
    p.add_argument("--cap", action="append", default=[], metavar="PART=SECONDS", help="a part's time cap")
    p.add_argument("--budget", type=float, default=None, help="seconds the whole check may take")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the torch.compile rows (default: yes, no with --tiny)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def options_from_args(args: argparse.Namespace, command: str) -> CheckOptions:
    """:class:`CheckOptions` of the parsed command line (a one-line ``ValueError`` for a bad value)."""
    caps = {}
    for item in args.cap:
        part, sep, secs = item.partition("=")
        try:
            caps[part.strip()] = float(secs)
        except ValueError:
            raise ValueError(f"--cap takes PART=SECONDS, got {item!r}") from None
        if not sep:
            raise ValueError(f"--cap takes PART=SECONDS, got {item!r}")
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    return CheckOptions(device=args.device, tiny=args.tiny, out_dir=args.out, parts=parts, seed=args.seed, caps=caps,
                        budget_s=args.budget, compile=args.compile, command=command)


def main(argv: Sequence[str] | None = None) -> int:
    """``benchmarks/gpu_check.py``: run the check; 0 when every part is ok and within tolerance, else 1 (2: bad
    arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    exit_on_sigterm()
    try:
        opts = options_from_args(args, "python benchmarks/gpu_check.py " + shlex.join(argv))
    except ValueError as exc:
        print(f"gpu_check.py: {exc}", file=sys.stderr)
        return 2
    if opts.cuda and not _cuda_available():
        print(f"gpu_check.py: device {opts.device} asked for but CUDA is not available: run it on a GPU machine, "
              "or give --device cpu --tiny", file=sys.stderr)
        return 2
    return 0 if run_check(opts)["ok"] else 1


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _child_cli(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser()
    for flag in ("--child", "--name", "--result", "--options", "--kwargs"):
        p.add_argument(flag, required=True)
    a = p.parse_args(argv)
    exit_on_sigterm()  # a part that starts processes of its own (part b's compiled rows) stops them too
    return child_main(a.child, a.name, a.result, a.options, a.kwargs)


if __name__ == "__main__":
    sys.exit(_child_cli(sys.argv[1:]))
