"""Run outputs on rank 0: ``metrics.jsonl``, TensorBoard ``events/`` (when installed), the tqdm bar."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from txl.store.files import write_text
from txl.store.layout import RunDir
from txl.train.config import TrainConfig


class RunLog:
    """``metrics.jsonl`` (and TensorBoard ``events/`` when installed) on rank 0; no-ops elsewhere."""

    def __init__(self, out_dir: Path, main: bool, cfg: TrainConfig, resumed_at: int | None) -> None:
        self.file = self.tb = None
        self.main = main
        if not main:
            return
        run = RunDir(out_dir)
        path = run.metrics
        if resumed_at is not None and path.is_file():  # drop what was logged after the checkpoint
            records = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            keep = [r for r in records if r.get("step", 0) <= resumed_at and r.get("kind") != "final"]
            write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
        self.file = path.open("a", encoding="utf-8")
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run.events))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def _write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def train(self, step: int, t: float, loss: float, lr: float, tok_s: float, grad_norm: float, tokens: int,
              nonfinite: int) -> None:
        self._write({"kind": "train", "step": step, "time": round(t, 3), "train_loss": loss, "lr": lr,
                     "tokens_per_s": round(tok_s, 1), "grad_norm": grad_norm, "tokens": tokens, "nonfinite": nonfinite})
        if self.tb is not None:
            for k, v in (("train/loss", loss), ("train/lr", lr), ("train/tokens_per_s", tok_s)):
                self.tb.add_scalar(k, v, step)

    def valid(self, step: int, t: float, val: dict[str, float], metric: str, best: bool) -> None:
        self._write({"kind": "valid", "step": step, "time": round(t, 3), "valid_loss": val["loss"],
                     f"valid_{metric}": val[metric], "tokens": val["tokens"], "best": best})
        if self.tb is not None:
            self.tb.add_scalar("valid/loss", val["loss"], step)
            self.tb.add_scalar(f"valid/{metric}", val[metric], step)
        msg = f"step {step}: valid loss {val['loss']:.4f}, {metric} {val[metric]:.3f}" + (" (best)" if best else "")
        if self.main:
            _print(msg)

    def event(self, step: int, t: float, name: str, **kw: Any) -> None:
        self._write({"kind": "event", "step": step, "time": round(t, 3), "event": name, **kw})

    def final(self, step: int, t: float, final: dict[str, Any]) -> None:
        self._write({"kind": "final", "step": step, "time": round(t, 3), **final})

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


def _print(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg)


def progress(cfg: TrainConfig, initial: int, main: bool) -> Any:
    if not (main and cfg.progress):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.max_step, initial=initial, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)


def postfix(bar: Any, loss: float, metric: str, lr: float, tok_s: float) -> None:
    shown = loss / math.log(2) if metric == "bpc" else math.exp(min(loss, 50.0))
    bar.set_postfix({"loss": f"{loss:.3f}", metric: f"{shown:.2f}", "lr": f"{lr:.2e}", "tok/s": f"{tok_s:.0f}"},
                    refresh=False)
