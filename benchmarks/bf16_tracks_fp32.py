"""Does a bf16 run track the fp32 loss curve? The demo model trained twice, same seed and data, ``--precision fp32``
and ``--precision bf16``, and the largest gaps between the two ``metrics.jsonl`` curves.

Usage (train both, then compare; or compare two existing runs with ``--runs``)::

    python benchmarks/bf16_tracks_fp32.py --steps 300 --out /tmp/bf16-vs-fp32
    python benchmarks/bf16_tracks_fp32.py --runs RUN_FP32 RUN_BF16

Printed: the largest |train loss difference| over the logged steps (each a mean over ``log_interval`` steps),
the largest relative one, and the validation losses of both runs at every evaluation, with the load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from transformer_xl.train.metrics import read_metrics


def train(out: Path, precision: str, steps: int) -> Path:
    run = out / precision
    cmd = ["txl", "train", "--preset", "demo", "--max-step", str(steps), "--precision", precision, "--threads", "1",
           "--out-dir", str(run)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return run


def curves(run: Path, kind: str, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == kind}


def compare(fp32: Path, bf16: Path) -> None:
    a, b = curves(fp32, "train", "train_loss"), curves(bf16, "train", "train_loss")
    steps = sorted(set(a) & set(b))
    gaps = {s: b[s] - a[s] for s in steps}
    worst = max(steps, key=lambda s: abs(gaps[s]))
    print(f"logged steps compared: {len(steps)} ({steps[0]}..{steps[-1]})")
    print(f"largest |train loss gap| {abs(gaps[worst]):.4f} nats at step {worst} (fp32 {a[worst]:.4f}, bf16 "
          f"{b[worst]:.4f}, {abs(gaps[worst]) / a[worst]:.2%}); mean gap {sum(gaps.values()) / len(gaps):+.4f}")
    va, vb = curves(fp32, "valid", "valid_loss"), curves(bf16, "valid", "valid_loss")
    for s in sorted(set(va) & set(vb)):
        print(f"valid at step {s}: fp32 {va[s]:.4f}, bf16 {vb[s]:.4f}, gap {vb[s] - va[s]:+.4f}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", type=Path, default=Path("runs/bf16-vs-fp32"))
    p.add_argument("--runs", nargs=2, type=Path, metavar=("FP32_RUN", "BF16_RUN"))
    args = p.parse_args()
    runs = args.runs or [train(args.out, precision, args.steps) for precision in ("fp32", "bf16")]
    compare(*runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
