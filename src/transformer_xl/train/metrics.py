"""Run outputs on rank 0: ``metrics.jsonl`` and the loggers' files (TensorBoard ``events/``, ``wandb/``), training's
progress (bar or lines), the run's ``config.json`` and ``vocab.json``, and its ``best/`` and ``final/`` models.

``metrics.jsonl`` is appended to line by line, so a crash can leave its last line torn: :func:`read_metrics`
skips such a line (and says so), and a resumed run rewrites the file without it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from transformer_xl.data.progress import Progress, progress_mode
from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import DataError
from transformer_xl.store.files import atomic_dir, read_json, write_json, write_text
from transformer_xl.store.layout import TRAIN_INFO, RunDir
from transformer_xl.store.manifest import write_manifest
from transformer_xl.train.config import TrainConfig
from transformer_xl.train.loggers import Loggers, hyperparameters
from transformer_xl.version import __version__


def read_metrics(path: str | Path, *, warn: bool = True) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``. A torn last line (what a crash leaves) is skipped, with one note on
    stderr when ``warn``; a line that is not a JSON record elsewhere is a one-line :class:`DataError`."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc})") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            if any(rest.strip() for rest in lines[n:]):
                raise DataError(f"{path}:{n} is not JSON ({exc})") from None
            if warn:
                print(f"txl: note: skipping the torn last line of {path} (an interrupted write)", file=sys.stderr)
            continue
        records.append(record)
    return records


class RunLog:
    """``metrics.jsonl`` and the run's loggers (:mod:`transformer_xl.train.loggers`) on rank 0; no-ops elsewhere."""

    def __init__(self, out_dir: Path, main: bool, cfg: TrainConfig, resumed_at: int | None,
                 metric: str = "ppl") -> None:
        self.file = None
        self.main = main
        self.loggers = Loggers([], out_dir, hparams={}, resumed_at=None, rewind=False, metric=metric)
        if not main:
            return
        run = RunDir(out_dir)
        path = run.metrics
        redone = False  # a killed run logged steps after the checkpoint: the loggers replace them
        if resumed_at is not None and path.is_file():  # drop what was logged after the checkpoint
            records = read_metrics(path)
            keep = [r for r in records if r.get("step", 0) <= resumed_at and r.get("kind") != "final"]
            redone = any(r.get("step", 0) > resumed_at and r.get("kind") in ("train", "valid") for r in records)
            write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
        self.file = path.open("a", encoding="utf-8")
        if cfg.loggers:
            hparams = hyperparameters(read_json(run.config)) if run.config.is_file() else cfg.to_dict()
            self.loggers = Loggers(cfg.loggers, run.root, hparams=hparams, resumed_at=resumed_at,
                                   rewind=redone, metric=metric)

    def _write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def train(self, step: int, t: float, loss: float, lr: float, tok_s: float, grad_norm: float, tokens: int,
              nonfinite: int) -> None:
        self._write({"kind": "train", "step": step, "time": round(t, 3), "train_loss": loss, "lr": lr,
                     "tokens_per_s": round(tok_s, 1), "grad_norm": grad_norm, "tokens": tokens, "nonfinite": nonfinite})
        self.loggers.train(step, loss, lr, round(tok_s, 1), grad_norm)  # the values of metrics.jsonl

    def valid(self, step: int, t: float, val: dict[str, float], metric: str, best: bool,
              scope: str | None = None) -> None:
        """A validation score; the printed line says what it covers (``scope``, e.g. ``"first 20,000 tokens"``)."""
        self._write({"kind": "valid", "step": step, "time": round(t, 3), "valid_loss": val["loss"],
                     f"valid_{metric}": val[metric], "tokens": val["tokens"], "best": best})
        self.loggers.valid(step, val, metric)
        what = "valid" if scope is None else f"valid ({scope})"
        msg = f"step {step}: {what} loss {val['loss']:.4f}, {metric} {val[metric]:.3f}" + (" (best)" if best else "")
        if self.main:
            _print(msg)

    def event(self, step: int, t: float, name: str, **kw: Any) -> None:
        self._write({"kind": "event", "step": step, "time": round(t, 3), "event": name, **kw})

    def final(self, step: int, t: float, final: dict[str, Any]) -> None:
        self._write({"kind": "final", "step": step, "time": round(t, 3), **final})

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.loggers.close()


