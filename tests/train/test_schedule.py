"""The optimizers and learning-rate schedules of the official train.py."""

from __future__ import annotations

import json
import math

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


def _param(device: str = "cpu") -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3, device=device))]


def test_each_optimizer_with_its_settings() -> None:
    from transformer_xl.errors import ConfigError
    from transformer_xl.train.schedule import build_optimizer

    sgd = build_optimizer(_param(), TrainConfig(optim="sgd", lr=0.3, mom=0.7))
    assert type(sgd) is torch.optim.SGD and sgd.defaults["lr"] == 0.3 and sgd.defaults["momentum"] == 0.7
    ada = build_optimizer(_param(), TrainConfig(optim="adagrad", lr=0.2))
    assert type(ada) is torch.optim.Adagrad and ada.defaults["lr"] == 0.2
    adam = build_optimizer(iter(_param()), TrainConfig(optim="adam", lr=0.4))  # any iterable of parameters
    assert type(adam) is torch.optim.Adam and adam.defaults["lr"] == 0.4 and adam.defaults["fused"] is True
    assert len(adam.param_groups[0]["params"]) == 1
    other = build_optimizer(_param("meta"), TrainConfig(optim="adam", lr=0.4))  # no fused Adam on this device
    assert other.defaults["fused"] is None
    mixed = build_optimizer(_param() + _param("meta"), TrainConfig(optim="adam"))  # fused only if all can be
    assert mixed.defaults["fused"] is None
    cfg = TrainConfig(optim="adam")
    cfg.optim = "lamb"  # past the config's own check
    with pytest.raises(ConfigError, match=r"^unknown optimizer 'lamb'$"):
        build_optimizer(_param(), cfg)


def test_the_multiplier_of_each_kind_through_warmup() -> None:
    for kind in ("cosine", "constant", "dev_perf"):
        f = LRMultiplier(kind, warmup_step=4, max_step=8)
        assert [f(s) for s in range(4)] == [1.0, 0.25, 0.5, 0.75]
    cos = LRMultiplier("cosine", warmup_step=4, max_step=8, eta_ratio=0.2)
    assert cos(4) == pytest.approx(0.2 + 0.8 * 0.5)  # the warmup's end is the cosine's
    assert LRMultiplier("constant", 4, 8)(4) == 1.0 and LRMultiplier("dev_perf", 4, 8)(7) == 1.0
    assert LRMultiplier("cosine", 0, 8)(0) == 1.0 and LRMultiplier("cosine", 0, 8)(8) == pytest.approx(0.0)
    inv = LRMultiplier("inv_sqrt", warmup_step=4, max_step=8)
    assert inv(5) == pytest.approx(5**-0.5) and inv(3) == pytest.approx(3 / 8)


def test_a_cosine_schedule_ends_at_eta_min_and_no_plateau_steps() -> None:
    opt = torch.optim.SGD(_param(), lr=2.0)
    sched = Schedule(opt, TrainConfig(scheduler="cosine", lr=2.0, eta_min=0.5, warmup_step=0, max_step=4))
    assert sched.plateau is None
    lrs = []
    for _ in range(4):
        opt.step()
        sched.step()
        lrs.append(sched.lr)
        sched.on_eval(1.0)  # no plateau: nothing
    assert lrs[-1] == pytest.approx(0.5) and lrs[1] == pytest.approx(0.5 + 1.5 * 0.5) and sched.updates == 4
    state = sched.state_dict()
    assert set(state) == {"updates", "lambda_lr", "plateau"} and state["plateau"] is None
    assert "lr_lambdas" not in state["lambda_lr"] and state["lambda_lr"]["last_epoch"] == 4


