"""Training loggers beside ``metrics.jsonl``: TensorBoard event files and Weights & Biases runs (``txl train
--logger tensorboard|wandb``), on rank 0, through :class:`transformer_xl.train.metrics.RunLog`.

``metrics.jsonl`` stays the record; a logger receives the same values under stable tags (:data:`TAGS`):

* every ``log_interval`` steps: ``train/loss``, ``train/ppl`` (``train/bpc`` for character and byte data),
  ``train/lr``, ``train/tokens_per_s``, ``train/grad_norm``;
* at every validation: ``valid/loss``, ``valid/ppl`` (or ``valid/bpc``).

The run's configuration (training and model fields, parameter count, world size) goes in as hyper-parameters:
TensorBoard's hparams plugin, W&B's run config.

**Resume.** A resumed run continues the same curves. Steps logged after the checkpoint it resumes from (by a
killed run) are done again, and their new values replace the old ones, as ``metrics.jsonl``'s do:

* TensorBoard: the writer opens with ``purge_step`` = checkpoint step + 1, a ``SessionLog.START`` event after
  which TensorBoard's reader drops every earlier-written point at that step or later;
* W&B: the run keeps its id (``loggers.json`` in the run directory); when the killed run had logged past the
  checkpoint, the resumed one starts with W&B's rewind (``resume_from="ID?_step=K"``, a branch point recorded in
  the run's log), else it continues the run (``resume="allow"``).

A logger that fails while the run goes on is turned off with one note on stderr; the run and ``metrics.jsonl`` go
on. A logger whose package is missing is refused before training starts (:func:`check_loggers`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, install_hint
from transformer_xl.store.files import read_json, write_json
from transformer_xl.store.layout import RunDir

#: logger name -> (the module it needs, the extra that installs it)
LOGGERS: dict[str, tuple[str, str]] = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
#: how often W&B writes its ``.wandb`` file (its default, 15 s, loses that much of a killed offline run); the
#: environment variable ``WANDB__TRANSACTION_LOG_FLUSH_INTERVAL`` still decides when set
FLUSH_SETTING, FLUSH_SECONDS = "x_transaction_log_flush_interval", 1.0
#: the scalars a logger receives; ``{metric}`` is ``ppl`` or ``bpc``
TAGS = ("train/loss", "train/{metric}", "train/lr", "train/tokens_per_s", "train/grad_norm", "valid/loss",
        "valid/{metric}")


def check_loggers(names: list[str]) -> None:
    """Refuse, in one line naming the extra to install, a logger whose package cannot be imported."""
    for name in names:
        module, extra = LOGGERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"--logger {name} needs the {module} package: {install_hint(extra)}")


def metric_value(loss: float, metric: str) -> float:
    """Perplexity (``exp(loss)``) or bits per character (``loss / ln 2``) of a mean loss in nats."""
    if metric == "bpc":
        return loss / math.log(2)
    return math.exp(loss) if loss < 700 else math.inf


def train_scalars(loss: float, lr: float, tokens_per_s: float, grad_norm: float, metric: str) -> dict[str, float]:
    """The ``train/*`` scalars of one logged step."""
    return {"train/loss": loss, f"train/{metric}": metric_value(loss, metric), "train/lr": lr,
            "train/tokens_per_s": tokens_per_s, "train/grad_norm": grad_norm}


def valid_scalars(val: dict[str, float], metric: str) -> dict[str, float]:
    """The ``valid/*`` scalars of one validation."""
    return {"valid/loss": val["loss"], f"valid/{metric}": val[metric]}


def hyperparameters(run_config: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters of a run's ``config.json``: its training and model fields, parameters, world size."""
    train = {k: v for k, v in run_config.get("train", {}).items() if k != "model_overrides"}
    out = {**run_config.get("model", {}), **train}
    for key in ("parameters", "world_size"):
        if key in run_config:
            out[key] = run_config[key]
    return out


class _TensorBoard:
    """Event files in ``directory``, written with ``torch.utils.tensorboard.SummaryWriter``."""

    name = "tensorboard"

    def __init__(self, directory: Path, hparams: dict[str, Any], resumed_at: int | None, metric: str) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        # purge_step: TensorBoard hides every point written before at this step or later (a killed run's)
        self.writer = SummaryWriter(str(directory), purge_step=None if resumed_at is None else resumed_at + 1)
        shown = {k: v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v)
                 for k, v in hparams.items()}
        # equivalent mutants: the hparams summary reads the metrics' names only, never their values
        metrics = {tag.format(metric=metric): 0.0 for tag in TAGS if tag.startswith("valid/")}  # pragma: no mutate
        experiment, start, self._end = hparams_summaries(shown, metrics)
        for summary in (experiment, start):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # live curves, and a killed run's points on disk

    def close(self) -> None:
        self.writer.file_writer.add_summary(self._end)
        self.writer.close()


class _WandB:
    """A W&B run in ``run_dir/wandb`` (online, or offline with ``WANDB_MODE=offline``), one id per txl run."""

    name = "wandb"

    def __init__(self, run_dir: Path, hparams: dict[str, Any], resumed_at: int | None, rewind: bool) -> None:
        import wandb

        run = RunDir(run_dir)
        state_path = run.loggers  # loggers.json: the W&B run id
        state = read_json(state_path, str(state_path), ConfigError) if state_path.is_file() else {}
        run_id = state.get("wandb", {}).get("id")
        if run_id is not None and resumed_at is not None and rewind:  # replace what was logged after step K
            where: dict[str, Any] = {"resume_from": f"{run_id}?_step={resumed_at}"}
        else:
            run_id = run_id or uuid.uuid4().hex[:8]  # W&B's form: 8 characters [a-z0-9]
            where = {"id": run_id, "resume": "allow"}
            write_json(state_path, {**state, "wandb": {"id": run_id}})
        run.wandb.mkdir(exist_ok=True)
        settings: dict[str, Any] = {"console": "off"}
        if FLUSH_SETTING in wandb.Settings.model_fields and f"WANDB__{FLUSH_SETTING[2:].upper()}" not in os.environ:
            settings[FLUSH_SETTING] = FLUSH_SECONDS
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "txl"), name=run_dir.resolve().name,
                              dir=str(run_dir), config=hparams, settings=wandb.Settings(**settings), **where)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """The run's loggers (none when ``names`` is empty); each failure turns that logger off, with a note."""

    def __init__(self, names: list[str], run_dir: Path, *, hparams: dict[str, Any],
                 resumed_at: int | None, rewind: bool, metric: str) -> None:
        self.metric = metric
        self.active: list[Any] = []
        for name in names:
            try:
                if name == "tensorboard":
                    self.active.append(_TensorBoard(RunDir(run_dir).events, hparams, resumed_at, metric))
                else:
                    self.active.append(_WandB(run_dir, hparams, resumed_at, rewind))
            except Exception as exc:  # the run goes on without it: metrics.jsonl is the record
                _note(name, "could not start", exc)

    def _each(self, call: str, *args: Any) -> None:
        for logger in list(self.active):
            try:
                getattr(logger, call)(*args)
            except Exception as exc:
                self.active.remove(logger)
                _note(logger.name, "failed", exc)

    def train(self, step: int, loss: float, lr: float, tokens_per_s: float, grad_norm: float) -> None:
        self._each("log", train_scalars(loss, lr, tokens_per_s, grad_norm, self.metric), step)

    def valid(self, step: int, val: dict[str, float], metric: str) -> None:
        self._each("log", valid_scalars(val, metric), step)

    def close(self) -> None:
        self._each("close")
        self.active = []


def _note(name: str, what: str, exc: BaseException) -> None:
    print(f"txl train: warning: the {name} logger {what} ({type(exc).__name__}: {exc}); it is off for the rest of "
          "this run, metrics.jsonl keeps every value", file=sys.stderr)
