"""Learning curves of a run directory (``metrics.jsonl``) as a PNG: ``txl plot RUN_DIR``.

Four panels: train/valid loss against step and against wall time, the learning rate, and tokens/s.
Loss is in nats; the valid points are also labelled in the run's metric (ppl, or bpc for
character/byte-level data). Needs matplotlib (the ``plot`` extra: :func:`~transformer_xl.errors.install_hint`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, DataError, install_hint
from transformer_xl.store.files import read_json
from transformer_xl.store.layout import RunDir
from transformer_xl.train.metrics import read_metrics as read_metrics_file


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``RUN_DIR/metrics.jsonl`` (:func:`transformer_xl.train.metrics.read_metrics`: a torn last line is
    skipped; a :class:`DataError` if the file is missing or another line is not JSON)."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        raise DataError(f"{path} not found: RUN_DIR must be a `txl train` output directory")
    return read_metrics_file(path)


def plot_run(run_dir: str | Path, out: str | Path | None = None, *, title: str | None = None) -> Path:
    """Write the learning-curve PNG of ``run_dir`` (default ``RUN_DIR/curves.png``) and return its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(f"txl plot needs matplotlib: {install_hint('plot')}") from exc
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r.get("kind") == "train" and "train_loss" in r]
    valid = [r for r in records if r.get("kind") == "valid" and "valid_loss" in r]
    if not train and not valid:
        raise DataError(f"{RunDir(run_dir).metrics} holds no train/valid records yet")
    metric = next((k[6:] for r in valid for k in r if k in ("valid_ppl", "valid_bpc")), "ppl")
    cfg_path = RunDir(run_dir).config
    if title is None and cfg_path.is_file():
        cfg = read_json(cfg_path, error=DataError)
        t = cfg.get("train", {})
        title = (f"{t.get('preset') or t.get('model')} on {t.get('dataset')} "
                 f"({cfg.get('parameters', 0) / 1e6:.2f}M parameters, batch {t.get('batch_size')})")

    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    for col, x_key, x_label, scale in ((0, "step", "step", 1.0), (1, "time", "wall time (minutes)", 1 / 60)):
        a = ax[0][col]
        if train:
            a.plot([r[x_key] * scale for r in train], [r["train_loss"] for r in train], lw=0.8, alpha=0.8,
                   label="train loss")
        if valid:
            best = min(valid, key=lambda r: r["valid_loss"])
            a.plot([r[x_key] * scale for r in valid], [r["valid_loss"] for r in valid], "o-", ms=3,
                   label=f"valid loss (best {best['valid_loss']:.3f} = {metric} {best['valid_' + metric]:.3g})")
        a.set_xlabel(x_label)
        a.set_ylabel("loss (nats/token)")
        a.grid(alpha=0.3)
        a.legend()
        if train:
            lows = [r["train_loss"] for r in train if math.isfinite(r["train_loss"])]
            if lows:
                a.set_ylim(min(lows + [r["valid_loss"] for r in valid]) * 0.95,
                           min(max(lows[: max(1, len(lows) // 20)] + lows[-5:]) * 1.05, max(lows) * 1.05))
    ax[1][0].plot([r["step"] for r in train], [r["lr"] for r in train])
    ax[1][0].set_xlabel("step")
    ax[1][0].set_ylabel("learning rate")
    ax[1][0].grid(alpha=0.3)
    ax[1][1].plot([r["step"] for r in train], [r["tokens_per_s"] for r in train], lw=0.8)
    ax[1][1].set_xlabel("step")
    ax[1][1].set_ylabel("training tokens / s")
    ax[1][1].grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out) if out is not None else run_dir / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
