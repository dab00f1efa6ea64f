"""What ``txl train --resume`` may change, and the checks that run before a resumed run touches its directory.

A run is resumed from its newest complete checkpoint (or a given ``RUN/checkpoints/step_*``). Before anything
in the run directory changes, the new configuration is compared with the one the checkpoint was written with:

* **fixed** fields (:data:`FIXED`, and every model field) are what the saved state means: the architecture,
  the dataset and its vocabulary, the pretrained model a fine-tuning run started from (``init_from``), the
  batch and its rows, the segment length, the optimizer's kind (its state has another form), the seed (the
  RNG streams), the objective (``half_loss``), the numeric format of fp16's loss scaler. A change is refused
  in one line naming the field and the run's value;
* every other field may change and is applied from the next step (:meth:`Schedule.rebase
  <transformer_xl.train.schedule.Schedule.rebase>` re-targets the learning rate; intervals, limits, clipping and
  evaluation settings are read from the config as the run goes); the changes are recorded as a ``resume``
  event in ``metrics.jsonl``.

A run directory with a config and no checkpoint yet (a run stopped before its first save) is started again
from step 0 instead of refused: :func:`plan_resume` returns a plan without a checkpoint.

``--resume auto`` (:data:`AUTO`, :func:`resume_target`) is the one command line that both starts a run and
continues it: it continues ``--out-dir`` when that holds a run (with the checks above: a different run is refused)
and starts it when it is empty or absent. It is what a job relaunched unchanged needs: ``torchrun --max-restarts``
after a lost worker, or a scheduler's next launch after a preemption. Without it a directory that holds a run is
refused as before (the protection of a user at a terminal); under a ``torchrun`` restart the refusal says to add
``--resume auto`` (:func:`restart_hint`).

A new run starts only in an absent or empty ``--out-dir`` (:func:`plan_run`): a directory holding anything else (the
user's files, a model directory, another tool's output) is refused in one line before anything is written there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_xl.errors import CheckpointError, ConfigError, DataError
from transformer_xl.store.checkpoint import list_checkpoints, read_checkpoint_meta, verify_checkpoint
from transformer_xl.store.files import read_json
from transformer_xl.store.layout import CHECKPOINTS, RunDir, is_checkpoint_dir
from transformer_xl.store.lock import LOCK
from transformer_xl.train.config import TrainConfig

#: ``--resume auto``: continue ``--out-dir`` if it holds a run, start it otherwise.
AUTO = "auto"

#: TrainConfig fields a resume may not change (model fields are all fixed too).
FIXED = ("dataset", "model", "batch_size", "varlen", "optim", "scheduler", "seed", "half_loss", "init_from", "level",
         "tokenizer", "valid_fraction", "test_fraction")
#: Fields that name where the run is, not what it does: not compared (``init_vocab``: where a fine-tuning run
#: found its vocabulary when it started; the vocabulary itself is compared by its SHA-256).
UNTRACKED = ("preset", "out_dir", "model_overrides", "init_vocab")
#: Fields that re-target the learning rate when they change.
SCHEDULE_FIELDS = ("lr", "mom", "warmup_step", "max_step", "eta_min", "decay_rate", "patience", "lr_min")

_WHY = {
    "dataset": "the data and its vocabulary", "model": "the architecture", "batch_size": "the data streams",
    "varlen": "the data iterator", "optim": "the optimizer state's form", "scheduler": "the schedule state",
    "seed": "the random streams", "half_loss": "the objective", "precision": "fp16's loss-scaler state",
    "level": "the unit of the tokens and so the vocabulary", "tokenizer": "the tokens and so the vocabulary",
    "valid_fraction": "which text is trained on and which is held out",
    "test_fraction": "which text is trained on and which is held out",
    "init_from": "the weights and vocabulary the run started from; a resume continues from its own checkpoint",
}


def fixed_field_changed(run_root: str | Path, key: str, old: Any) -> ConfigError:
    """The one-line error for a change of ``key`` (a field that fixes something of the run) on ``--resume``."""
    return ConfigError(f"cannot change {key} on --resume: {run_root} was trained with {key}={old!r} (it fixes "
                       f"{_WHY[key]}); start a new run with another --out-dir")


@dataclass
class ResumePlan:
    """Where a resume starts: ``checkpoint`` (``None``: again from step 0) and what it was written with."""

    run: RunDir
    checkpoint: Path | None
    train: dict[str, Any] = field(default_factory=dict)  # the TrainConfig the checkpoint (or run) was written with
    model: dict[str, Any] = field(default_factory=dict)  # the TXLConfig of the checkpoint
    vocab_sha256: str | None = None
    changes: dict[str, list[Any]] = field(default_factory=dict)  # field -> [run's value, new value]
    precision: str | None = None  # the precision the checkpoint was trained in (``auto`` resolved)

    def check(self, cfg: TrainConfig, model: dict[str, Any], vocab_sha256: str) -> dict[str, list[Any]]:
        """Refuse a fixed field's change or another vocabulary (one line each); returns the changes."""
        if self.vocab_sha256 is not None and vocab_sha256 != self.vocab_sha256:
            raise DataError(f"the vocabulary of dataset {cfg.dataset!r} differs from the one {self.run.root} was "
                            f"trained with (sha256 {vocab_sha256[:12]} vs {self.vocab_sha256[:12]}): its text "
                            "changed since the run started; restore it, or start a new run with another --out-dir")
        for key, old in self.model.items():
            if key != "n_token" and key in model and model[key] != old:
                raise ConfigError(f"cannot change {key} on --resume: {self.run.root} was trained with {key}={old!r} "
                                  "(the architecture and training lengths are fixed; evaluation lengths: --test-*)")
        new = cfg.to_dict()
        changes = {}
        for key, old in self.train.items():
            if key in UNTRACKED or key not in new or new[key] == old:
                continue
            fixed = key in FIXED or (key == "precision" and "fp16" in (old, new[key]))
            if fixed:
                raise fixed_field_changed(self.run.root, key, old)
            changes[key] = [old, new[key]]
        self.changes = changes
        return changes

    @property
    def schedule_changed(self) -> bool:
        return any(k in SCHEDULE_FIELDS for k in self.changes)


