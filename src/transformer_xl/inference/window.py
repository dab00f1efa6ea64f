"""The vanilla sliding-window evaluation (Al-Rfou et al., 2018), the baseline of paper Sec. 4.5 and Table 9.

Token ``x_t`` is predicted from exactly the window
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

import time
from typing import Any

import numpy as np
import torch

from transformer_xl.devices import synchronize
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.inference.evaluate import EvalResult, device_of
from transformer_xl.model import TransformerXLLM, eval_mode


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
    cap = model.config.max_context
    if cap is not None and window > cap:
        raise ConfigError(f"attn_type 3 learned {cap} positions: a window of {window} tokens does not fit")
    dev = device_of(model, device)
    rows = rows or default_rows(model, window)
    out = np.empty(last - first, dtype=np.float64)
    lengths = model.config.lengths(mem_len=0, ext_len=0, same_length=False)  # no memory: the window only
    with eval_mode(model):
        t = first
        while t < min(window, last):  # short windows at the start: one forward each
            x = arr[None, :t].to(dev)
            out[t - first] = model(x, arr[None, t : t + 1].to(dev), lengths=lengths).nll.item()
            t += 1
        views = arr.unfold(0, window, 1)  # [N - L + 1, L]: views[s] = arr[s : s + L], predicts arr[s + L]
        while t < last:
            k = min(rows, last - t)
            x = views[t - window : t - window + k].to(dev)  # [k, L]
            y = arr[t : t + k, None].to(dev)  # [k, 1]
            out[t - first : t - first + k] = model(x, y, lengths=lengths).nll[:, 0].double().cpu().numpy()
            t += k
    return out


def evaluate_sliding_window(model: TransformerXLLM, data: np.ndarray, *, window: int, max_tokens: int | None = None,
                            rows: int | None = None, char_level: bool = False, return_nll: bool = False,
                            device: Any = None) -> EvalResult:
    """The vanilla evaluation of a whole split (every token but the first, each with its own window)."""
    arr = np.asarray(data)
    if max_tokens is not None:
        arr = arr[: max_tokens + 1]
    dev = device_of(model, device)
    synchronize(dev)
    start = time.perf_counter()
    nll = sliding_window_nll(model, arr, window=window, rows=rows, device=dev)
    synchronize(dev)
    seconds = time.perf_counter() - start
    full = None
    if return_nll:
        full = np.full(arr.shape[0], np.nan)
        full[1:] = nll
    settings = dict(method="sliding-window", window=window, rows=rows or default_rows(model, window))
    return EvalResult(loss=float(nll.mean()), tokens=int(nll.shape[0]), seconds=seconds, char_level=char_level,
                      unscored=1, settings=settings, nll=full)


