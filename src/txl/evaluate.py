"""Evaluation with memory (official ``eval.py``) and the vanilla sliding-window baseline (paper Sec. 4.5).

**Transformer-XL evaluation** (:func:`evaluate`) follows the official ``eval.py``: the lengths are set on the
model (``tgt_len``, ``ext_len``, ``mem_len``, ``clamp_len``, ``same_length``), the split is cut by the
official ordered iterator into ``batch_size`` contiguous streams of ``n_step = N // batch_size`` tokens, the
segments of every stream are read in order with the memories carried from one segment to the next, and the
result is ``sum(seq_len * mean_nll) / sum(seq_len)`` over segments, which is the mean NLL (nats) over every
scored token. ``ppl = exp(loss)``; for character/byte-level corpora ``bpc = loss / ln 2``.

Which tokens are scored (reported as ``tokens`` and ``unscored``): stream ``b`` holds corpus tokens
``[b * n_step, (b + 1) * n_step)``; each of its tokens except the first is a target exactly once. So
``(n_step - 1) * batch_size`` tokens are scored; the ``batch_size`` first tokens of the streams are never a
target (nothing precedes them in their stream), and the ``N - n_step * batch_size`` tokens of the tail are
dropped. Every stream also starts without memory, so its first tokens see a short context. With
``batch_size=1`` every token but the very first is scored, each with all the context the memory holds.

**Vanilla sliding window** (:func:`sliding_window_nll`, :func:`evaluate_sliding_window`): the evaluation of
Al-Rfou et al. (2018) that the paper times in Table 9. Token ``x_t`` is predicted from exactly the window
``x_{t-L} .. x_{t-1}`` of the ``L`` previous tokens (``x_0 .. x_{t-1}`` when ``t < L``): the window is fed as
one segment without memory and only the last position's prediction is scored, so the window moves by one
token per prediction (stride 1) and nothing is reused between predictions. Full windows are batched as the
rows of one ``[rows, L]`` forward (a strided view of the data, no copy until the batch is built); the softmax
is computed for the last position only. With absolute positions (attn_type 2 and 3) the last position always
gets the same position index (the official tables are right-aligned), so every row sees the same positions;
the ``L - 1`` shorter windows at the start of the data each need their own forward. Every layer still
computes all ``L`` positions (the top layer could skip all but the last query, a saving of at most
``1 / n_layer`` that we do not take).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from txl.errors import CheckpointError, ConfigError, DataError
from txl.model import TransformerXLLM

__all__ = [
    "EvalResult",
    "evaluate",
    "evaluate_sliding_window",
    "load_model",
    "memory_sweep",
    "parse_int_list",
    "resolve_model_dir",
    "sliding_window_nll",
    "weights_digest",
]

_WEIGHTS, _CONFIG = "model.safetensors", "config.json"


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


# ---------------------------------------------------------------------------------------------- loading
def resolve_model_dir(path: str | Path) -> Path:
    """The weights directory behind ``path``: a model directory (``config.json`` + ``model.safetensors``,
    e.g. ``RUN/best``), a checkpoint ``step_*`` directory, or a run directory (its ``best/``, else ``final/``,
    else its newest ``checkpoints/step_*``)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no such model or run directory: {path}")
    if (path / _WEIGHTS).is_file() and (path / _CONFIG).is_file():
        return path
    for sub in ("best", "final"):
        if (path / sub / _WEIGHTS).is_file():
            return path / sub
    steps = sorted(p for p in (path / "checkpoints").glob("step_*") if (p / _WEIGHTS).is_file())
    if steps:
        return steps[-1]
    raise CheckpointError(f"{path} holds no model: expected {_CONFIG} + {_WEIGHTS}, or a run directory with "
                          "best/, final/ or checkpoints/step_*/")