def plan_resume(path: str | Path) -> ResumePlan:
    """The plan to resume ``path`` (a run directory or one of its checkpoints), its checkpoint verified."""
    path = Path(path)
    ckpt = path if is_checkpoint_dir(path) else None
    run = RunDir(RunDir.of_checkpoint(path) if ckpt else path)
    if ckpt is None:
        found = list_checkpoints(run.checkpoints)
        ckpt = found[-1] if found else None
        if ckpt is None and not run.config.is_file():
            raise CheckpointError(f"no checkpoint to resume from in {path} (expected {run.checkpoints}/step_*/)")
    run_cfg = read_json(run.config, f"run config {run.config}", CheckpointError) if run.config.is_file() else {}
    plan = ResumePlan(run, ckpt, dict(run_cfg.get("train", {})), dict(run_cfg.get("model", {})),
                      run_cfg.get("dataset", {}).get("vocab_sha256"))
    if ckpt is not None:
        try:
            verify_checkpoint(ckpt)
        except CheckpointError as exc:
            older = [p for p in list_checkpoints(run.checkpoints) if p.name < ckpt.name]
            if not older:
                raise
            raise CheckpointError(f"{exc}; resume from an older checkpoint with --resume {older[-1]}") from None
        model, state = read_checkpoint_meta(ckpt)
        plan.model = model
        plan.train = state.get("train_config", plan.train)  # older checkpoints: the run's config.json
        plan.vocab_sha256 = state.get("vocab_sha256", plan.vocab_sha256)
        plan.precision = state.get("precision")
    if plan.vocab_sha256 is None and run.vocab.is_file():
        from transformer_xl.data.vocab import Vocab

        plan.vocab_sha256 = Vocab.load(run.vocab).sha256()
    return plan



def holds_run(run: RunDir) -> bool:
    """Whether ``run`` holds a run: its ``config.json`` or a checkpoint (a lock file alone is no run)."""
    return run.config.is_file() or bool(list_checkpoints(run.checkpoints))


def resume_target(resume: str | Path | None, out_dir: str | Path) -> Path | None:
    """The directory ``--resume`` continues: ``None`` for a new run; for :data:`AUTO`, ``out_dir`` when it holds a
    run (:func:`holds_run`) and ``None`` when it is empty or absent (a run directory named ``auto``: ``./auto``)."""
    if resume is None or str(resume) != AUTO:
        return None if resume is None else Path(resume)
    return Path(out_dir) if holds_run(RunDir(out_dir)) else None


def plan_run(resume: str | Path | None, run: RunDir) -> ResumePlan | None:
    """The plan of ``txl train [--resume RESUME]`` into ``run`` (``None``: a new run); a new run into a directory
    that holds one is refused in one line (with :func:`restart_hint` under a torchrun restart)."""
    target = resume_target(resume, run.root)
    plan = plan_resume(target) if target is not None else None
    if plan is None and holds_run(run):
        raise ConfigError(f"{run.root} already holds a run: continue it with `txl train --resume {run.root}`, or give "
                          f"another --out-dir{restart_hint()}")
    if plan is None:  # a new run: in a directory of its own (it writes config.json, vocab.json, best/ ... there)
        foreign = sorted(p.name for p in run.root.iterdir() if not _fresh(p)) if run.root.is_dir() else []
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ConfigError(f"{run.root} is not empty ({shown}): a new run starts in a new or empty --out-dir, "
                              "so that it writes over nothing of yours; give another --out-dir")
    return plan


def _fresh(entry: Path) -> bool:
    """Whether a new run may start beside ``entry``: the run's lock (taken before the directory is read), or an
    empty checkpoints folder (a killed writer's temporaries were just cleared from it)."""
    return entry.name == LOCK or (entry.name == CHECKPOINTS and entry.is_dir() and not any(entry.iterdir()))


def restart_hint() -> str:
    """Under a ``torchrun`` restart (``TORCHELASTIC_RESTART_COUNT`` > 0), the advice to relaunch with
    ``--resume auto``, to add to the refusal of a directory that holds a run; else ``""``."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if not count.isdigit() or int(count) == 0:
        return ""
    return (f" (this is torchrun's restart {count}: put --resume auto in the command so that a restart continues "
            "the run)")
