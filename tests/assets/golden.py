"""The golden loss curve: a tiny, fixed training run whose losses are kept in ``golden_tiny_run.json``;
``tests/train/test_trainer.py`` checks that training still reproduces them.

Regenerate (only when a change of the numbers is intended, and say so in the CHANGELOG)::

    PYTHONPATH=src python tests/assets/golden.py > tests/assets/golden_tiny_run.json

``golden_tiny_run_0.1.json`` was written by txl 0.1.0 (commit f60f960, before the 0.2 redesign); this module runs
with both package layouts, so the same script showed that the redesign reproduces it. ``golden_tiny_run.json`` was
written again when the CPU dropout started drawing its masks with :func:`transformer_xl.model.fastpath.keep_mask`
(another random stream, the same distribution to within ``2**-17``); :func:`previous_draws` puts the draws of the
earlier code back, under which the current code still reproduces the 0.1.0 file (``tests/train/test_trainer.py``):
what changed is the random stream, not the computation.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

#: Dropout and dropatt on, an adaptive softmax, batch chunks, warmup then cosine, two validations.
GOLDEN_RUN: dict[str, Any] = dict(
    model="tiny", batch_size=4, batch_chunk=2, lr=3e-3, warmup_step=3, max_step=20, eval_interval=10,
    log_interval=1, eval_max_tokens=300, save_interval=10, final_eval=False, progress=False, tensorboard=False,
    seed=5, model_overrides=dict(n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6,
                                 dropout=0.1, dropatt=0.1, cutoffs=[10, 25], div_val=2, tie_projs=[False, True, True]),
)
WORDS = ("the", "cat", "dog", "sat", "ran", "on", "under", "a", "mat", "log", "big", "small", "red", "blue", "one",
         "two", "three", "and", "then", "it", "was", "very", "quite", "not", "so", "here", "there", "up", "down")


def write_corpus(root: Path) -> Path:
    """``root/corpus/{train,valid,test}.txt`` of patterned word sentences (seeded)."""
    rng = random.Random(0)
    folder = root / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n_lines in (("train", 60), ("valid", 20), ("test", 20)):
        lines = []
        for _ in range(n_lines):
            a, b = rng.choice(WORDS), rng.choice(WORDS)
            lines.append(f"the {a} {b} sat on the {b} {a}")
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@contextlib.contextmanager
def previous_draws() -> Any:
    """The dropout draws of txl before :func:`~transformer_xl.model.fastpath.keep_mask`: ``rand >= p`` in the
    feed-forward and attention-output dropouts, ``bernoulli_(1 - p)`` (``F.dropout``) in the attention dropout and in
    ``nn.Dropout`` for the embeddings, the output and ``R`` (models made inside the block)."""
    from transformer_xl.model import fastpath, lm, positional, shifted

    saved = fastpath.keep_mask, shifted.keep_mask, lm.CompactDropout, positional.CompactDropout
    fastpath.keep_mask = lambda shape, p, device: torch.rand(shape, device=device) >= p
    shifted.keep_mask = lambda shape, p, device: torch.empty(shape, device=device).bernoulli_(1 - p).bool()
    lm.CompactDropout = positional.CompactDropout = torch.nn.Dropout
    try:
        yield
    finally:
        fastpath.keep_mask, shifted.keep_mask, lm.CompactDropout, positional.CompactDropout = saved


def golden_run(root: Path) -> dict[str, list[float]]:
    """Train :data:`GOLDEN_RUN` under ``root`` on one thread; the logged train/valid losses and learning rates."""
    try:  # txl >= 0.2
        from transformer_xl.train.config import TrainConfig
    except ImportError:  # txl 0.1
        from transformer_xl.train_config import TrainConfig  # type: ignore[no-redef]
    from transformer_xl.data import load_corpus
    from transformer_xl.train import Trainer

    torch.set_num_threads(1)
    data = write_corpus(root)
    # from_dict: the key tensorboard (txl 0.1 wrote it) is read and dropped
    cfg = TrainConfig.from_dict(dict(out_dir=str(root / "run"), dataset=str(data), **GOLDEN_RUN))
    with contextlib.redirect_stdout(sys.stderr):  # the run's validation lines
        Trainer(cfg, corpus=load_corpus(str(data), cache_dir=root / "cache")).fit()
    records = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"train_loss": [r["train_loss"] for r in records if r["kind"] == "train"],
            "lr": [r["lr"] for r in records if r["kind"] == "train"],
            "valid_loss": [r["valid_loss"] for r in records if r["kind"] == "valid"]}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        result = golden_run(Path(tmp))
    json.dump({"config": GOLDEN_RUN, **result}, sys.stdout, indent=1)
    sys.stdout.write("\n")
