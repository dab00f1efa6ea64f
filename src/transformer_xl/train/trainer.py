"""Training: :class:`Trainer` and ``train(cfg)``, behind ``txl train`` (official ``train.py`` semantics).

Each step feeds the next segment of every stream with the memories of the previous step (paper Sec. 3.2);
memories restart at each epoch, as in the official loop. One step:

1. the process's rows of the global batch are cut into ``batch_chunk`` chunks, each with its own memory
   rows; each chunk's mean loss is divided by ``batch_chunk`` and back-propagated (the official
   accumulation), so the gradient is that of the full batch;
2. under DDP (``torchrun``) gradients are averaged over processes, which again equals the full batch's
   mean loss because every process holds the same number of rows;
3. the gradient norm is clipped to ``clip``; a non-finite loss or gradient is never applied (the step is
   skipped and counted, and ``max_nonfinite`` in a row stop the run);
4. the optimizer steps, then the schedule (:mod:`transformer_xl.train.schedule`).

The trainer's :meth:`Trainer.state_dict` holds model, optimizer, schedule, grad scaler, counters, the logged loss's
window, data position, RNG states and memories; :mod:`transformer_xl.store.checkpoint` writes it without pickle, and
``Trainer(cfg, resume=RUN_DIR)`` continues bit for bit on a CPU (same thread count).
Validation and the final evaluation are :mod:`transformer_xl.train.validation`.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_xl.errors import ConfigError, TXLError
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.presets import model_preset
from transformer_xl.store.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    remove_stale_temporaries,
    save_checkpoint,
)
from transformer_xl.store.files import write_json
from transformer_xl.store.layout import RunDir
from transformer_xl.store.lock import RunLock
from transformer_xl.train.batches import train_iterator
from transformer_xl.train.compiling import CompileClock, compile_for_training
from transformer_xl.train.config import TrainConfig
from transformer_xl.train.distributed import Dist, resolve_device, wrap_ddp
from transformer_xl.train.footprint import check_fits, estimate_training_bytes
from transformer_xl.train.init_from import init_setup, write_record
from transformer_xl.train.loggers import check_loggers
from transformer_xl.train.metrics import LossWindow, RunLog, postfix, progress, publish_model, write_run_files
from transformer_xl.train.precision import resolve_precision, run_environment
from transformer_xl.train.resume import AUTO, ResumePlan, plan_run
from transformer_xl.train.schedule import Schedule, build_optimizer
from transformer_xl.train.signals import stop_on_signals
from transformer_xl.train.state import capture_state, restore_state
from transformer_xl.train.validation import final_evaluation, scope, score_split, validation_lengths


class TrainingDiverged(TXLError):
    """Too many consecutive non-finite losses or gradients; nothing of them was applied or saved."""


# ---------------------------------------------------------------------------------------------- the trainer
class Trainer:
    """A checkpointable training run over one :class:`TrainConfig` (see the module docstring).

    ``Trainer(cfg)`` validates everything, loads the data and builds model, optimizer and schedule;
    ``resume=`` a run directory or checkpoint restores the full state; :meth:`fit` trains.
    """

    def __init__(self, cfg: TrainConfig, *, resume: str | Path | None = None, corpus: Any = None,
                 force: bool = False) -> None:
        cfg.validate()
        check_loggers(cfg.loggers)  # a missing extra, before anything is loaded or written
        self.cfg = cfg
        self.out_dir = Path(cfg.out_dir)
        self.run = RunDir(self.out_dir)
        self.lock = RunLock(self.out_dir) if int(os.environ.get("RANK", "0")) == 0 else None  # rank 0 holds it
        try:
            self._setup(resume, corpus, force)
        except BaseException:
            self.close(discard=True)  # a fresh run refused before writing anything leaves no directory
            if hasattr(self, "dist"):
                self.dist.close(sync=False)
            raise

    def _setup(self, resume: str | Path | None, corpus: Any, force: bool) -> None:
        cfg = self.cfg
        self.device = resolve_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if cfg.batch_size % (world * cfg.batch_chunk):
            raise ConfigError(f"batch_size {cfg.batch_size} must be divisible by world_size x batch_chunk "
                              f"= {world} x {cfg.batch_chunk}")
        model_preset(cfg.model, 10**7, **cfg.model_overrides)  # model keys/values checked before the data loads
        if self.lock is not None:  # before anything in the run directory is read or written
            self.lock.acquire()
            remove_stale_temporaries(self.run.checkpoints)
        self.plan = plan_run(resume, self.run)  # --resume auto: out_dir if it holds a run
        self.dist = Dist(self.device, cfg.dist_timeout)
        self.precision = resolve_precision(cfg.precision, self.device, announce=self.dist.main, main=self.dist.main,
                                           share=lambda v: self.dist.broadcast_float(v, self.device),
                                           kept=self.plan.precision if self.plan is not None else None)
        self.cfg, corpus, init, self.init_record = init_setup(cfg, self.plan, self.run, corpus, main=self.dist.main)
        cfg, self.corpus = self.cfg, corpus
        self.metric = "bpc" if corpus.char_level else "ppl"

        random.seed(cfg.seed), np.random.seed(cfg.seed), torch.manual_seed(cfg.seed)
        self.model_cfg: TXLConfig = model_preset(cfg.model, len(corpus.vocab), **cfg.model_overrides)
        self.vocab_sha256 = corpus.vocab.sha256()
        if self.plan is not None:  # refuse a fixed field's change before anything is loaded or written
            self.plan.check(cfg, self.model_cfg.to_dict(), self.vocab_sha256)
        if not force:  # refuse what cannot fit before allocating it (one line with the estimate)
            check_fits(estimate_training_bytes(self.model_cfg, cfg.batch_size // world, cfg.batch_chunk, cfg.optim,
                                               self.precision.name, recompute=cfg.recompute), self.device)
        self.model = TransformerXLLM(self.model_cfg).to(self.device)
        if init is not None:  # fine-tuning (transformer_xl.train.init_from): the pretrained weights
            init.load_into(self.model)
        self.model.recompute(cfg.recompute)
        if self.dist.rank:  # other processes draw their own dropout masks; rank 0 continues the seed's stream
            torch.manual_seed(cfg.seed + self.dist.rank)
        self.optimizer = build_optimizer(self.model.parameters(), cfg)
        self.schedule = Schedule(self.optimizer, cfg)
        self.scaler = self.precision.grad_scaler(self.device)
        self.forward_model: Any = wrap_ddp(self.model, self.model_cfg, self.device) if self.dist.enabled else self.model
        if cfg.compile:
            self.forward_model = compile_for_training(self.forward_model, tgt_len=self.model_cfg.tgt_len,
                                                      device=self.device, main=self.dist.main)
        self.train_iter = train_iterator(corpus, cfg, self.model_cfg, rank=self.dist.rank,
                                         world_size=self.dist.world_size, device=self.device)

        self.step = self.tokens = 0  # applied updates; training target tokens consumed (all processes)
        self.elapsed = 0.0  # training wall seconds over all invocations
        self.nonfinite_total, self.nonfinite_run, self.best_valid, self.best_step = 0, 0, math.inf, 0
        self.mems: list[Tensor] | None = None
        self.mems_epoch, self.last_saved_step, self.loss_window = 0, -1, LossWindow()  # window: since the last log
        self.stop_request: str | None = None  # set by a signal or the time limit, agreed on at the next step
        self.stop_reason: str | None = None
        self.save_request, self.save_due, self.last_save_time = False, False, time.monotonic()  # --save-minutes
        self.resumed_from: Path | None = None
        if self.plan is not None and self.plan.checkpoint is not None:
            self._load(self.plan)
            if str(resume) == AUTO and self.dist.main:
                print(f"txl train: --resume auto: continuing {self.out_dir} from step {self.step}", file=sys.stderr)
        elif self.plan is not None and self.dist.main:
            print(f"txl train: {self.out_dir} has no checkpoint yet: starting it again from step 0", file=sys.stderr)

    def close(self, *, discard: bool = False) -> None:
        """Release the run directory's lock (:meth:`fit` does it when it ends)."""
        if self.lock is not None:
            self.lock.release(discard=discard)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ data
    def _batches(self) -> Any:
        while True:
            yield from self.train_iter

    def _autocast(self) -> Any:
        return self.precision.autocast(self.device)

    # ------------------------------------------------------------------ one step
    def train_step(self, input_ids: Tensor, targets: Tensor) -> dict[str, Any]:
        """Forward/backward over the chunks, guard, clip, update. Returns loss (global mean) and flags."""
        cfg, model = self.cfg, self.forward_model
        if self.train_iter.epoch != self.mems_epoch:  # the official loop restarts memories each epoch
            self.mems, self.mems_epoch = None, self.train_iter.epoch
        self.optimizer.zero_grad(set_to_none=True)
        rows = input_ids.size(0) // cfg.batch_chunk
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        new_mems: list[list[Tensor]] = []
        for c in range(cfg.batch_chunk):
            sl = slice(c * rows, (c + 1) * rows)
            mems = [m[sl] for m in self.mems] if self.mems else None
            last = c == cfg.batch_chunk - 1
            sync = contextlib.nullcontext() if last or not self.dist.enabled else self.forward_model.no_sync()
            with sync:
                with self._autocast():
                    out = model(input_ids[sl], targets[sl], mems)
                # official: loss.mean() / batch_chunk; the Half loss averages the second half of the segment
                seg_loss = out.nll[:, out.nll.size(1) // 2:].mean() if cfg.half_loss else out.loss
                loss = self.loss_hook(seg_loss.float() / cfg.batch_chunk)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
            new_mems.append(out.mems)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip if cfg.clip > 0 else math.inf)
        requests = [float(self.stop_request == "signal"), float(self.stop_request == "time"), float(self.save_request)]
        flags = torch.cat([loss_sum[None], norm.float().to(loss_sum.device)[None],
                           torch.tensor(requests, device=loss_sum.device)])
        flags = self.dist.all_reduce(flags.detach().clone()).tolist()  # every process takes the same decisions
        loss_value, grad_norm = flags[0] / self.dist.world_size, flags[1] / self.dist.world_size
        if self.stop_reason is None and (flags[2] > 0 or flags[3] > 0):
            self.stop_reason = "signal" if flags[2] > 0 else "time"
        self.save_due = flags[4] > 0
        joined = [torch.cat(parts, 0) for parts in zip(*new_mems)] if new_mems[0] else []
        finite = math.isfinite(loss_value) and math.isfinite(grad_norm)
        if finite:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.schedule.step()
            self.step += 1
            self.nonfinite_run = 0
            self.mems = joined or None
        else:
            self.optimizer.zero_grad(set_to_none=True)
            overflow_only = self.scaler is not None and math.isfinite(loss_value)
            if self.scaler is not None:
                self.scaler.update()  # fp16 overflow: the scaler lowers its scale
            if not overflow_only:
                self.nonfinite_total += 1
                self.nonfinite_run += 1
            ok = joined and all(bool(torch.isfinite(m).all()) for m in joined)
            self.mems = joined if ok else None
        self.tokens += targets.numel() * self.dist.world_size
        return {"loss": loss_value, "grad_norm": grad_norm, "applied": finite}

    def loss_hook(self, loss: Tensor) -> Tensor:
        """The loss each chunk back-propagates (a seam for tests that inject faults)."""
        return loss

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (:func:`transformer_xl.train.state.capture_state`)."""
        return capture_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_state(self, state)

    def _load(self, plan: ResumePlan) -> None:
        # plan_resume verified it, and the run's lock keeps other writers away since
        _, weights, state = load_checkpoint(plan.checkpoint, map_location="cpu", verify=False)
        state["model"] = weights
        self.load_state_dict(state)
        if plan.schedule_changed:  # a new lr or schedule applies from the next update
            self.schedule.rebase(float(plan.train.get("lr", self.cfg.lr)))
        self.last_saved_step = self.step
        self.resumed_from = plan.checkpoint

    def save_checkpoint(self) -> Path | None:
        """Write ``out_dir/checkpoints/step_XXXXXXXX/`` (rank 0 writes; every process must call it)."""
        state = self.state_dict()
        path = None
        if self.dist.main:
            state.pop("model")
            path = save_checkpoint(self.run.checkpoints, self.step, self.model.state_dict(),
                                   self.model.config.to_json(), state)
            prune_checkpoints(self.run.checkpoints, self.cfg.keep_checkpoints)
        self.last_saved_step = self.step
        self.last_save_time, self.save_request, self.save_due = time.monotonic(), False, False
        self.dist.barrier()
        return path

    # ------------------------------------------------------------------ validation
    def validate(self, max_tokens: int | None) -> dict[str, float]:
        """The official in-training validation (:func:`transformer_xl.train.validation.validation_lengths`)."""
        return score_split(self.model, self.corpus, "valid", self.cfg.eval_batch_size, device=self.device,
                           autocast=self._autocast(), max_tokens=max_tokens,
                           **validation_lengths(self.model_cfg, self.cfg))

    def _validate_and_keep_best(self, log: RunLog) -> float:
        loss = math.nan
        if self.dist.main:
            val = self.validate(self.cfg.eval_max_tokens)
            loss = val["loss"]
            improved = loss < self.best_valid
            if improved:
                self.best_valid, self.best_step = loss, self.step
                publish_model(self.run.best, self.model, {"step": self.step, "valid_loss": loss})
            log.valid(self.step, self.elapsed, val, self.metric, improved,
                      scope(val["tokens"], self.cfg.eval_max_tokens, len(self.corpus.splits["valid"])))
        loss = self.dist.broadcast_float(loss, self.device)
        self.schedule.on_eval(loss)
        return loss

    def final_evaluation(self) -> dict[str, Any]:
        """The best model on ``valid`` and ``test`` with the ``test_*`` (official ``eval.py``) settings."""
        return final_evaluation(self.model, self.run.best, self.corpus, self.cfg, device=self.device,
                                autocast=self._autocast())

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Train until ``max_step``, ``max_minutes`` or a stop signal; returns a summary (``RankLost``: a rank died)."""
        try:
            with self.dist.guard(lambda: f"step {self.step + 1}"):
                return self._fit()
        except BaseException:
            self.dist.close(sync=False)
            raise
        finally:
            self.close()

    def _fit(self) -> dict[str, Any]:
        cfg = self.cfg
        main = self.dist.main
        if main:
            self._write_run_files()
        log = RunLog(self.out_dir, main, cfg, resumed_at=None if self.plan is None else self.step, metric=self.metric)
        if self.plan is not None:
            log.event(self.step, self.elapsed, "resume" if self.resumed_from else "restart",
                      checkpoint=str(self.resumed_from) if self.resumed_from else None, changes=self.plan.changes)
        log.event(self.step, self.elapsed, "environment", **run_environment(self.device, self.precision.name))
        bar = progress(cfg, self.step, main)
        start, t_last, tokens_last, elapsed0 = time.monotonic(), time.monotonic(), self.tokens, self.elapsed
        save_every = cfg.save_interval or cfg.eval_interval
        last_eval = -1
        clock = CompileClock(cfg.compile, lambda **kw: log.event(self.step, self.elapsed, "compile", **kw), main)
        try:
            with stop_on_signals(self._request_stop):
                batches = self._batches()
                while self.step < cfg.max_step and self.stop_reason is None:
                    now = time.monotonic()
                    if cfg.max_minutes is not None and now - start > cfg.max_minutes * 60:
                        self.stop_request = self.stop_request or "time"
                    if cfg.save_minutes is not None and now - self.last_save_time > cfg.save_minutes * 60:
                        self.save_request = True
                    batch = next(batches)
                    lr = self.schedule.lr  # the rate this update runs with
                    out = clock.step(self.train_step, batch.input_ids, batch.targets)
                    self.elapsed = elapsed0 + time.monotonic() - start
                    if not out["applied"]:
                        log.event(self.step, self.elapsed, "nonfinite", loss=out["loss"], grad_norm=out["grad_norm"])
                        if self.nonfinite_run >= cfg.max_nonfinite:
                            raise TrainingDiverged(self._diverged_message())
                        continue
                    self.loss_window.add(out["loss"])
                    if self.step % cfg.log_interval == 0:
                        now = time.monotonic()
                        tok_s = (self.tokens - tokens_last) / max(now - t_last, 1e-9)
                        loss = self.loss_window.pop()  # the mean since the last line; the next window starts
                        log.train(self.step, self.elapsed, loss, lr, tok_s, out["grad_norm"], self.tokens,
                                  self.nonfinite_total)
                        if bar is not None:
                            postfix(bar, loss, self.metric, lr, tok_s)
                        t_last, tokens_last = now, self.tokens
                    if bar is not None:
                        bar.update(1)
                    done = self.step >= cfg.max_step or self.stop_reason == "time"
                    if self.step % cfg.eval_interval == 0 or done:
                        self._validate_and_keep_best(log)
                        last_eval = self.step
                    if self.step % save_every == 0 or done or self.stop_reason or self.save_due:
                        self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
        if self.step != self.last_saved_step:  # e.g. a signal during a skipped step
            self.save_checkpoint()
        self.dist.close()  # the last collective: every process leaves the group together, rank 0 then goes on alone
        summary: dict[str, Any] = {"rank": self.dist.rank, "world_size": self.dist.world_size, "step": self.step,
                                   "minutes": round(self.elapsed / 60, 2), "metric": self.metric,
                                   "train_minutes": round((self.elapsed - elapsed0) / 60, 2),
                                   "stopped": self.stop_reason or "max_step", "out_dir": str(self.out_dir),
                                   "best_valid_loss": self.best_valid, "best_step": self.best_step,
                                   "nonfinite_steps": self.nonfinite_total, "last_eval_step": last_eval}
        if self.stop_reason is None and main:
            publish_model(self.run.final, self.model, {"step": self.step})
            if cfg.final_eval:
                summary["final"] = self.final_evaluation()
                log.final(self.step, self.elapsed, summary["final"])
        if main:
            write_json(self.run.results, summary, sort_keys=False)
        log.close()
        return summary

    def _diverged_message(self) -> str:
        ckpts = list_checkpoints(self.run.checkpoints)
        last = f"the last good checkpoint is {ckpts[-1]}" if ckpts else "no checkpoint was written yet"
        return (f"{self.nonfinite_run} consecutive non-finite losses/gradients after step {self.step} (none applied "
                f"or saved); {last}; lower --lr or raise --clip, then `txl train --resume {self.out_dir} --lr ...`")

    def _request_stop(self) -> bool:
        """A stop signal: stop after this step (True), or at once if one was already received (False)."""
        first, self.stop_request = self.stop_request != "signal", "signal"
        return first

    def _write_run_files(self) -> None:
        write_run_files(self.run, self.cfg, self.model, self.corpus, world_size=self.dist.world_size)
        write_record(self.run, self.init_record)


def train(cfg: TrainConfig, *, resume: str | Path | None = None, corpus: Any = None,
          force: bool = False) -> dict[str, Any]:
    """Train (or resume) a run as ``cfg`` says; returns the summary also written to ``results.json``."""
    return Trainer(cfg, resume=resume, corpus=corpus, force=force).fit()