class LossWindow:
    """The training losses since the last logged step, whose mean a ``log_interval`` line reports: a running sum and
    count, kept in the train state, so that the first line after ``--resume`` averages the same steps, to the bit,
    as the line an uninterrupted run logs at that step."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, loss: float) -> None:
        """One more applied step's loss."""
        self.total += loss
        self.count += 1

    def pop(self) -> float:
        """The mean loss of the window (NaN when empty), for a logged line; the next window starts empty."""
        mean = self.total / self.count if self.count else math.nan
        self.total, self.count = 0.0, 0
        return mean

    def state_dict(self) -> dict[str, Any]:
        """``{"sum": ..., "count": ...}`` (JSON keeps the float exactly)."""
        return {"sum": self.total, "count": self.count}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`; ``None`` (a checkpoint from before the window was saved) starts empty."""
        state = state or {}
        self.total, self.count = float(state.get("sum", 0.0)), int(state.get("count", 0))


def _print(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg)


def progress(cfg: TrainConfig, initial: int, main: bool) -> Progress | None:
    """Training's progress on rank 0 (:class:`transformer_xl.data.progress.Progress`): a bar when ``cfg.progress`` and
    stderr
    is a terminal; otherwise a plain line every ``log_interval`` steps (step, loss, ppl/bpc, lr, tokens/s, ETA)."""
    if not main:
        return None
    return Progress(cfg.max_step, initial=initial, desc="train: step", unit="step", every=cfg.log_interval,
                    mode=progress_mode(cfg.progress))


def postfix(bar: Progress, loss: float, metric: str, lr: float, tok_s: float) -> None:
    """The fields of training's bar and lines."""
    shown = loss / math.log(2) if metric == "bpc" else math.exp(min(loss, 50.0))
    bar.set_fields(loss=f"{loss:.3f}", **{metric: f"{shown:.2f}"}, lr=f"{lr:.2e}", **{"tok/s": f"{tok_s:.0f}"})


def write_run_files(run: RunDir, cfg: TrainConfig, model: Any, corpus: Any, *, world_size: int) -> None:
    """The run's ``config.json`` (training and model config, dataset and its vocabulary's SHA-256) and
    ``vocab.json``."""
    info = {"name": corpus.name, "vocab_size": len(corpus.vocab), "vocab_sha256": corpus.vocab.sha256(),
            "metric": "bpc" if corpus.char_level else "ppl",
            "tokens": {k: int(v.shape[0]) for k, v in corpus.splits.items()}}
    write_json(run.config, {"txl_version": __version__, "train": cfg.to_dict(), "model": model.config.to_dict(),
                            "world_size": world_size, "dataset": info, "parameters": model.num_parameters()})
    write_text(run.vocab, corpus.vocab.to_json())


def publish_model(directory: Path, model: Any, info: dict[str, Any], vocab: Vocab | str | Path | None = None) -> None:
    """Replace the model directory ``best/`` or ``final/`` as a whole: weights, config, ``train_info.json`` and
    ``vocab.json``, all in its ``MANIFEST.json``, so a copy of the directory alone can be evaluated and sampled.

    ``vocab`` is a :class:`transformer_xl.data.Vocab`, or the path of a vocabulary JSON; by default the run's own
    ``vocab.json`` (one level up, written by :func:`write_run_files`), copied when it exists."""
    if vocab is None:
        vocab = RunDir(Path(directory).parent).vocab
        vocab = vocab if vocab.is_file() else None
    if isinstance(vocab, (str, Path)):
        vocab = Vocab.load(vocab)
    with atomic_dir(directory) as tmp:
        model.save_pretrained(tmp, vocab=vocab)
        write_json(tmp / TRAIN_INFO, info, sort_keys=False)
        write_manifest(tmp)  # SHA-256 of every file, train_info.json and vocab.json included
