"""Parts for the driver's tests (``tests/experiments/gpucheck/test_runner.py``): each runs in a child process the
driver starts, as a real part does, and does one thing the driver must handle."""

from __future__ import annotations

import os
import time
from typing import Any

from transformer_xl.experiments.gpucheck.options import CheckOptions


def ok(opts: CheckOptions, **kwargs: Any) -> dict[str, Any]:
    opts.log("fine")
    import torch

    return {"value": torch.tensor(1.5), "kwargs": kwargs, "time_left_finite": opts.time_left() < 1e9,
            "checks": [{"name": "passes", "ok": True}]}


def out_of_tolerance(opts: CheckOptions) -> dict[str, Any]:
    return {"checks": [{"name": "within", "ok": True}, {"name": "drifts", "ok": False, "value": 0.5}]}


def skips(opts: CheckOptions) -> dict[str, Any]:
    return {"status": "skipped", "reason": "a package is missing", "checks": []}


def raises(opts: CheckOptions) -> dict[str, Any]:
    raise RuntimeError("the device said no\nsecond line of the message")


def sleeps(opts: CheckOptions) -> dict[str, Any]:
    with open(opts.out_dir / "sleeper.pid", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    return {}


def crashes(opts: CheckOptions) -> dict[str, Any]:
    print("about to crash", flush=True)
    import sys

    print("fatal: the driver must read this line", file=sys.stderr, flush=True)
    os._exit(3)
