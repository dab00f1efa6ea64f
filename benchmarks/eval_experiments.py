"""Re-run the evidence of docs/eval-speed.md, docs/memory-sweep.md, docs/recl.md and docs/ablations.md.

Runs the same ``txl`` commands the docs list, in order, and writes the minutes each took to
``OUT/minutes.json``. CPU scale: about 30 minutes on 2 free cores (more on a shared machine).

    TXL_DATA_DIR=/path/to/data python benchmarks/eval_experiments.py --out runs/issue6 [--only speed,train,...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from txl.cli import main

STEPS = ("speed", "train", "sweep", "recl")


def commands(out: Path) -> dict[str, list[str]]:
    abl = out / "abl"
    return {
        "speed": ["experiment", "eval-speed", "--dataset", "wt2-char", "--model-preset", "cpu-small", "--dropout", "0",
                  "--attn-lens", "128,256,512,800", "--tgt-len", "128", "--xl-batch", "10", "--repeats", "3",
                  "--out", str(out / "eval-speed")],
        "train": ["experiment", "ablation", "--dataset", "wt2-char", "--variants",
                  "rec-ours-full,norec-ours-full,norec-alrfou-half", "--model-preset", "tiny", "--n-layer", "3",
                  "--d-model", "64", "--n-head", "4", "--d-inner", "256", "--dropout", "0", "--tgt-len", "64",
                  "--steps", "700", "--batch-size", "16", "--lr", "1e-3", "--eval-tokens", "50000",
                  "--out", str(abl)],
        "sweep": ["eval", str(abl / "rec-ours-full"), "--dataset", "wt2-char", "--split", "valid", "--tgt-len", "64",
                  "--mem-len", "0,32,64,128,256,512,1024", "--same-length", "--batch-size", "10",
                  "--max-tokens", "50000", "--out", str(out / "sweep")],
        "recl": ["recl", "--model", f"xl={abl / 'rec-ours-full'}",
                 "--model", f"xl-no-recurrence={abl / 'norec-ours-full'}",
                 "--model", f"vanilla={abl / 'norec-alrfou-half'}", "--dataset", "wt2-char", "--split", "valid",
                 "--contexts", "32,64,96,128,160,192,224,256,288,320", "--tokens", "8192", "--tgt-len", "32",
                 "--out", str(out / "recl")],
    }


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/issue6")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated subset of {STEPS}")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    minutes: dict[str, float] = {}
    for name, argv in commands(out).items():
        if name not in args.only.split(","):
            continue
        print("txl " + " ".join(argv), flush=True)
        start = time.monotonic()
        if main(argv) != 0:
            raise SystemExit(f"step {name} failed")
        minutes[name] = round((time.monotonic() - start) / 60, 2)
    (out / "minutes.json").write_text(json.dumps(minutes, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(minutes))


if __name__ == "__main__":
    run()
