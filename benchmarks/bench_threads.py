"""Training and generation tokens/s against ``--threads``, on an idle machine and beside CPU hogs.

Everything runs through the ``txl`` command as a user would:

* a small model: ``txl train --preset wt2-cpu --max-step BASE_STEPS`` (its quality does not matter for speed);
* training: ``txl train --preset wt2-cpu --max-step STEPS --log-interval 1 --threads T``; the figure is the
  median ``tokens_per_s`` of ``metrics.jsonl`` with the first step (warm-up) left out;
* generation: ``txl generate MODEL --greedy --max-new-tokens N --threads T``, wall time of N new tokens minus the
  wall time of 1 new token (same start-up and prompt): ``(N - 1) / (t_N - t_1)`` tokens/s;
* "busy": HOGS background processes running ``while True: pass`` (killed afterwards).

The load average (``os.getloadavg()``) is printed with each row: other jobs may share the machine. Usage::

    python benchmarks/bench_threads.py --threads 1,2 --hogs 0,1 --steps 60 --base-steps 100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

TXL = [sys.executable, "-m", "transformer_xl"]


def _txl(*args: str) -> float:
    """Run ``txl ARGS`` (output discarded); its wall seconds."""
    start = time.perf_counter()
    subprocess.run([*TXL, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _train(out: Path, steps: int, threads: int) -> None:
    _txl("train", "--preset", "wt2-cpu", "--max-step", str(steps), "--eval-interval", "100000", "--no-final-eval",
         "--eval-max-tokens", "200", "--save-interval", "100000", "--log-interval", "1", "--out-dir", str(out),
         "--threads", str(threads))


def train_tokens_per_s(root: Path, steps: int, threads: int) -> float:
    """Median training tokens/s of a fresh ``steps``-step wt2-cpu run, the first step left out."""
    out = Path(tempfile.mkdtemp(dir=root)) / "run"
    _train(out, steps, threads)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in rows if r["kind"] == "train" and r["step"] > 1)


def generate_tokens_per_s(model: Path, new_tokens: int, threads: int) -> float:
    """Generation tokens/s: ``new_tokens - 1`` over the extra wall time of ``new_tokens`` against 1 token."""
    def wall(n: int) -> float:
        return _txl("generate", str(model), "--greedy", "--prompt", "the", "--max-new-tokens", str(n),
                    "--threads", str(threads))

    return (new_tokens - 1) / max(wall(new_tokens) - wall(1), 1e-9)


@contextlib.contextmanager
def hogs(n: int) -> Iterator[None]:
    """``n`` background processes spinning a CPU each, ended (by their id) on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts (default: 1,2)")
    parser.add_argument("--hogs", default="0,1", help="numbers of background CPU hogs (default: 0,1)")
    parser.add_argument("--steps", type=int, default=60, help="training steps timed per row (default: 60)")
    parser.add_argument("--base-steps", type=int, default=100, help="training steps of the generating model")
    parser.add_argument("--new-tokens", type=int, default=200, help="generated tokens (default: 200)")
    parser.add_argument("--work-dir", help="where runs go (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="txl-bench-threads-"))
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model"
    if not (model / "final").is_dir():
        _train(model, args.base_steps, max(int(t) for t in args.threads.split(",")))
    lines = [f"cores available: {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}"
             f"; wt2-cpu, {args.steps} training steps per row, {args.new_tokens} generated tokens",
             "", "| background hogs | threads | load avg (1 min) before | train tokens/s | generate tokens/s |",
             "|---:|---:|---:|---:|---:|"]
    for n_hogs in (int(h) for h in args.hogs.split(",")):
        with hogs(n_hogs):
            for threads in (int(t) for t in args.threads.split(",")):
                load = os.getloadavg()[0]
                train = train_tokens_per_s(root, args.steps, threads)
                gen = generate_tokens_per_s(model / "final", args.new_tokens, threads)
                lines.append(f"| {n_hogs} | {threads} | {load:.2f} | {train:,.0f} | {gen:,.1f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
