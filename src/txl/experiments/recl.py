r"""Relative Effective Context Length (RECL), paper Sec. 4.3 and Appendix C (Table 8).

RECL is defined on a *group* of models ``M = {m_1, ..., m_N}`` so that all of them are compared with the same
baseline. With ``l_i(c, t) = -log P_{m_i}(x_t | x_{t-1}, ..., x_{t-c})`` the loss of model ``i`` on token
``t`` with a context of length ``c``, for a short context ``c`` and a long one ``c' >= c``:

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
context grid ``c_0 < c_1 < ...`` (the paper steps by ``Delta = 100`` words):

1. ``c = c_0``, ``c' = c_1``;
2. if ``g_i(c, c') < threshold`` (0.01, i.e. 1%) return ``RECL_i = c``; else ``c = c'``, ``c'`` = the next
   grid value, and repeat.

Our interpretation where the paper is silent (all stated in the results):

* ``T`` is the set of scored token positions (the same for every model and context); ``|T_r| = ceil(r |T|)``,
  ties in ``b`` broken by position (stable sort). The hardest positions are chosen anew at every ``c``.
* The loop runs over the given grid; the step need not be uniform. If the gain is still above the threshold
  at the last step, RECL is the largest grid value and is marked *censored* (a lower bound).
* A model that cannot read more than ``L_max`` tokens (learned absolute positions, e.g. the Al-Rfou et al.
  Transformer whose Table 8 RECL is its training length 128) has ``l_i(c, t) = l_i(L_max, t)`` for
  ``c > L_max``, and its RECL is reported as ``min(RECL_i, L_max)``.
* How ``l_i(c, t)`` is measured (:func:`context_losses`): ``"window"`` feeds exactly the ``c`` previous tokens
  (a sliding window of stride 1, no memory: the truncated context of Khandelwal et al., 2018);
  ``"memory"`` is the paper's evaluation with memory at attention length ``c``: ``mem_len = c`` with
  ``same_length``, so every prediction attends to exactly ``c`` positions in every layer (through the memories
  of the layers below, information from beyond ``c`` tokens can still reach it, as in the paper's
  "Attn Len"). The default picks ``memory`` for relative encodings (attn_type 0, 1) and ``window`` for
  absolute ones (2, 3), whose only honest evaluation is the vanilla window.

Per-token losses are cached (:class:`LossCache`: ``.npy`` files, no pickle, and a JSON manifest keyed by the
model's weights digest, the data and the context), so a long computation resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np

from txl.errors import ConfigError, DataError
from txl.store.files import atomic_write, check_plain_name, read_json, write_json
from txl.store.layout import CACHE_MANIFEST

METHODS = ("memory", "window")


# ---------------------------------------------------------------------------------------------- the metric
def _check(losses: np.ndarray, contexts: Sequence[int]) -> np.ndarray:
    arr = np.asarray(losses, dtype=np.float64)
    if arr.ndim != 3:
        raise ConfigError(f"losses must be [models, contexts, tokens], got shape {arr.shape}")
    if arr.shape[1] != len(contexts) or len(contexts) < 2:
        raise ConfigError(f"need >= 2 contexts matching the losses' axis 1 ({arr.shape[1]}), got {list(contexts)}")
    if any(b <= a for a, b in pairwise(contexts)):
        raise ConfigError(f"contexts must be strictly increasing, got {list(contexts)}")
    if not np.isfinite(arr).all():
        raise DataError("per-token losses contain NaN or inf")
    return arr


def hardest(baseline: np.ndarray, r: float) -> np.ndarray:
    """Indices of the ``ceil(r * n)`` positions with the largest baseline loss (ties: earlier position first)."""
    if not 0 < r <= 1:
        raise ConfigError(f"r must be in (0, 1], got {r}")
    k = max(1, math.ceil(r * baseline.shape[0] - 1e-9))
    order = np.argsort(-baseline, kind="stable")
    return order[:k]


def relative_gains(losses: np.ndarray, contexts: Sequence[int], r: float) -> np.ndarray:
    """``g[i, k] = g_i(c_k, c_{k+1})`` for every model ``i`` and grid step ``k`` (module docstring)."""
    arr = _check(losses, contexts)
    n_models, n_ctx, _ = arr.shape
    gains = np.empty((n_models, n_ctx - 1))
    for k in range(n_ctx - 1):
        base = arr[:, k].min(axis=0)  # b(c_k, t)
        top = hardest(base, r)
        f_short = base[top].mean()  # f_i(c, c) = mean of b over T_r
        f_long = np.minimum(base[top][None], arr[:, k + 1, top]).mean(axis=1)  # f_i(c, c')
        gains[:, k] = (math.exp(f_short) - np.exp(f_long)) / math.exp(f_short)
    return gains


def unnormalized_gains(losses: np.ndarray, contexts: Sequence[int], r: float) -> np.ndarray:
    """``exp f_i(c, c) - exp f_i(c, c')`` per grid step (the paper's Figure 3)."""
    arr = _check(losses, contexts)
    out = np.empty((arr.shape[0], arr.shape[1] - 1))
    for k in range(arr.shape[1] - 1):
        base = arr[:, k].min(axis=0)
        top = hardest(base, r)
        out[:, k] = math.exp(base[top].mean()) - np.exp(np.minimum(base[top][None], arr[:, k + 1, top]).mean(1))
    return out


@dataclass
class RECLResult:
    """RECL per model and ``r``, with the gains it was read from."""

    names: list[str]
    contexts: list[int]
    r_values: list[float]
    threshold: float
    recl: dict[str, dict[float, int]]  # name -> r -> RECL
    censored: dict[str, dict[float, bool]]  # True: still above the threshold at the last grid step
    capped: dict[str, int | None]  # L_max of models that cannot read longer contexts
    gains: dict[float, np.ndarray] = field(repr=False, default_factory=dict)  # r -> [models, steps]
    ppl: np.ndarray | None = field(repr=False, default=None)  # [models, contexts] plain perplexity

    def to_dict(self) -> dict[str, Any]:
        return {
            "definition": "Dai et al. 2019, Appendix C (see txl.experiments.recl)",
            "contexts": self.contexts, "r": self.r_values, "threshold": self.threshold,
            "recl": {n: {str(r): v for r, v in d.items()} for n, d in self.recl.items()},
            "censored": {n: {str(r): v for r, v in d.items()} for n, d in self.censored.items()},
            "max_context": self.capped,
            "gains": {str(r): {n: g[i].round(6).tolist() for i, n in enumerate(self.names)}
                      for r, g in self.gains.items()},
            "ppl": None if self.ppl is None else {n: self.ppl[i].round(4).tolist() for i, n in enumerate(self.names)},
        }


def compute_recl(losses: np.ndarray, contexts: Sequence[int], *, names: Sequence[str] | None = None,
                 r_values: Sequence[float] = (0.1, 0.5, 1.0), threshold: float = 0.01,
                 max_context: Sequence[int | None] | None = None) -> RECLResult:
    """RECL of every model of a group from per-token losses ``[models, contexts, tokens]`` (module docstring).

    ``max_context[i]`` (or None) is the longest context model ``i`` can read; its losses at longer grid
    contexts must already repeat those at ``max_context[i]`` (as :func:`group_losses` builds them).
    """
    arr = _check(losses, contexts)
    names = list(names) if names is not None else [f"model{i}" for i in range(arr.shape[0])]
    caps = list(max_context) if max_context is not None else [None] * arr.shape[0]
    if len(names) != arr.shape[0] or len(caps) != arr.shape[0]:
        raise ConfigError("names/max_context must have one entry per model")
    recl: dict[str, dict[float, int]] = {n: {} for n in names}
    censored: dict[str, dict[float, bool]] = {n: {} for n in names}
    gains_by_r = {}
    for r in r_values:
        gains = relative_gains(arr, contexts, r)
        gains_by_r[float(r)] = gains
        for i, name in enumerate(names):
            below = np.nonzero(gains[i] < threshold)[0]
            k = int(below[0]) if below.size else len(contexts) - 1
            value = int(contexts[k])
            censored[name][float(r)] = not below.size
            if caps[i] is not None and value > caps[i]:
                value, censored[name][float(r)] = int(caps[i]), False
            recl[name][float(r)] = value
    ppl = np.exp(arr.mean(axis=2))
    return RECLResult(names=names, contexts=[int(c) for c in contexts], r_values=[float(r) for r in r_values],
                      threshold=threshold, recl=recl, censored=censored, capped=dict(zip(names, caps)),
                      gains=gains_by_r, ppl=ppl)


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
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError, SyntaxError, EOFError, TokenError):  # a damaged file is measured again
            return None
        return arr if arr.shape == (entry["tokens"],) else None

    def put(self, key: dict[str, Any], losses: np.ndarray) -> None:
        d = self.digest(key)
        arr = np.ascontiguousarray(losses, dtype=np.float32)
        atomic_write(self.dir / f"{d}.npy", lambda f: np.save(f, arr, allow_pickle=False))
        self.entries[d] = {"key": key, "tokens": int(arr.shape[0]), "mean": float(arr.mean())}
        write_json(self.manifest_path, {"version": 1, "entries": self.entries}, indent=1)


# ---------------------------------------------------------------------------------------------- measuring l_i(c, t)
def default_method(model: Any) -> str:
    """``memory`` for relative encodings (attn_type 0/1), ``window`` for absolute ones (2/3)."""
    return "memory" if model.config.attn_type in (0, 1) else "window"


def max_context(model: Any, method: str) -> int | None:
    """The longest context a model can read by ``method``: attn_type 3 windows stop at its learned positions."""
    return model.config.max_context if method == "window" else None


def context_losses(model: Any, data: np.ndarray, context: int, *, method: str, start: int, tokens: int,
                   tgt_len: int = 32, clamp_len: int | None = None, device: Any = None) -> np.ndarray:
    """``l(c, t)`` for ``t`` in ``[start, start + tokens)`` (``start >= context``, so every context is full)."""
    from txl.inference.evaluate import evaluate
    from txl.inference.window import sliding_window_nll

    if method not in METHODS:
        raise ConfigError(f"method must be one of {METHODS}, got {method!r}")
    if start < context:
        raise ConfigError(f"start ({start}) must be >= the context ({context}) so that every context is full")
    if start + tokens > len(data):
        raise DataError(f"{start + tokens} tokens needed, the split has {len(data)}")
    if method == "window":
        return sliding_window_nll(model, data, window=context, first=start, last=start + tokens, device=device)
    res = evaluate(model, data[: start + tokens], batch_size=1, tgt_len=tgt_len, mem_len=context, ext_len=0,
                   same_length=True, clamp_len=clamp_len, return_nll=True, device=device)
    assert res.nll is not None
    return res.nll[start : start + tokens]


@dataclass
class GroupMember:
    """A model of the RECL group: name, loaded model, weights digest, and how contexts are measured."""

    name: str
    model: Any
    digest: str
    method: str


def group_losses(members: Sequence[GroupMember], data: np.ndarray, contexts: Sequence[int], *, start: int,
                 tokens: int, data_key: dict[str, Any], cache: LossCache | None = None, tgt_len: int = 32,
                 clamp_len: int | None = None, device: Any = None,
                 progress: Callable[[str], None] | None = None,
                 bar: str = "off") -> tuple[np.ndarray, list[int | None]]:
    """Losses ``[models, contexts, tokens]`` for the group (cached), and each model's context cap. ``progress``
    gets a line per (model, context); ``bar`` is a :mod:`txl.data.progress` mode for a bar over them."""
    from txl.data.progress import Progress

    out = np.empty((len(members), len(contexts), tokens))
    caps: list[int | None] = []
    with Progress(len(members) * len(contexts), desc="recl", unit="context", mode=bar) as p:
        for i, m in enumerate(members):
            caps.append(_member_losses(m, data, contexts, out[i], start=start, tokens=tokens, data_key=data_key,
                                       cache=cache, tgt_len=tgt_len, clamp_len=clamp_len, device=device,
                                       progress=progress, bar=p))
    return out, caps


def _member_losses(m: GroupMember, data: np.ndarray, contexts: Sequence[int], out: np.ndarray, *, start: int,
                   tokens: int, data_key: dict[str, Any], cache: LossCache | None, tgt_len: int,
                   clamp_len: int | None, device: Any, progress: Callable[[str], None] | None, bar: Any) -> int | None:
    """One model's losses into ``out[contexts, tokens]``; returns its context cap."""
    cap = max_context(m.model, m.method)
    for k, c in enumerate(contexts):
        eff = min(c, cap) if cap is not None else c
        key = {"model": m.digest, **data_key, "start": start, "tokens": tokens, "method": m.method,
               "context": eff, "tgt_len": tgt_len if m.method == "memory" else None,
               "clamp_len": clamp_len if m.method == "memory" else None}
        arr = cache.get(key) if cache is not None else None
        state = "cached"
        if arr is None:
            arr = context_losses(m.model, data, eff, method=m.method, start=start, tokens=tokens,
                                 tgt_len=tgt_len, clamp_len=clamp_len, device=device)
            state = "computed"
            if cache is not None:
                cache.put(key, arr)
        out[k] = arr
        if progress is not None:
            progress(f"{m.name}: context {c}{f' (read at {eff})' if eff != c else ''} {state}, "
                     f"ppl {math.exp(float(np.mean(arr))):.3f}")
        bar.update(1)
    return cap