def test_dev_perf_hands_over_to_the_plateau_after_warmup() -> None:
    opt = torch.optim.SGD(_param(), lr=1.0)
    cfg = TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=2, decay_rate=0.25, patience=1, lr_min=0.1)
    sched = Schedule(opt, cfg)
    p = sched.plateau
    assert (p.mode, p.factor, p.patience, p.min_lrs) == ("min", 0.25, 1, [0.1])
    opt.step()
    sched.step()
    sched.on_eval(1.0)  # during warmup: not counted
    assert p.best == float("inf") and sched.lr == 0.5
    for loss in (1.0, 2.0, 2.0):  # after warmup: the best, then two evaluations without improvement (patience 1)
        opt.step()
        sched.step()
        sched.on_eval(loss)
    assert sched.lambda_lr.last_epoch == 2  # the plateau took over after warmup
    assert sched.lr == pytest.approx(0.25)
    for loss in (3.0, 3.0, 3.0, 3.0):
        sched.on_eval(loss)
    assert sched.lr == pytest.approx(0.1)  # lr_min
    again = Schedule(torch.optim.SGD(_param(), lr=1.0), cfg)
    again.load_state_dict(json.loads(json.dumps(sched.state_dict())))
    assert again.updates == 4 and again.plateau.best == 1.0 and again.plateau.num_bad_epochs == p.num_bad_epochs
    assert again.lambda_lr.last_epoch == 2


def test_rebase_applies_the_new_lr_momentum_and_schedule() -> None:
    opt = torch.optim.SGD(_param(), lr=1.0, momentum=0.5)
    opt.add_param_group({"params": _param()})
    sched = Schedule(opt, TrainConfig(scheduler="cosine", optim="sgd", lr=1.0, mom=0.5, warmup_step=0, max_step=10))
    for _ in range(5):
        opt.step()
        sched.step()
    # the resumed run's schedule: the new config over the loaded state
    new = Schedule(opt, TrainConfig(scheduler="cosine", optim="sgd", lr=0.5, mom=0.9, eta_min=0.1, warmup_step=0,
                                    max_step=10))
    new.load_state_dict(sched.state_dict())
    new.rebase(old_lr=1.0)
    value = 0.1 / 0.5 + (1 - 0.1 / 0.5) * (1 + math.cos(math.pi * 5 / 10)) / 2
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(0.5 * value)] * 2
    assert [g["initial_lr"] for g in opt.param_groups] == [0.5, 0.5] and new.lambda_lr.base_lrs == [0.5, 0.5]
    assert [g["momentum"] for g in opt.param_groups] == [0.9, 0.9]
    opt.step()
    new.step()  # the next update follows the new schedule
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * new.fn(6))


def test_rebase_of_dev_perf_keeps_the_decay_it_reached() -> None:
    opt = torch.optim.Adam(_param(), lr=1.0)
    cfg = TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=1, decay_rate=0.5, patience=0)
    sched = Schedule(opt, cfg)
    for loss in (1.0, 2.0):
        opt.step()
        sched.step()
        sched.on_eval(loss)
    assert sched.lr == 0.5 and "momentum" not in opt.param_groups[0]  # Adam: no momentum to set
    saved = opt.state_dict()  # a resume loads the optimizer (its lr) and the schedule after building them
    new = Schedule(opt, TrainConfig(scheduler="dev_perf", lr=0.1, warmup_step=1, decay_rate=0.2, patience=3,
                                    lr_min=0.04))
    opt.load_state_dict(saved)
    new.load_state_dict(sched.state_dict())
    new.rebase(old_lr=1.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)  # half of the new lr: the decay reached, rescaled
    assert (new.plateau.factor, new.plateau.patience, new.plateau.min_lrs) == (0.2, 3, [0.04])
    low = Schedule(opt, TrainConfig(scheduler="dev_perf", lr=0.1, warmup_step=1, lr_min=0.08))
    opt.load_state_dict(saved)
    low.load_state_dict(sched.state_dict())
    low.rebase(old_lr=10.0)  # 0.5 * 0.1 / 10: below lr_min
    assert opt.param_groups[0]["lr"] == pytest.approx(0.08)  # never below lr_min
    during = Schedule(torch.optim.SGD(_param(), lr=1.0), TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=4))
    during.updates, during.lambda_lr.last_epoch = 2, 2
    during.rebase(old_lr=2.0)
    assert during.lr == pytest.approx(0.5)  # in warmup: the new schedule's value, not a rescaled one
