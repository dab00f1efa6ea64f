"""The optimizers and learning-rate schedules of the official train.py."""

from __future__ import annotations

import json

import pytest
import torch

from transformer_xl.train import TrainConfig
from transformer_xl.train.schedule import LRMultiplier, Schedule


def test_schedules_match_the_official_formulas() -> None:
    cos = LRMultiplier("cosine", warmup_step=10, max_step=100, eta_ratio=0.1)
    assert cos(0) == 1.0 and cos(5) == 0.5  # update 1 runs at the base lr (official order), then warmup
    assert cos(50) == pytest.approx(0.1 + 0.9 * 0.5) and cos(100) == pytest.approx(0.1)
    inv = LRMultiplier("inv_sqrt", warmup_step=4, max_step=100)
    assert inv(0) == 0.0 and inv(2) == 2 / 8 and inv(16) == 0.25
    assert LRMultiplier("inv_sqrt", 0, 100)(0) == 1.0
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = Schedule(opt, TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=2, decay_rate=0.5, patience=0))
    opt.step()
    sched.step()
    assert sched.lr == 0.5
    opt.step()
    sched.step()
    assert sched.lr == 1.0
    sched.on_eval(3.0)
    sched.on_eval(3.5)
    assert sched.lr == 0.5
    state = json.loads(json.dumps(sched.state_dict()))
    other = Schedule(torch.optim.SGD([p], lr=1.0), TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=2))
    other.load_state_dict(state)
    assert other.updates == 2 and other.plateau.best == 3.0
