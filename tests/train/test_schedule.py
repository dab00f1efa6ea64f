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


def test_adam_is_fused_on_the_cpu_and_updates_as_the_official_adam() -> None:
    """``build_optimizer``'s Adam runs fused (one kernel) on the CPU, and its updates equal the unfused
    ``torch.optim.Adam`` of the official code to float rounding, over steps with a changing learning rate."""
    from transformer_xl.train.schedule import build_optimizer

    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = build_optimizer(ours, TrainConfig(optim="adam", lr=0.01))
    official = torch.optim.Adam(ref, lr=0.01)
    assert opt.defaults["fused"] is True and not official.defaults["fused"]
    for step in range(5):
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        for o in (opt, official):
            o.param_groups[0]["lr"] = 0.01 / (step + 1)
            o.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert not torch.equal(a, torch.zeros_like(a))
