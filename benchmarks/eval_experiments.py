"""Re-run the evidence of docs/ablations.md, docs/recl.md, docs/memory-sweep.md and docs/eval-speed.md under the
paper's protocols (issue 17), with the ``txl`` commands the docs list, and write the minutes each step took to
``OUT/minutes.json``.

Steps, in order:

* ``abl6``: Table 6, nine variants x ``--seeds`` (``txl experiment ablation --variants table6``), each seed in
  its own process when ``--jobs`` > 1 (then one more call aggregates the seeds: it trains nothing);
* ``abl10``: Table 10 at equal measured memory (``--variants table10``; the XL rows are reused from ``abl6``);
* ``recl``: RECL of the group Transformer-XL / Shaw et al. / no recurrence / vanilla (seed 0 of ``abl6``), the
  stride-1 window for every model, a uniform grid, a bootstrap over tokens;
* ``sweep``: the evaluation-memory sweep of seed 0's Transformer-XL (``same_length``);
* ``speed``: Table 9, cached and cache-free Transformer-XL against the vanilla window.

    TXL_DATA_DIR=/path/to/data python benchmarks/eval_experiments.py --out runs/issue17 --jobs 2 [--only abl6,recl]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STEPS = ("abl6", "abl10", "recl", "sweep", "speed")


def model_args(args: argparse.Namespace) -> list[str]:
    return ["--dataset", "wt2-char", "--model-preset", "tiny", "--n-layer", "4", "--d-model", "128", "--n-head", "4",
            "--d-inner", "512", "--dropout", "0", "--pre-lnorm", "--tgt-len", "32", "--steps", str(args.steps),
            "--batch-size", "32", "--lr", "2e-3", "--warmup", "200", "--eval-tokens", str(args.eval_tokens),
            "--device", args.device, "--no-progress", "--out", str(Path(args.out) / "abl")]


def commands(args: argparse.Namespace) -> dict[str, list[list[str]]]:
    out = Path(args.out)
    seed0 = out / "abl" / f"seed{args.seeds.split(',')[0]}"
    seeds = args.seeds.split(",")
    abl = {}
    for name, variants in (("abl6", "table6"), ("abl10", "table10")):
        per_seed = [["experiment", "ablation", *model_args(args), "--variants", variants, "--seeds", s] for s in seeds]
        abl[name] = [*per_seed, ["experiment", "ablation", *model_args(args), "--variants", variants, "--seeds",
                                 args.seeds]]
    return {
        **abl,
        "recl": [["recl", "--model", f"xl={seed0 / 'rec-ours-full'}", "--model", f"shaw={seed0 / 'rec-shaw-full'}",
                  "--model", f"no-recurrence={seed0 / 'norec-ours-full'}",
                  "--model", f"vanilla={seed0 / 'norec-alrfou-half'}", "--dataset", "wt2-char", "--split", "valid",
                  "--grid", args.recl_grid, "--tokens", str(args.recl_tokens), "--device", args.device,
                  "--no-progress", "--out", str(out / "recl")]],
        "sweep": [["eval", str(seed0 / "rec-ours-full"), "--dataset", "wt2-char", "--split", "valid", "--tgt-len", "32",
                   "--mem-len", "0,16,32,64,128,256,512,1024", "--same-length", "--batch-size", "10",
                   "--max-tokens", str(args.eval_tokens), "--device", args.device, "--no-progress",
                   "--out", str(out / "sweep")]],
        "speed": [["bench", "eval-speed", "--dataset", "wt2-char", "--model-preset", "cpu-small", "--dropout", "0",
                   "--attn-lens", args.speed_lens, "--tgt-len", "128", "--xl-batch", "10", "--repeats", "5",
                   "--device", args.device, "--no-progress", "--out", str(out / "eval-speed")]],
    }


def _run(argvs: list[list[str]], jobs: int, threads: int, last_threads: int, log_dir: Path) -> None:
    """The per-seed commands (all but the last) ``jobs`` at a time on ``threads`` threads each, then the last one
    on ``last_threads``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    base = [sys.executable, "-m", "transformer_xl", "--threads", str(threads)]
    *parallel, last = argvs
    pending = list(enumerate(parallel))
    running: list[subprocess.Popen] = []
    while pending or running:
        while pending and len(running) < jobs:
            i, argv = pending.pop(0)
            log = open(log_dir / f"{argv[1]}-{i}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
            print("txl " + " ".join(argv), flush=True)
            running.append(subprocess.Popen([*base, *argv], env=env, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(2)
        for p in [p for p in running if p.poll() is not None]:
            running.remove(p)
            if p.returncode != 0:
                raise SystemExit(f"{' '.join(p.args)} failed (exit {p.returncode})")
    print("txl " + " ".join(last), flush=True)
    env["OMP_NUM_THREADS"] = str(last_threads)
    last_base = [sys.executable, "-m", "transformer_xl", "--threads", str(last_threads)]
    if subprocess.run([*last_base, *last], env=env).returncode != 0:
        raise SystemExit(f"txl {' '.join(last)} failed")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/issue17")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated subset of {STEPS}")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per variant (default: 1500)")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds (default: 0,1,2)")
    parser.add_argument("--eval-tokens", type=int, default=20000, help="validation characters scored (default: 20000)")
    parser.add_argument("--recl-grid", default="16:160:16", help="RECL grid START:STOP:STEP (default: 16:160:16)")
    parser.add_argument("--recl-tokens", type=int, default=16384, help="RECL tokens scored (default: 16384)")
    parser.add_argument("--speed-lens", default="128,256,512,800", help="Table 9 attention lengths")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (one process each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per seed process (default: 1)")
    parser.add_argument("--last-threads", type=int, default=2,
                        help="torch threads of the single-process commands (aggregation, recl, sweep, speed)")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    minutes: dict[str, float] = {}
    for name, argvs in commands(args).items():
        if name not in args.only.split(","):
            continue
        start = time.monotonic()
        _run(argvs, args.jobs, args.threads, args.last_threads, out / "logs")
        minutes[name] = round((time.monotonic() - start) / 60, 2)
        (out / "minutes.json").write_text(json.dumps(minutes, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(minutes))


if __name__ == "__main__":
    run()
