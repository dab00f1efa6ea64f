r"""Relative Effective Context Length (RECL), paper Sec. 4.3 and Appendix C (Table 8).

RECL is defined on a *group* of models ``M = {m_1, ..., m_N}`` so that all of them are compared with the same
baseline. With ``l_i(c, t) = -log P_{m_i}(x_t | x_{t-1}, ..., x_{t-c})`` the loss of model ``i`` on token
``t`` given exactly its previous ``c`` tokens, for a short context ``c`` and a long one ``c' >= c``:

.. math::

    b(c, t) &= \min_{i=1..N} l_i(c, t)                                   \quad\text{(group baseline)} \\
    \mathcal{T}_r(c) &= \text{the } \lceil r\,|T| \rceil \text{ positions } t \text{ with the largest } b(c, t)
                                                                         \quad\text{(top-}r\text{ hardest)} \\
    f_i(c, c') &= \frac{1}{|\mathcal{T}_r(c)|} \sum_{t \in \mathcal{T}_r(c)} \min\big(b(c, t),\, l_i(c', t)\big)
                                                                         \quad\text{(relative loss)} \\
    g_i(c, c') &= \frac{\exp f_i(c, c) - \exp f_i(c, c')}{\exp f_i(c, c)}
                                                                         \quad\text{(relative gain)}

Only improvements over the best short-context model count: a token where model ``i`` with the long context
is worse than the baseline contributes the baseline. Since ``b(c, t) <= l_i(c, t)``, ``f_i(c, c)`` is the
mean of ``b(c, t)`` over ``T_r(c)``, the same for every model of the group. The algorithm (Appendix C) with a
context grid ``c_0 < c_1 < ...`` of step ``Delta`` (the paper: ``Delta = 100`` words):

1. ``c = c_0``, ``c' = c_1``;
2. if ``g_i(c, c') < threshold`` (0.01, i.e. 1%) return ``RECL_i = c``; else ``c = c'``, ``c'`` = the next
   grid value, and repeat.

How ``l_i(c, t)`` is measured (:func:`context_losses`; one method for the whole group, :func:`group_losses`
takes it once, so a group cannot mix them):

* ``"window"`` (the default, :data:`DEFAULT_METHOD`): Appendix C's quantity itself. Token ``t`` is predicted
  from exactly ``x_{t-c} .. x_{t-1}``, fed as one segment without memory (the stride-1 sliding window of
  :func:`transformer_xl.inference.window.sliding_window_nll`, windows batched ``rows`` per forward; the truncated
  context of Khandelwal et al., 2018). Receptive field: ``c`` tokens, for every model and encoding.
* ``"attention-length"`` (alias ``"memory"``): the paper's evaluation with memory at attention length ``c``,
  ``mem_len = c`` with ``same_length`` (segments of ``tgt_len``), so every query attends to exactly ``c``
  positions, itself included, in every layer. Through the memories of the layers below, a prediction of an
  ``n_layer`` model can depend on up to ``n_layer * (c - 1) + 1`` input tokens (:func:`receptive_field`):
  253 at ``c = 64`` for 4 layers. It measures how a model uses its attention length, not Appendix C's
  ``l_i(c, t)``, and is reported under its own name.

Our interpretation where the paper is silent (all stated in the results):

* ``T`` is the set of scored token positions (the same for every model and context); ``|T_r| = ceil(r |T|)``,
  ties in ``b`` broken by position (stable sort). The hardest positions are chosen anew at every ``c``.
* The grid should be uniform, since the 1% threshold applies per step (a longer step passes it more easily):
  :func:`parse_grid` reads ``START:STOP:STEP``. A non-uniform grid is *accepted with a warning* (the CLI
  prints one; :func:`grid_step` is None and the results say so), not refused, so that older runs can be
  reproduced. If the gain is still above the threshold at the last step, RECL is the largest grid value and
  is marked *censored* (a lower bound).
* A model that cannot read more than ``L_max`` tokens (learned absolute positions, e.g. the Al-Rfou et al.
  Transformer whose Table 8 RECL is its training length 128) has ``l_i(c, t) = l_i(L_max, t)`` for
  ``c > L_max`` in the window method, and its RECL is reported as ``min(RECL_i, L_max)``.
* Noise (:func:`bootstrap_gains`): the scored positions are resampled with replacement ``B`` times (seeded);
  on each resample the whole computation (baseline, top-r set, gains, RECL) is redone, vectorised over the
  resamples as token weights (a position drawn ``k`` times counts ``k`` times). Reported: the standard
  deviation of each step's gain and the 5-95 % interval of the resampled RECL (grid values), next to each RECL.

Per-token losses are cached (:class:`LossCache`: ``.npy`` files, no pickle, and a JSON manifest keyed by the
model's weights digest, the data, the method and the context), so a long computation resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl.data.cache import read_npy
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.experiments.recl_metric import (  # noqa: F401 - the metric is part of this module's API
    ATTENTION_LENGTH,
    DEFAULT_METHOD,
    METHOD_ALIASES,
    METHODS,
    RECEPTIVE_FIELD,
    WINDOW,
    RECLResult,
    bootstrap_gains,
    check_method,
    compute_recl,
    grid_step,
    hardest,
    parse_grid,
    receptive_field,
    recl_from_gains,
    relative_gains,
    top_count,
    unnormalized_gains,
)
from transformer_xl.store.files import atomic_write, check_plain_name, read_json, write_json
from transformer_xl.store.layout import CACHE_MANIFEST


# ---------------------------------------------------------------------------------------------- cache
class LossCache:
    """Per-token loss arrays on disk: ``<dir>/<key digest>.npy`` plus ``<dir>/manifest.json``.

    Keys are JSON-able dicts (weights digest, dataset, split, positions, method, context, lengths); every
    write is atomic (temporary file, then rename), so an interrupted run resumes from the last array written.
    The manifest's entry names must be plain file names (a one-line :class:`DataError` otherwise, before any
    array is opened); an unreadable array is measured again.
    """

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.manifest_path = self.dir / CACHE_MANIFEST
        self.entries: dict[str, dict[str, Any]] = {}
        if self.manifest_path.is_file():
            what = f"loss cache manifest {self.manifest_path}"
            entries = read_json(self.manifest_path, what, DataError).get("entries")
            if not isinstance(entries, dict):
                raise DataError(f"{what} is unreadable (no 'entries' object)")
            for name, entry in entries.items():  # names become file names: checked before any is opened
                check_plain_name(name, what)
                if not isinstance(entry, dict) or not isinstance(entry.get("tokens"), int):
                    raise DataError(f"{what}: entry {name!r} has the wrong structure; delete the cache folder")
            self.entries = entries

    @staticmethod
    def digest(key: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, key: dict[str, Any]) -> np.ndarray | None:
        d = self.digest(key)
        entry = self.entries.get(d)
        path = self.dir / f"{d}.npy"
        if entry is None or not path.is_file():
            return None
        try:
            arr = read_npy(path)
        except ValueError:  # a damaged file is measured again
            return None
        return arr if arr.shape == (entry["tokens"],) else None

    def put(self, key: dict[str, Any], losses: np.ndarray) -> None:
        d = self.digest(key)
        arr = np.ascontiguousarray(losses, dtype=np.float32)
        atomic_write(self.dir / f"{d}.npy", lambda f: np.save(f, arr, allow_pickle=False))
        self.entries[d] = {"key": key, "tokens": int(arr.shape[0]), "mean": float(arr.mean())}
        write_json(self.manifest_path, {"version": 1, "entries": self.entries}, indent=1)


# ---------------------------------------------------------------------------------------------- measuring l_i(c, t)
def max_context(model: Any, method: str) -> int | None:
    """The longest context a model can read by ``method``: attn_type 3 windows stop at its learned positions."""
    return model.config.max_context if check_method(method) == WINDOW else None


def context_losses(model: Any, data: np.ndarray, context: int, *, method: str = DEFAULT_METHOD, start: int,
                   tokens: int, tgt_len: int = 32, clamp_len: int | None = None, rows: int | None = None,
                   device: Any = None) -> np.ndarray:
    """``l(c, t)`` for ``t`` in ``[start, start + tokens)`` (``start >= context``, so every context is full).

    ``"window"``: ``rows`` windows per forward (default: :func:`transformer_xl.inference.window.default_rows`);
    ``"attention-length"``: one stream, segments of ``tgt_len``, ``mem_len = context``, ``same_length``."""
    from transformer_xl.inference.evaluate import evaluate
    from transformer_xl.inference.window import sliding_window_nll

    method = check_method(method)
    if start < context:
        raise ConfigError(f"start ({start}) must be >= the context ({context}) so that every context is full")
    if start + tokens > len(data):
        raise DataError(f"{start + tokens} tokens needed, the split has {len(data)}")
    if method == WINDOW:
        return sliding_window_nll(model, data, window=context, first=start, last=start + tokens, rows=rows,
                                  device=device)
    res = evaluate(model, data[: start + tokens], batch_size=1, tgt_len=tgt_len, mem_len=context, ext_len=0,
                   same_length=True, clamp_len=clamp_len, return_nll=True, device=device)
    assert res.nll is not None
    return res.nll[start : start + tokens]


@dataclass
class GroupMember:
    """A model of the RECL group: name, loaded model and weights digest (the method is the group's)."""

    name: str
    model: Any
    digest: str


def group_receptive_fields(members: Sequence[GroupMember], contexts: Sequence[int],
                           method: str) -> dict[str, list[int]]:
    """Per model, the input tokens one prediction can depend on at each grid context (:func:`receptive_field`)."""
    return {m.name: [receptive_field(method, c, n_layer=m.model.config.n_layer,
                                     max_context=max_context(m.model, method)) for c in contexts] for m in members}


def group_losses(members: Sequence[GroupMember], data: np.ndarray, contexts: Sequence[int], *,
                 method: str = DEFAULT_METHOD, start: int, tokens: int, data_key: dict[str, Any],
                 cache: LossCache | None = None, tgt_len: int = 32, clamp_len: int | None = None,
                 rows: int | None = None, device: Any = None, progress: Callable[[str], None] | None = None,
                 bar: str = "off") -> tuple[np.ndarray, list[int | None]]:
    """Losses ``[models, contexts, tokens]`` for the group, every model measured by the one ``method``
    (cached), and each model's context cap. ``progress`` gets a line per (model, context); ``bar`` is a
    :mod:`transformer_xl.data.progress` mode for a bar over them."""
    from transformer_xl.data.progress import Progress

    method = check_method(method)
    out = np.empty((len(members), len(contexts), tokens))
    caps: list[int | None] = []
    with Progress(len(members) * len(contexts), desc="recl", unit="context", mode=bar) as p:
        for i, m in enumerate(members):
            caps.append(_member_losses(m, data, contexts, out[i], method=method, start=start, tokens=tokens,
                                       data_key=data_key, cache=cache, tgt_len=tgt_len, clamp_len=clamp_len,
                                       rows=rows, device=device, progress=progress, bar=p))
    return out, caps


def _member_losses(m: GroupMember, data: np.ndarray, contexts: Sequence[int], out: np.ndarray, *, method: str,
                   start: int, tokens: int, data_key: dict[str, Any], cache: LossCache | None, tgt_len: int,
                   clamp_len: int | None, rows: int | None, device: Any, progress: Callable[[str], None] | None,
                   bar: Any) -> int | None:
    """One model's losses into ``out[contexts, tokens]``; returns its context cap."""
    cap = max_context(m.model, method)
    memory = method == ATTENTION_LENGTH
    for k, c in enumerate(contexts):
        eff = min(c, cap) if cap is not None else c
        key = {"model": m.digest, **data_key, "start": start, "tokens": tokens, "method": method,
               "context": eff, "tgt_len": tgt_len if memory else None, "clamp_len": clamp_len if memory else None}
        arr = cache.get(key) if cache is not None else None
        state = "cached"
        if arr is None:
            arr = context_losses(m.model, data, eff, method=method, start=start, tokens=tokens, tgt_len=tgt_len,
                                 clamp_len=clamp_len, rows=rows, device=device)
            state = "computed"
            if cache is not None:
                cache.put(key, arr)
        out[k] = arr
        if progress is not None:
            progress(f"{m.name}: context {c}{f' (read at {eff})' if eff != c else ''} {state}, "
                     f"ppl {math.exp(float(np.mean(arr))):.3f}")
        bar.update(1)
    return cap