def weights_digest(directory: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of a model directory's ``model.safetensors``: a cache key for its outputs."""
    h = hashlib.sha256()
    with open(Path(directory) / _WEIGHTS, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def load_model(path: str | Path, *, device: str | torch.device = "cpu") -> tuple[TransformerXLLM, Path]:
    """Load the model behind ``path`` (see :func:`resolve_model_dir`) in eval mode; returns it and its directory.

    A checkpoint with a ``MANIFEST.json`` is verified against its SHA-256 sums first.
    """
    directory = resolve_model_dir(path)
    if (directory / "MANIFEST.json").is_file():
        from txl.checkpoint import verify_checkpoint

        verify_checkpoint(directory)
    model = TransformerXLLM.from_pretrained(directory, map_location=device)
    return model.eval(), directory


def parse_int_list(text: str | int | Sequence[int], name: str = "value", *, minimum: int = 0) -> list[int]:
    """``"0,128,512"`` -> ``[0, 128, 512]``; a one-line :class:`ConfigError` for anything else."""
    if isinstance(text, int):
        items: list[Any] = [text]
    elif isinstance(text, str):
        items = [t.strip() for t in text.split(",")]
    else:
        items = list(text)
    out = []
    for item in items:
        try:
            value = int(item)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} values must be >= {minimum}, got {value}")
        out.append(value)
    if not out:
        raise ConfigError(f"{name} is empty")
    return out


@contextlib.contextmanager
def _lengths(model: TransformerXLLM, **lengths: Any) -> Iterator[None]:
    """Evaluation-time lengths (``reset_length``, validated), eval mode; both restored afterwards."""
    saved, was_training = model.config, model.training
    try:
        model.reset_length(**{k: v for k, v in lengths.items() if v is not None})
        model.eval()
        yield
    finally:
        model.config = saved
        model.train(was_training)


def _device_of(model: TransformerXLLM, device: Any) -> torch.device:
    return torch.device(device) if device is not None else next(model.parameters()).device


# ---------------------------------------------------------------------------------------------- memory
@torch.no_grad()
def evaluate(model: TransformerXLLM, data: np.ndarray | torch.Tensor, *, batch_size: int = 10,
             tgt_len: int | None = None, mem_len: int | None = None, ext_len: int | None = None,
             clamp_len: int | None = None, same_length: bool | None = None, max_tokens: int | None = None,
             char_level: bool = False, return_nll: bool = False, device: Any = None,
             offsets: np.ndarray | None = None, autocast: contextlib.AbstractContextManager | None = None,
             cache_kv: bool = True) -> EvalResult:
    """Score a token array with memory, as the official ``eval.py`` (see the module docstring).

    Lengths left ``None`` keep the model's. ``max_tokens`` evaluates only the first ``max_tokens + 1``
    tokens. ``return_nll`` also returns the per-token NLL in corpus order (``nll[i]`` scores ``data[i]``;
    NaN for the tokens not scored). ``offsets`` (sentence boundaries, One Billion Word) reads the split
    as sentence streams (:class:`txl.data.LMShuffledIterator`, unshuffled) instead of contiguous ones:
    the loss is then the mean over every predicted token of the complete batches. ``autocast`` is
    entered around every forward (mixed-precision validation during training). ``cache_kv`` keeps the
    memories' projected keys/values between segments (``TransformerXLLM.forward(mem_kv=...)``; the same
    values, each position projected once instead of once per segment it spends in memory).
    """
    from txl.data import LMOrderedIterator, LMShuffledIterator

    arr = np.asarray(data)
    if max_tokens is not None:
        arr = arr[: max_tokens + 1]
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if offsets is not None and return_nll:
        raise ConfigError("return_nll needs contiguous streams; it cannot be used with sentence offsets")
    dev = _device_of(model, device)
    with _lengths(model, tgt_len=tgt_len, mem_len=mem_len, ext_len=ext_len, clamp_len=clamp_len,
                  same_length=same_length):
        cfg = model.config
        if offsets is not None:
            off = np.asarray(offsets, dtype=np.int64)
            off = off[off <= arr.shape[0]]  # whole sentences within max_tokens
            it: Any = LMShuffledIterator(arr, off, batch_size, cfg.tgt_len, cfg.ext_len, device=dev)
        else:
            it = LMOrderedIterator(arr, batch_size, cfg.tgt_len, cfg.ext_len, device=dev)
        nll_out = np.full(arr.shape[0], np.nan) if return_nll else None
        total, count, tokens, mems, pos = 0.0, 0, 0, None, 1
        kv: list[torch.Tensor] | None = [] if cache_kv else None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for batch in it:
            with autocast or contextlib.nullcontext():
                out = model(batch.input_ids, batch.targets, mems, mem_kv=kv)
            mems, kv = out.mems, out.mem_kv
            nll = out.nll.double()  # [B, seq_len]
            total += batch.seq_len * nll.mean().item()  # official: seq_len * loss.mean()
            count += batch.seq_len
            tokens += nll.numel()
            if nll_out is not None:
                idx = np.arange(batch_size)[:, None] * it.n_step + np.arange(pos, pos + batch.seq_len)[None]
                nll_out[idx] = nll.cpu().numpy()
            pos += batch.seq_len
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - start
        settings = dict(method="memory" if offsets is None else "memory-sentences", batch_size=batch_size,
                        tgt_len=cfg.tgt_len, ext_len=cfg.ext_len, mem_len=cfg.mem_len, clamp_len=cfg.clamp_len,
                        same_length=cfg.same_length)
    return EvalResult(loss=total / max(count, 1), tokens=tokens, seconds=seconds, char_level=char_level,
                      unscored=int(arr.shape[0]) - tokens, settings=settings, nll=nll_out)


def memory_sweep(model: TransformerXLLM, data: np.ndarray, mem_lens: Sequence[int], **kwargs: Any) -> list[EvalResult]:
    """:func:`evaluate` once per memory length (how the loss falls as the memory grows).

    ``same_length`` needs a memory, so it is switched off for ``mem_len=0`` (recorded in the settings).
    """
    results = []
    for mem in mem_lens:
        kw = dict(kwargs)
        if mem == 0 and kw.get("same_length"):
            kw["same_length"] = False
        results.append(evaluate(model, data, mem_len=mem, **kw))
    return results


# ---------------------------------------------------------------------------------------------- sliding window
def _max_window(model: TransformerXLLM) -> int | None:
    """The longest window the model can read without memory (attn_type 3 learned positions), else None."""
    built = model.built_config
    return built.max_klen if built.attn_type == 3 else None


def default_rows(model: TransformerXLLM, window: int, budget_mb: float = 256.0) -> int:
    """Windows per forward: attention scores ``rows * n_head * L * L`` floats within ``budget_mb``, at most 256."""
    per_row = 4.0 * model.config.n_head * window * window * 3  # scores, probabilities, one temporary
    return int(max(1, min(256, budget_mb * 2**20 // per_row)))


@torch.no_grad()
def sliding_window_nll(model: TransformerXLLM, data: np.ndarray | torch.Tensor, *, window: int, first: int = 1,
                       last: int | None = None, rows: int | None = None, device: Any = None) -> np.ndarray:
    """``out[t - first] = -log P(x_t | x_{max(0, t-window)} .. x_{t-1})`` for ``t`` in ``[first, last)``.

    Each prediction is one forward of its own window without memory (stride 1, module docstring); full
    windows go ``rows`` at a time (default :func:`default_rows`).
    """
    n = len(data)
    last = n if last is None else last
    if window < 1:
        raise ConfigError(f"window must be >= 1, got {window}")
    if not 1 <= first < last <= n:
        raise DataError(f"positions [{first}, {last}) are not inside the {n} tokens (first >= 1)")
    arr = torch.from_numpy(np.array(data[:last], dtype=np.int64))  # a writable copy of what is read
    cap = _max_window(model)
    if cap is not None and window > cap:
        raise ConfigError(f"attn_type 3 learned {cap} positions: a window of {window} tokens does not fit")
    dev = _device_of(model, device)
    rows = rows or default_rows(model, window)
    out = np.empty(last - first, dtype=np.float64)
    with _lengths(model, mem_len=0, ext_len=0, same_length=False):
        t = first
        while t < min(window, last):  # short windows at the start: one forward each
            x = arr[None, :t].to(dev)
            out[t - first] = model(x, arr[None, t : t + 1].to(dev)).nll.item()
            t += 1
        views = arr.unfold(0, window, 1)  # [N - L + 1, L]: views[s] = arr[s : s + L], predicts arr[s + L]
        while t < last:
            k = min(rows, last - t)
            x = views[t - window : t - window + k].to(dev)  # [k, L]
            y = arr[t : t + k, None].to(dev)  # [k, 1]
            out[t - first : t - first + k] = model(x, y).nll[:, 0].double().cpu().numpy()
            t += k
    return out


def evaluate_sliding_window(model: TransformerXLLM, data: np.ndarray, *, window: int, max_tokens: int | None = None,
                            rows: int | None = None, char_level: bool = False, return_nll: bool = False,
                            device: Any = None) -> EvalResult:
    """The vanilla evaluation of a whole split (every token but the first, each with its own window)."""
    arr = np.asarray(data)
    if max_tokens is not None:
        arr = arr[: max_tokens + 1]
    dev = _device_of(model, device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    start = time.perf_counter()
    nll = sliding_window_nll(model, arr, window=window, rows=rows, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - start
    full = None
    if return_nll:
        full = np.full(arr.shape[0], np.nan)
        full[1:] = nll
    settings = dict(method="sliding-window", window=window, rows=rows or default_rows(model, window))
    return EvalResult(loss=float(nll.mean()), tokens=int(nll.shape[0]), seconds=seconds, char_level=char_level,
                      unscored=1, settings=settings, nll=full)


def describe(result: EvalResult) -> str:
    """One line: loss, ppl or bpc, tokens and speed."""
    metric = f"bpc {result.bpc:.4f}" if result.char_level else f"ppl {result.ppl:.2f}"
    return (f"loss {result.loss:.4f} | {metric} | {result.tokens:,} tokens ({result.unscored} not scored) | "
            f"{result.seconds:.1f} s | {result.tokens_per_s:,.0f} tokens/s")


def replace_settings(result: EvalResult, **extra: Any) -> EvalResult:
    """A copy of ``result`` with more entries in ``settings`` (e.g. dataset and split names)."""
    return dataclasses.replace(result, settings={**result.settings, **extra})
