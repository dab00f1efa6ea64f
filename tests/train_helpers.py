"""Shared pieces of the training tests: a small structured word corpus and a tiny config."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from txl.train_config import TrainConfig

WORDS = (
    "the", "cat", "dog", "sat", "ran", "on", "under", "a", "mat", "log", "big", "small", "red", "blue", "one",
    "two", "three", "and", "then", "it", "was", "very", "quite", "not", "so", "here", "there", "up", "down",
)


def corpus_dir(root: Path, n_train: int = 400, n_eval: int = 120) -> Path:
    """``root/corpus/{train,valid,test}.txt``: word sentences with some structure (a model can learn them)."""
    rng = random.Random(0)
    d = Path(root) / "corpus"
    d.mkdir(parents=True, exist_ok=True)

    def text(n: int) -> str:
        words: list[str] = []
        lines = []
        while len(words) < n:
            a, b = rng.choice(WORDS), rng.choice(WORDS)
            line = f"the {a} {b} sat on the {b} {a}"
            lines.append(line)
            words += line.split()
        return "\n".join(lines) + "\n"

    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        (d / f"{split}.txt").write_text(text(n), encoding="utf-8")
    return d


def tiny_cfg(out_dir: Path, dataset: str = "unused", **kw: Any) -> TrainConfig:
    """A run of the ``tiny`` model shape (d_model 16) that takes well under a second per step."""
    model = dict(n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6, dropout=0.0)
    for key in list(kw):
        if key in model or key in ("cutoffs", "div_val", "tie_projs", "dropatt", "same_length", "clamp_len"):
            model[key] = kw.pop(key)
    base: dict[str, Any] = dict(dataset=dataset, model="tiny", model_overrides=model, out_dir=str(out_dir),
                                batch_size=4, lr=3e-3, warmup_step=2, max_step=8, eval_interval=4, log_interval=1,
                                eval_max_tokens=200, save_interval=2, final_eval=False, progress=False,
                                tensorboard=False, seed=7)
    base.update(kw)
    return TrainConfig(**base)
