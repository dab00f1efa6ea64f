"""The seed x variant loop the experiments share (:func:`transformer_xl.experiments.ablations.run_ablation`,
:func:`transformer_xl.experiments.long_context.run_long_context`).

Every variant of every seed is trained into ``OUT/seed<k>/<name>/run/`` and, once evaluated, leaves
``config.json``, ``model.safetensors`` and ``result.json`` in ``OUT/seed<k>/<name>/``. A variant whose
``result.json`` exists is read back, not trained again (resumable). A training stopped by SIGTERM or Ctrl-C
(``stopped == "signal"``: the trainer saved a checkpoint) leaves no result: the loop says so in one line and
raises ``KeyboardInterrupt``; the same command continues it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from transformer_xl.errors import ConfigError
from transformer_xl.store.files import read_json, write_json

V = TypeVar("V")
Train = Callable[[int, V, Path, str], tuple[Any, dict[str, Any]]]  # (seed, variant, run dir, label) -> model, log
Evaluate = Callable[[int, V, Any, dict[str, Any]], dict[str, Any]]  # (seed, variant, model, log) -> the row


def run_seed_grid(out_dir: str | Path, variants: Sequence[V], seeds: Sequence[int], *, name: Callable[[V], str],
                  train: Train[V], evaluate: Evaluate[V], vocab: Any,
                  read: Callable[[dict[str, Any]], dict[str, Any]] = lambda row: row,
                  done: Callable[[dict[str, Any]], str] | None = None,
                  log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Train (``train``) and evaluate (``evaluate``, which builds the row) every variant of every seed not finished
    under ``out_dir``; the row gains ``eval_minutes`` and is written to ``result.json`` beside the model (saved with
    ``vocab``). Finished rows are read back through ``read`` (e.g. JSON's string keys made integers again).
    ``done(row)`` is the line logged after each variant. Returns every row, seed by seed."""
    if not seeds:
        raise ConfigError("at least one seed is needed")
    out = Path(out_dir)
    rows = []
    for seed in seeds:
        for v in variants:
            vdir = out / f"seed{seed}" / name(v)
            result_path = vdir / "result.json"
            label = f"seed {seed} {name(v)}"
            if result_path.is_file():
                rows.append(read(read_json(result_path, f"finished variant {result_path}")))
                if log is not None:
                    log(f"{label}: done before, skipped")
                continue
            model, train_log = train(seed, v, vdir / "run", label)
            if train_log["stopped"] == "signal":  # not finished: no result; the next run resumes from the checkpoint
                if log is not None:
                    log(f"{label}: stopped on a signal at step {train_log['steps']} (checkpoint saved); run the "
                        "same command again to continue")
                raise KeyboardInterrupt
            t0 = time.monotonic()
            row = evaluate(seed, v, model, train_log)
            row["eval_minutes"] = round((time.monotonic() - t0) / 60, 2)
            model.save_pretrained(vdir, vocab=vocab)
            write_json(result_path, row, sort_keys=False)
            rows.append(row)
            if log is not None and done is not None:
                log(f"{label}: {done(row)}")
    return rows
