"""Optimizers and learning-rate schedules of the official ``train.py``, on ``torch.optim``.

Optimizers: Adam, SGD (``mom``), Adagrad. Schedules, all as ``torch.optim.lr_scheduler`` objects:

* ``cosine`` (official default): linear warmup over ``warmup_step`` updates, then
  ``eta_min + (lr - eta_min) * (1 + cos(pi * step / max_step)) / 2``: the closed form the official code
  gets from ``CosineAnnealingLR(T_max=max_step, eta_min).step(train_step)``, as a ``LambdaLR``;
* ``inv_sqrt``: ``step / warmup**1.5`` during warmup, then ``1 / sqrt(step)`` (the official ``LambdaLR``);
* ``constant``: linear warmup, then ``lr``;
* ``dev_perf``: linear warmup, then ``ReduceLROnPlateau(factor=decay_rate, patience, min_lr=lr_min)``
  on the validation loss.

The official loop sets the learning rate *after* the update it counts, so update ``n`` (1-based) runs with
the schedule's value at ``n - 1`` and update 1 with the base ``lr`` (also during warmup, except for
``inv_sqrt``). :class:`Schedule` keeps that order: :meth:`Schedule.step` is called after each update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from transformer_xl.errors import ConfigError
from transformer_xl.train.config import TrainConfig

#: Devices whose Adam has a fused implementation (one kernel over every parameter: the CPU's is vectorized and
#: parallel, where the default runs several operations per parameter on one thread's dispatch).
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The official ``--optim`` choices (dense parameters). Adam is the same update as the official code's
    ``torch.optim.Adam``, run fused where :data:`FUSED_ADAM_DEVICES` allow (measured on an AMD EPYC, one thread: an
    update of the 3.5M parameters of ``txl bench``'s ``char`` case 9.5 -> 3.0 ms, of ``char-mid``'s 20.6M
    86.8 -> 14.6 ms); its results equal the unfused update's to float rounding (``tests/train/test_schedule.py``)."""
    if cfg.optim == "adam":
        params = list(params)
        fused = bool(params) and all(p.device.type in FUSED_ADAM_DEVICES for p in params)
        return torch.optim.Adam(params, lr=cfg.lr, fused=fused or None)
    if cfg.optim == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.mom)
    if cfg.optim == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr)
    raise ConfigError(f"unknown optimizer {cfg.optim!r}")


@dataclass
class LRMultiplier:
    """The multiplier of the base ``lr`` after ``step`` updates (a JSON-able ``LambdaLR`` lambda)."""

    kind: str
    warmup_step: int
    max_step: int
    eta_ratio: float = 0.0  # eta_min / lr

    def __call__(self, step: int) -> float:
        if self.kind == "inv_sqrt":  # official lr_lambda, verbatim
            if step == 0 and self.warmup_step == 0:
                return 1.0
            return 1.0 / step**0.5 if step > self.warmup_step else step / self.warmup_step**1.5
        if step == 0:
            return 1.0  # the official loop runs update 1 with the base lr
        if step < self.warmup_step:
            return step / self.warmup_step
        if self.kind == "cosine":
            return self.eta_ratio + (1.0 - self.eta_ratio) * (1.0 + math.cos(math.pi * step / self.max_step)) / 2
        return 1.0  # constant, dev_perf (the plateau scheduler takes over after warmup)


class Schedule:
    """A learning-rate schedule advanced once per applied update (see the module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.fn = LRMultiplier(cfg.scheduler, cfg.warmup_step, cfg.max_step, cfg.eta_min / cfg.lr)
        self.lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, self.fn)
        self.plateau = None
        if cfg.scheduler == "dev_perf":
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=cfg.decay_rate, patience=cfg.patience, min_lr=cfg.lr_min)
        self.optimizer = optimizer
        self.updates = 0

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self) -> None:
        """After an applied update."""
        self.updates += 1
        if self.plateau is None or self.updates <= self.cfg.warmup_step:
            self.lambda_lr.step()

    def on_eval(self, valid_loss: float) -> None:
        """After a validation (``dev_perf`` only, once warmup is over)."""
        if self.plateau is not None and self.updates >= self.cfg.warmup_step:
            self.plateau.step(valid_loss)

    def rebase(self, old_lr: float) -> None:
        """After :meth:`load_state_dict` of a run saved with base rate ``old_lr``: apply this config's ``lr``,
        ``mom`` and schedule fields from the next update. The rate becomes the new schedule's value at the
        current update; after warmup, ``dev_perf`` keeps the decay it reached (scaled to the new ``lr``)."""
        cfg, groups = self.cfg, self.optimizer.param_groups
        self.lambda_lr.base_lrs = [cfg.lr] * len(groups)
        if self.plateau is not None:
            self.plateau.factor, self.plateau.patience = cfg.decay_rate, cfg.patience
            self.plateau.min_lrs = [cfg.lr_min] * len(groups)
        plateau_phase = self.plateau is not None and self.updates > cfg.warmup_step
        for g in groups:
            g["initial_lr"] = cfg.lr
            if "momentum" in g:
                g["momentum"] = cfg.mom
            if plateau_phase:
                g["lr"] = max(cfg.lr_min, g["lr"] * cfg.lr / old_lr)
            else:
                g["lr"] = cfg.lr * self.fn(self.lambda_lr.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        state = self.lambda_lr.state_dict()
        state.pop("lr_lambdas", None)  # rebuilt from the config
        return {"updates": self.updates, "lambda_lr": state,
                "plateau": self.plateau.state_dict() if self.plateau is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        lam = dict(state["lambda_lr"])
        lam["lr_lambdas"] = [None] * len(self.optimizer.param_groups)
        self.lambda_lr.load_state_dict(lam)
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])
