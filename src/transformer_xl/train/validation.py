"""Evaluation during and after training, with the official ``train.py`` / ``eval.py`` lengths.

* **Validation** (every ``eval_interval`` steps): segments of ``eval_tgt_len`` with the memory extended so that
  every query keeps ``tgt_len + mem_len`` of context (``mem_len + tgt_len - eval_tgt_len``; without memory,
  the difference goes to ``ext_len``), batch ``eval_batch_size``.
* **Final evaluation** of the best model on valid and test: the ``test_*`` settings (each official run
  script's ``eval.py`` branch), falling back to ``eval_tgt_len`` and the memory that keeps ``tgt_len + mem_len``
  of context (0 without memory; validation keeps at least 1).

Scores are :func:`transformer_xl.inference.evaluate.evaluate`'s: mean NLL in nats over every scored token; ppl =
exp(loss), and for a character- or byte-level corpus bpc = loss / ln 2 (a word-level score has no bpc). A printed
score says what it covers (:func:`scope`): validation may read only the first ``eval_max_tokens`` tokens, the final
evaluation reads the whole splits.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from transformer_xl.data.progress import progress_mode
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.train.config import TrainConfig


def validation_lengths(m: TXLConfig, cfg: TrainConfig) -> dict[str, int]:
    """``tgt_len``, ``mem_len``, ``ext_len`` of the official in-training validation."""
    tgt = cfg.eval_tgt_len or m.tgt_len
    if m.mem_len == 0:
        return dict(tgt_len=tgt, ext_len=max(0, m.ext_len + m.tgt_len - tgt), mem_len=0)
    return dict(tgt_len=tgt, ext_len=m.ext_len, mem_len=max(1, m.mem_len + m.tgt_len - tgt))


def test_lengths(m: TXLConfig, cfg: TrainConfig) -> dict[str, Any]:
    """``tgt_len``, ``mem_len``, ``clamp_len``, ``same_length`` of the final evaluation."""
    tgt = cfg.test_tgt_len or cfg.eval_tgt_len or m.tgt_len
    mem = cfg.test_mem_len if cfg.test_mem_len is not None else (m.mem_len and m.mem_len + m.tgt_len - tgt)
    return dict(tgt_len=tgt, mem_len=max(0, mem), clamp_len=cfg.test_clamp_len, same_length=cfg.test_same_length)


def final_evaluation(model: TransformerXLLM, best: Path, corpus: Any, cfg: TrainConfig, *, device: Any,
                     autocast: contextlib.AbstractContextManager | None = None,
                     progress: str | None = None) -> dict[str, Any]:
    """The model in ``best/`` (else ``model``, the last one) on ``valid`` and ``test`` with :func:`test_lengths`, and
    its wall time (``minutes``). Unless ``progress`` (a :mod:`transformer_xl.data.progress` mode; default: as
    ``cfg.progress`` says for training) is ``"off"``, a line on stderr says what it scores as it starts, and each
    split's evaluation shows its progress (a bar on a terminal, else a line now and then)."""
    began = time.monotonic()
    progress = progress_mode(cfg.progress) if progress is None else progress
    if best.is_dir():
        model = TransformerXLLM.from_pretrained(best, map_location=device)
    lengths = test_lengths(model.config, cfg)
    out: dict[str, Any] = {"model": str(best if best.is_dir() else "last"), **lengths,
                           "batch_size": cfg.test_batch_size}
    splits = [split for split in ("valid", "test") if split in corpus.splits]
    if progress != "off" and splits:
        sizes = ", ".join(f"{split} {len(corpus.splits[split]):,} tokens" for split in splits)
        what = best if best.is_dir() else "the last model"
        print(f"txl train: final evaluation of {what} on the whole splits ({sizes})", file=sys.stderr, flush=True)
    for split in splits:
        out[split] = score_split(model, corpus, split, cfg.test_batch_size, device=device, autocast=autocast,
                                 progress=progress, desc=f"final evaluation, {split}: segment", **lengths)
    out["minutes"] = round((time.monotonic() - began) / 60, 2)
    return out


def scope(scored: int, max_tokens: int | None = None, split_tokens: int | None = None) -> str:
    """What a score covers, for the line that prints it: ``"first 20,000 tokens"`` (a validation cut to
    ``max_tokens`` of a split of ``split_tokens``) or ``"whole split, 217,630 tokens"`` (``scored``: the tokens
    scored)."""
    if max_tokens is not None and split_tokens is not None and max_tokens + 1 < split_tokens:
        return f"first {max_tokens:,} tokens"
    return f"whole split, {scored:,} tokens"


def score_split(model: TransformerXLLM, corpus: Any, split: str, batch_size: int, *, device: Any,
                autocast: contextlib.AbstractContextManager | None = None, **kwargs: Any) -> dict[str, Any]:
    """:func:`evaluate` on a split of ``corpus`` as a JSON-ready dict (``loss``, ``ppl``, and ``bpc`` for a
    character-level corpus only: :meth:`~transformer_xl.inference.evaluate.EvalResult.to_dict`); a validation cut
    shorter than two tokens per stream gets fewer streams."""
    data = corpus.splits[split]
    max_tokens = kwargs.get("max_tokens")
    n = len(data) if max_tokens is None else min(len(data), max_tokens + 1)
    batch_size = min(batch_size, max(1, (n - 1) // 2))
    res = evaluate(model, data, batch_size=batch_size, device=device, char_level=corpus.char_level,
                   offsets=corpus.sentence_offsets(split), autocast=autocast, **kwargs)
    return res.to_dict()
