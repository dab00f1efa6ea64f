"""Evaluation speed, Transformer-XL vs the vanilla sliding window (paper Sec. 4.5, Table 9).

For every attention length ``L`` two models of the same size (same ``n_layer``, ``d_model``, heads, inner
size and vocabulary) are timed on the same tokens, in one run, and Transformer-XL twice:

* **Transformer-XL, txl's caches** (attn_type 0, ``Recurrence(inference_cache=True)``, what ``txl eval``
  does): ``xl_batch`` streams (default 10, the official ``eval.py`` batch) read in segments of ``tgt_len``
  tokens with ``mem_len = L`` and ``same_length``, so every prediction attends to exactly ``L`` positions.
  The memory's keys/values are projected once, when a position is new, and written into append-only
  buffers; the projected position table ``W_kR R`` is kept from one segment to the next
  (:mod:`transformer_xl.model.cache`).
* **Transformer-XL, cache-free** (the same model, ``inference_cache=False``): the plain formula, as the
  paper's implementation ran: every segment projects the keys/values of all ``L`` memory positions of every
  layer again, concatenates ``[SG(m); h]``, and projects the position table again. (The official code also
  projects queries for the memory positions and throws them away; txl's plain formula does not, so this
  variant is, if anything, a little faster than the paper's code.)
* **Vanilla** (Al-Rfou et al., attn_type 3 with ``L`` learned positions, or attn_type 2) evaluates every
  token from its own window of the ``L`` previous tokens (:func:`transformer_xl.inference.window.sliding_window_nll`,
  stride 1), ``rows`` windows per forward. Only full windows are timed.

For each XL variant the memory is filled first (untimed), then ``xl_segments`` whole segments are timed
(default 20: ``20 * 10 * 128`` = 25,600 predictions at the defaults, long enough to include the periodic
copies of the cache buffers' live window); the vanilla model is timed over ``vanilla_forwards`` forwards
(default 8). A repeat times the three back to back (cached XL, cache-free XL, vanilla), after one untimed
warm-up of each; ``repeats`` repeats (default 5) are run.

**The statistic is the median over repeats**, everywhere: a per-token time is the median of the repeats'
times, and a slow-down (vanilla / XL) is the median of the repeats' own ratios (each compares timings
taken back to back, under the same load). The spread reported beside each is the minimum and maximum over
the repeats, and every repeat is kept in the row (``*_all``). On CUDA the device is synchronized before
each timer is read. The weights are random (seeded): the time of a forward does not depend on their values.
The paper's numbers (per-token time on one GPU, with the paper's own models and its cache-free code) are
363x at ``L = 800`` and 1,874x at ``L = 3,800``; ``docs/eval-speed.md`` says why txl's ratios are not
directly comparable with them.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from transformer_xl.data.progress import Progress
from transformer_xl.devices import synchronize
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.inference.loading import check_device
from transformer_xl.inference.window import default_rows, sliding_window_nll
from transformer_xl.model import Recurrence, TransformerXLLM, TXLConfig

CPU_LENGTHS = (128, 256, 512, 800)
GPU_LENGTHS = (128, 256, 512, 800, 1800, 2800, 3800)
#: The statistic kept over repeats (module docstring): said in the CLI help, the tables and the rows.
STATISTIC = "median"
#: The timed variants, in the order a repeat runs them: (row key prefix, label).
VARIANTS = (("xl_cached", "Transformer-XL, txl's caches"),
            ("xl_uncached", "Transformer-XL, cache-free (as the paper's code)"),
            ("vanilla", "vanilla sliding window"))


@torch.no_grad()
def _time_xl(model: TransformerXLLM, data: torch.Tensor, *, tgt_len: int, attn_len: int, segments: int,
             batch: int, device: torch.device, inference_cache: bool) -> float:
    """Seconds per token of memory-reusing evaluation over ``batch`` streams, memory full, with or without
    txl's inference cache."""
    rec = Recurrence(model, model.config.lengths(mem_len=attn_len, ext_len=0, same_length=True),  # as evaluate()
                     inference_cache=inference_cache)
    fill = -(-attn_len // tgt_len)
    n_step = (fill + segments) * tgt_len + 1
    if data.shape[0] < n_step * batch:
        raise DataError(f"eval-speed needs {n_step * batch} tokens, the data has {data.shape[0]}")
    streams = data[: n_step * batch].view(batch, n_step)  # [B, n_step]
    for k in range(fill + segments):  # fill the memory (untimed), then time whole segments
        if k == fill:
            synchronize(device)
            start = time.perf_counter()
        pos = k * tgt_len
        rec(streams[:, pos : pos + tgt_len].to(device), streams[:, pos + 1 : pos + 1 + tgt_len].to(device))
    synchronize(device)
    return (time.perf_counter() - start) / (segments * tgt_len * batch)


def _time_vanilla(model: TransformerXLLM, data: np.ndarray, *, attn_len: int, rows: int, forwards: int,
                  device: torch.device) -> float:
    """Seconds per token of the stride-1 sliding window (full windows only, ``forwards`` forwards of ``rows``)."""
    first = attn_len
    last = first + rows * forwards
    if data.shape[0] < last:
        raise DataError(f"eval-speed needs {last} tokens, the data has {data.shape[0]}")
    synchronize(device)
    start = time.perf_counter()
    sliding_window_nll(model, data[:last], window=attn_len, first=first, last=last, rows=rows, device=device)
    synchronize(device)
    return (time.perf_counter() - start) / (last - first)


def eval_speed(base: TXLConfig, data: np.ndarray, attn_lens: Sequence[int] = CPU_LENGTHS, *, tgt_len: int = 128,
               xl_batch: int = 10, vanilla_attn_type: int = 3, rows: int | None = None, xl_segments: int = 20,
               vanilla_forwards: int = 8, repeats: int = 5, device: str | torch.device = "cpu", seed: int = 0,
               progress: Callable[[str], None] | None = None, bar: str = "off") -> list[dict[str, Any]]:
    """Per-token evaluation time of cached XL, cache-free XL and the vanilla window at each attention length,
    one row per length (module docstring; every figure the median over ``repeats``, with its min and max).

    ``base`` gives the shared size (its lengths and ``attn_type`` are replaced). Per repeat, each XL variant
    is timed over ``xl_segments`` segments of ``xl_batch`` streams x ``tgt_len`` tokens (after filling its
    memory), the vanilla model over ``vanilla_forwards`` forwards of ``rows`` windows (default: by memory,
    at most 64). ``progress`` gets a line per length; ``bar`` is a :mod:`transformer_xl.data.progress` mode for a bar
    over the lengths.
    """
    if vanilla_attn_type not in (2, 3):
        raise ConfigError(f"the vanilla model has absolute positions: attn_type 2 or 3, got {vanilla_attn_type}")
    counts = dict(repeats=repeats, tgt_len=tgt_len, xl_batch=xl_batch, xl_segments=xl_segments,
                  vanilla_forwards=vanilla_forwards)
    bad = [f"{k} = {v}" for k, v in counts.items() if v < 1]
    if rows is not None and rows < 1:
        bad.append(f"rows = {rows}")
    if bad:
        raise ConfigError(f"eval-speed counts must be >= 1: {', '.join(bad)}")
    if not attn_lens or min(attn_lens) < 1:
        raise ConfigError(f"attention lengths must be >= 1, got {list(attn_lens)}")
    dev = check_device(device)
    arr = np.asarray(data)
    need = max((-(-L // tgt_len) + xl_segments) * tgt_len + 1 for L in attn_lens) * xl_batch  # fill + timed
    if arr.shape[0] < need:  # before any length is timed
        raise DataError(f"eval-speed needs {need} tokens for L = {max(attn_lens)}, the data has {arr.shape[0]}")
    tensor = torch.from_numpy(np.array(arr[:need], dtype=np.int64))
    out: list[dict[str, Any]] = []
    with Progress(len(attn_lens), desc="eval-speed", unit="length", mode=bar) as p:
        for L in attn_lens:
            row = _speed_row(base, arr, tensor, L, tgt_len=tgt_len, xl_batch=xl_batch, rows=rows,
                             vanilla_attn_type=vanilla_attn_type, xl_segments=xl_segments,
                             vanilla_forwards=vanilla_forwards, repeats=repeats, dev=dev, seed=seed)
            out.append(row)
            if progress is not None:
                progress(f"L={L}: XL {row['xl_cached_ms_per_token']:.3f} ms/token with txl's caches, "
                         f"{row['xl_uncached_ms_per_token']:.3f} cache-free; vanilla "
                         f"{row['vanilla_ms_per_token']:.2f} ms/token; slow-down {row['slowdown_cached']:.0f}x "
                         f"/ {row['slowdown_uncached']:.0f}x ({STATISTIC}s of {repeats})")
            p.update(1)
    return out


def _spread(values: Sequence[float], key: str, scale: float = 1.0, digits: int = 4) -> dict[str, Any]:
    """``key`` (the median), ``key_min``, ``key_max`` and ``key_all`` (every repeat) of ``values * scale``."""
    return {key: scale * statistics.median(values), f"{key}_min": scale * min(values),
            f"{key}_max": scale * max(values), f"{key}_all": [round(scale * v, digits) for v in values]}


def _speed_row(base: TXLConfig, arr: np.ndarray, tensor: torch.Tensor, L: int, *, tgt_len: int, xl_batch: int,
               rows: int | None, vanilla_attn_type: int, xl_segments: int, vanilla_forwards: int, repeats: int,
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

    def time_xl(cache: bool, segments: int) -> float:
        return _time_xl(xl, tensor, tgt_len=tgt_len, attn_len=L, segments=segments, batch=xl_batch, device=dev,
                        inference_cache=cache)

    def time_vanilla(forwards: int) -> float:
        return _time_vanilla(vanilla, arr, attn_len=L, rows=n_rows, forwards=forwards, device=dev)

    # warm-up (allocator, kernels), untimed
    time_xl(True, 1)
    time_xl(False, 1)
    time_vanilla(1)
    times: dict[str, list[float]] = {name: [] for name, _ in VARIANTS}
    for _ in range(repeats):  # the three back to back, so that a repeat's ratios compare the same load
        times["xl_cached"].append(time_xl(True, xl_segments))
        times["xl_uncached"].append(time_xl(False, xl_segments))
        times["vanilla"].append(time_vanilla(vanilla_forwards))
    row: dict[str, Any] = {
        "attn_len": L, "statistic": STATISTIC, "repeats": repeats, "device": str(dev),
        "threads": torch.get_num_threads() if dev.type == "cpu" else None,
        "xl_tgt_len": tgt_len, "xl_batch": xl_batch, "xl_segments": xl_segments,
        "xl_tokens": xl_segments * tgt_len * xl_batch,
        "vanilla_attn_type": vanilla_attn_type, "vanilla_rows": n_rows, "vanilla_forwards": vanilla_forwards,
        "vanilla_tokens": n_rows * vanilla_forwards,
        "xl_params": xl.num_parameters(), "vanilla_params": vanilla.num_parameters(),
    }
    for name, _ in VARIANTS:
        row.update(_spread(times[name], f"{name}_ms_per_token", scale=1000.0))
    for name in ("cached", "uncached"):  # vanilla / XL, per repeat
        ratios = [v / x for v, x in zip(times["vanilla"], times[f"xl_{name}"])]
        row.update(_spread(ratios, f"slowdown_{name}", digits=2))
    caches = [u / c for u, c in zip(times["xl_uncached"], times["xl_cached"])]  # what txl's caches save
    row.update(_spread(caches, "cache_speedup", digits=3))
    return row
