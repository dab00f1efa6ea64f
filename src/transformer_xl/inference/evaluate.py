"""Evaluation with memory, as the official ``eval.py``.

**Transformer-XL evaluation** (:func:`evaluate`) follows the official ``eval.py``: with the evaluation
lengths (``tgt_len``, ``ext_len``, ``mem_len``, ``clamp_len``, ``same_length``; the model's unless given),
the split is cut by the official ordered iterator into ``batch_size`` contiguous streams of
``n_step = N // batch_size`` tokens, the segments of every stream are read in order with the memories carried
from one segment to the next (:class:`transformer_xl.model.Recurrence`), and the result is
``sum(seq_len * mean_nll) / sum(seq_len)`` over segments, which is the mean NLL (nats) over every scored token.
``ppl = exp(loss)``; for character/byte-level corpora ``bpc = loss / ln 2``.

Which tokens are scored (reported as ``tokens`` and ``unscored``): stream ``b`` holds corpus tokens
``[b * n_step, (b + 1) * n_step)``; each of its tokens except the first is a target exactly once. So
``(n_step - 1) * batch_size`` tokens are scored; the ``batch_size`` first tokens of the streams are never a
target (nothing precedes them in their stream), and the ``N - n_step * batch_size`` tokens of the tail are
dropped. Every stream also starts without memory, so its first tokens see a short context. With
``batch_size=1`` every token but the very first is scored, each with all the context the memory holds.

The vanilla sliding-window evaluation (Al-Rfou et al.) is :mod:`transformer_xl.inference.window`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from transformer_xl.devices import synchronize
from transformer_xl.errors import ConfigError, check_int
from transformer_xl.model import Recurrence, TransformerXLLM, eval_mode

__all__ = ["EvalResult", "describe", "evaluate", "memory_sweep", "replace_settings"]


@dataclass
class EvalResult:
    """One evaluation: mean NLL in nats over ``tokens`` scored tokens, and how it was computed."""

    loss: float
    tokens: int
    seconds: float
    char_level: bool = False
    unscored: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    nll: np.ndarray | None = field(default=None, repr=False)  # per corpus position, NaN where not scored

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def bpc(self) -> float | None:
        return self.loss / math.log(2) if self.char_level else None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        out = {"loss": self.loss, "ppl": self.ppl, "tokens": self.tokens, "unscored": self.unscored,
               "seconds": round(self.seconds, 4), "tokens_per_s": round(self.tokens_per_s, 2), **self.settings}
        if self.char_level:
            out["bpc"] = self.bpc
        return out


def device_of(model: TransformerXLLM, device: Any) -> torch.device:
    return torch.device(device) if device is not None else next(model.parameters()).device


@torch.no_grad()
def evaluate(model: TransformerXLLM, data: np.ndarray | torch.Tensor, *, batch_size: int = 10,
             tgt_len: int | None = None, mem_len: int | None = None, ext_len: int | None = None,
             clamp_len: int | None = None, same_length: bool | None = None, max_tokens: int | None = None,
             char_level: bool = False, return_nll: bool = False, device: Any = None,
             offsets: np.ndarray | None = None, autocast: contextlib.AbstractContextManager | None = None,
             inference_cache: bool = True, progress: str = "off", desc: str = "eval segment") -> EvalResult:
    """Score a token array with memory, as the official ``eval.py`` (see the module docstring).

    Lengths left ``None`` keep the model's. ``max_tokens`` evaluates only the first ``max_tokens + 1``
    tokens. ``return_nll`` also returns the per-token NLL in corpus order (``nll[i]`` scores ``data[i]``;
    NaN for the tokens not scored). ``offsets`` (sentence boundaries, One Billion Word) reads the split
    as sentence streams (:class:`transformer_xl.data.LMShuffledIterator`, unshuffled) instead of contiguous ones:
    the loss is then the mean over every predicted token of the complete batches. ``autocast`` is
    entered around every forward (mixed-precision validation during training). ``inference_cache`` reuses the
    memories' projected keys/values and ``W_kR R`` between segments (:class:`transformer_xl.model.InferenceCache`;
    the same values, each memory position projected once instead of once per segment it stays).
    ``progress`` (a :mod:`transformer_xl.data.progress` mode: ``"auto"``, ``"bar"``, ``"lines"``, ``"off"``) shows the
    segments
    on stderr when the evaluation lasts more than a moment: a bar, or a line every ~10 % with tokens/s and ETA.
    """
    from transformer_xl.data import LMOrderedIterator, LMShuffledIterator
    from transformer_xl.data.progress import Progress

    arr = np.asarray(data)
    if max_tokens is not None:
        arr = arr[: max_tokens + 1]
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if offsets is not None and return_nll:
        raise ConfigError("return_nll needs contiguous streams; it cannot be used with sentence offsets")
    lengths = model.config.lengths(mem_len=mem_len, ext_len=ext_len, clamp_len=clamp_len, same_length=same_length)
    tgt_len = check_int("tgt_len", model.config.tgt_len if tgt_len is None else tgt_len, 1)
    dev = device_of(model, device)
    if offsets is not None:
        off = np.asarray(offsets, dtype=np.int64)
        off = off[off <= arr.shape[0]]  # whole sentences within max_tokens
        it: Any = LMShuffledIterator(arr, off, batch_size, tgt_len, lengths.ext_len, device=dev)
    else:
        it = LMOrderedIterator(arr, batch_size, tgt_len, lengths.ext_len, device=dev)
    nll_out = np.full(arr.shape[0], np.nan) if return_nll else None
    total, count, tokens, pos = 0.0, 0, 0, 1
    rec = Recurrence(model, lengths, inference_cache=inference_cache)
    with eval_mode(model):
        synchronize(dev)
        start = time.perf_counter()
        segments = len(it) if hasattr(it, "__len__") else None
        bar = Progress(segments, desc=desc, unit="seg", mode=progress, min_seconds=2.0, rate_unit="tok")
        for batch in it:
            with autocast or contextlib.nullcontext():
                nll = rec(batch.input_ids, batch.targets).nll.double()  # [B, seq_len]
            total += batch.seq_len * nll.mean().item()  # official: seq_len * loss.mean()
            count += batch.seq_len
            tokens += nll.numel()
            if nll_out is not None:
                idx = np.arange(batch_size)[:, None] * it.n_step + np.arange(pos, pos + batch.seq_len)[None]
                nll_out[idx] = nll.cpu().numpy()
            pos += batch.seq_len
            bar.update(1, amount=nll.numel())
        bar.close()
        synchronize(dev)
        seconds = time.perf_counter() - start
    settings = dict(method="memory" if offsets is None else "memory-sentences", batch_size=batch_size,
                    tgt_len=tgt_len, ext_len=lengths.ext_len, mem_len=lengths.mem_len, clamp_len=lengths.clamp_len,
                    same_length=lengths.same_length)
    return EvalResult(loss=total / max(count, 1), tokens=tokens, seconds=seconds, char_level=char_level,
                      unscored=int(arr.shape[0]) - tokens, settings=settings, nll=nll_out)


def memory_sweep(model: TransformerXLLM, data: np.ndarray, mem_lens: Sequence[int], *,
                 on_result: Callable[[EvalResult], None] | None = None, **kwargs: Any) -> list[EvalResult]:
    """:func:`evaluate` once per memory length (how the loss falls as the memory grows); ``on_result`` is called
    with each result as soon as it is computed (e.g. to print the sweep row by row).

    ``same_length`` (given, or the model's) needs a memory, so it is switched off for ``mem_len=0`` (recorded in
    the settings).
    """
    results = []
    for mem in mem_lens:
        kw = dict(kwargs)
        if mem == 0 and (kw.get("same_length") or (kw.get("same_length") is None and model.config.same_length)):
            kw["same_length"] = False
        kw.setdefault("desc", f"eval mem_len {mem} segment")
        results.append(evaluate(model, data, mem_len=mem, **kw))
        if on_result is not None:
            on_result(results[-1])
    return results


def describe(result: EvalResult) -> str:
    """One line: loss, ppl or bpc, tokens and speed."""
    metric = f"bpc {result.bpc:.4f}" if result.char_level else f"ppl {result.ppl:.2f}"
    return (f"loss {result.loss:.4f} | {metric} | {result.tokens:,} tokens ({result.unscored} not scored) | "
            f"{result.seconds:.1f} s | {result.tokens_per_s:,.0f} tokens/s")


def replace_settings(result: EvalResult, **extra: Any) -> EvalResult:
    """A copy of ``result`` with more entries in ``settings`` (e.g. dataset and split names)."""
    return dataclasses.replace(result, settings={**result.settings, **extra})
