"""Evaluation speed, Transformer-XL vs the vanilla sliding window (paper Sec. 4.5, Table 9).

For every attention length ``L`` two models of the same size (same ``n_layer``, ``d_model``, heads, inner
size and vocabulary) are timed on the same tokens, in one run:

* **Transformer-XL** (attn_type 0) evaluates with memory: ``xl_batch`` streams (default 10, the official
  ``eval.py`` batch) read in segments of ``tgt_len`` tokens with ``mem_len = L`` and ``same_length``, so
  every prediction attends to exactly ``L`` positions and the memory is reused from one segment to the
  next. The memory is filled first (untimed), then whole segments are timed.
* **Vanilla** (Al-Rfou et al., attn_type 3 with ``L`` learned positions, or attn_type 2) evaluates every
  token from its own window of the ``L`` previous tokens (:func:`txl.inference.window.sliding_window_nll`, stride 1),
  ``rows`` windows per forward. Only full windows are timed.

Per-token time is wall time / tokens predicted; the two are timed alternately ``repeats`` times and the
fastest repeat of each is kept (the one least disturbed by other processes on a shared machine; the medians
and every repeat are in the row too). The slow-down is vanilla / XL. The weights are
random (seeded): the time of a forward does not depend on their values. The paper's numbers (on a GPU, with
its WikiText-103/enwik8 models) are 363x at L = 800 and 1,874x at L = 3,800.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from txl.data.progress import Progress
from txl.errors import ConfigError, DataError
from txl.inference.window import default_rows, sliding_window_nll
from txl.model import Recurrence, TransformerXLLM, TXLConfig

CPU_LENGTHS = (128, 256, 512, 800)
GPU_LENGTHS = (128, 256, 512, 800, 1800, 2800, 3800)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _time_xl(model: TransformerXLLM, data: torch.Tensor, *, tgt_len: int, attn_len: int, segments: int,
             batch: int, device: torch.device) -> float:
    """Seconds per token of memory-reusing evaluation over ``batch`` streams, memory full."""
    rec = Recurrence(model, model.config.lengths(mem_len=attn_len, ext_len=0, same_length=True))  # as evaluate()
    fill = -(-attn_len // tgt_len)
    n_step = (fill + segments) * tgt_len + 1
    if data.shape[0] < n_step * batch:
        raise DataError(f"eval-speed needs {n_step * batch} tokens, the data has {data.shape[0]}")
    streams = data[: n_step * batch].view(batch, n_step)  # [B, n_step]
    for k in range(fill + segments):  # fill the memory (untimed), then time whole segments
        if k == fill:
            _sync(device)
            start = time.perf_counter()
        pos = k * tgt_len
        rec(streams[:, pos : pos + tgt_len].to(device), streams[:, pos + 1 : pos + 1 + tgt_len].to(device))
    _sync(device)
    return (time.perf_counter() - start) / (segments * tgt_len * batch)


def _time_vanilla(model: TransformerXLLM, data: np.ndarray, *, attn_len: int, rows: int, forwards: int,
                  device: torch.device) -> float:
    """Seconds per token of the stride-1 sliding window (full windows only)."""
    first = attn_len
    last = first + rows * forwards
    if data.shape[0] < last:
        raise DataError(f"eval-speed needs {last} tokens, the data has {data.shape[0]}")
    _sync(device)
    start = time.perf_counter()
    sliding_window_nll(model, data[:last], window=attn_len, first=first, last=last, rows=rows, device=device)
    _sync(device)
    return (time.perf_counter() - start) / (last - first)


def eval_speed(base: TXLConfig, data: np.ndarray, attn_lens: Sequence[int] = CPU_LENGTHS, *, tgt_len: int = 128,
               xl_batch: int = 10, vanilla_attn_type: int = 3, rows: int | None = None, xl_tokens: int = 2560,
               vanilla_tokens: int | None = None, repeats: int = 3, device: str | torch.device = "cpu",
               seed: int = 0, progress: Callable[[str], None] | None = None,
               bar: str = "off") -> list[dict[str, Any]]:
    """Per-token evaluation time of XL and of the vanilla window at each attention length (module docstring).

    ``base`` gives the shared size (its lengths and ``attn_type`` are replaced). ``xl_tokens`` tokens are
    timed for XL over ``xl_batch`` streams (the official eval batch is 10; rounded to whole segments),
    ``vanilla_tokens`` (default: ``rows``, at least 16) for the
    vanilla model, per repeat. ``progress`` gets a line per length; ``bar`` is a :mod:`txl.data.progress` mode
    for a bar over the lengths.
    """
    if vanilla_attn_type not in (2, 3):
        raise ConfigError(f"the vanilla model has absolute positions: attn_type 2 or 3, got {vanilla_attn_type}")
    if min(repeats, tgt_len, xl_tokens, xl_batch) < 1:
        raise ConfigError("repeats, tgt_len, xl_batch and xl_tokens must be >= 1")
    dev = torch.device(device)
    arr = np.asarray(data)
    tensor = torch.from_numpy(np.array(arr[: 1 << 20], dtype=np.int64))
    out: list[dict[str, Any]] = []
    with Progress(len(attn_lens), desc="eval-speed", unit="length", mode=bar) as p:
        for L in attn_lens:
            out.append(_speed_row(base, arr, tensor, L, tgt_len=tgt_len, xl_batch=xl_batch, rows=rows,
                                  vanilla_attn_type=vanilla_attn_type, xl_tokens=xl_tokens,
                                  vanilla_tokens=vanilla_tokens, repeats=repeats, dev=dev, seed=seed))
            row = out[-1]
            if progress is not None:
                progress(f"L={L}: XL {row['xl_ms_per_token']:.3f} ms/token, vanilla "
                         f"{row['vanilla_ms_per_token']:.2f} ms/token, slow-down {row['slowdown']:.0f}x")
            p.update(1)
    return out


def _speed_row(base: TXLConfig, arr: np.ndarray, tensor: torch.Tensor, L: int, *, tgt_len: int, xl_batch: int,
               rows: int | None, vanilla_attn_type: int, xl_tokens: int, vanilla_tokens: int | None, repeats: int,
               dev: torch.device, seed: int) -> dict[str, Any]:
    """The timings at attention length ``L``."""
    torch.manual_seed(seed)
    xl = TransformerXLLM(dataclasses.replace(base, attn_type=0, tgt_len=tgt_len, mem_len=L, ext_len=0,
                                             same_length=True, dropout=0.0, dropatt=0.0)).to(dev).eval()
    torch.manual_seed(seed)
    vanilla = TransformerXLLM(dataclasses.replace(base, attn_type=vanilla_attn_type, tgt_len=L, mem_len=0,
                                                  ext_len=0, same_length=False, untie_r=False, dropout=0.0,
                                                  dropatt=0.0)).to(dev).eval()
    n_rows = rows or min(default_rows(vanilla, L), 64)
    n_forwards = max(1, -(-(vanilla_tokens or max(16, n_rows)) // n_rows))
    segments = max(1, xl_tokens // (tgt_len * xl_batch))
    # warm-up (allocator, kernels), untimed
    _time_xl(xl, tensor, tgt_len=tgt_len, attn_len=L, segments=1, batch=xl_batch, device=dev)
    _time_vanilla(vanilla, arr, attn_len=L, rows=n_rows, forwards=1, device=dev)
    xl_t, van_t = [], []
    for _ in range(repeats):
        xl_t.append(_time_xl(xl, tensor, tgt_len=tgt_len, attn_len=L, segments=segments, batch=xl_batch,
                             device=dev))
        van_t.append(_time_vanilla(vanilla, arr, attn_len=L, rows=n_rows, forwards=n_forwards, device=dev))
    row = {"attn_len": L, "xl_tgt_len": tgt_len, "xl_batch": xl_batch, "xl_tokens": segments * tgt_len * xl_batch,
           "xl_ms_per_token": 1000 * min(xl_t), "xl_ms_median": 1000 * statistics.median(xl_t),
           "vanilla_rows": n_rows, "vanilla_tokens": n_rows * n_forwards,
           "vanilla_ms_per_token": 1000 * min(van_t), "vanilla_ms_median": 1000 * statistics.median(van_t),
           "xl_ms_all": [round(1000 * t, 4) for t in xl_t], "vanilla_ms_all": [round(1000 * t, 3) for t in van_t],
           "xl_params": xl.num_parameters(), "vanilla_params": vanilla.num_parameters(),
           "vanilla_attn_type": vanilla_attn_type, "repeats": repeats, "device": str(dev)}
    row["slowdown"] = row["vanilla_ms_per_token"] / row["xl_ms_per_token"]
    row["slowdown_median"] = row["vanilla_ms_median"] / row["xl_ms_median"]
    return row
