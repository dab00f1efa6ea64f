"""The RECL metric of paper Appendix C on per-token losses (pure numpy): group baseline, top-r hardest tokens,
clipped relative loss, relative gain, the 1 % stop rule, and a bootstrap over tokens. The formulas are in
:mod:`transformer_xl.experiments.recl`'s docstring; the measurement of the losses is there too."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from transformer_xl.errors import ConfigError, DataError

WINDOW, ATTENTION_LENGTH = "window", "attention-length"
METHODS = (WINDOW, ATTENTION_LENGTH)
METHOD_ALIASES = {"memory": ATTENTION_LENGTH}  # the name this method had before it was made an option
DEFAULT_METHOD = WINDOW
RECEPTIVE_FIELD = {
    WINDOW: "exactly the c previous tokens (stride-1 window, no memory; a model with L_max learned positions "
            "reads min(c, L_max))",
    ATTENTION_LENGTH: "mem_len = c with same_length: each query attends to c positions (itself included) in "
                      "every layer, so a prediction of an n_layer model can depend on up to n_layer*(c-1)+1 "
                      "input tokens",
}


def check_method(method: str) -> str:
    """The canonical name of a measuring method (``"memory"`` is read as ``"attention-length"``)."""
    name = METHOD_ALIASES.get(method, method)
    if name not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)} (or 'memory', an alias of "
                          f"'attention-length'), got {method!r}")
    return name


def receptive_field(method: str, context: int, *, n_layer: int, max_context: int | None = None) -> int:
    """The most input tokens one prediction can depend on when measured at context ``c`` by ``method``:
    ``min(c, max_context)`` for the window, ``n_layer * (c - 1) + 1`` for the attention length."""
    if check_method(method) == WINDOW:
        return context if max_context is None else min(context, max_context)
    return n_layer * (context - 1) + 1


# ---------------------------------------------------------------------------------------------- the grid
def parse_grid(text: str) -> list[int]:
    """``"START:STOP:STEP"`` -> ``[START, START + STEP, ..., STOP]`` (STOP included; it must be on the grid)."""
    parts = text.split(":")
    try:
        start, stop, step = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"a grid is START:STOP:STEP (integers, e.g. 16:256:16), got {text!r}") from None
    if start < 1 or step < 1 or stop <= start:
        raise ConfigError(f"a grid needs 1 <= START < STOP and STEP >= 1, got {text!r}")
    if (stop - start) % step:
        raise ConfigError(f"grid {text!r}: STOP - START ({stop - start}) is not a multiple of STEP ({step})")
    return list(range(start, stop + 1, step))


def grid_step(contexts: Sequence[int]) -> int | None:
    """The step ``Delta`` of a uniform grid, or None when the steps differ."""
    steps = {b - a for a, b in pairwise(contexts)}
    return steps.pop() if len(steps) == 1 else None


# ---------------------------------------------------------------------------------------------- the metric
def checked_losses(losses: np.ndarray, contexts: Sequence[int]) -> np.ndarray:
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


def top_count(r: float, n: int) -> int:
    """``|T_r| = ceil(r * n)`` (at least 1)."""
    if not 0 < r <= 1:
        raise ConfigError(f"r must be in (0, 1], got {r}")
    return max(1, math.ceil(r * n - 1e-9))


def hardest(baseline: np.ndarray, r: float) -> np.ndarray:
    """Indices of the ``ceil(r * n)`` positions with the largest baseline loss (ties: earlier position first)."""
    k = top_count(r, baseline.shape[0])
    order = np.argsort(-baseline, kind="stable")
    return order[:k]


def relative_losses(arr: np.ndarray, r_values: Sequence[float], counts: np.ndarray) -> dict[float, np.ndarray]:
    """Relative losses on token multisets: ``counts[s, t]`` copies of position ``t`` in sample ``s`` (each
    sample of ``n`` tokens; all ones: the scored positions themselves). Returns ``r -> [samples, 1 + models,
    steps]``: row 0 ``f(c, c)`` (the mean baseline over the top-r set), row ``1 + i`` ``f_i(c, c')``.

    In a multiset the top-r set is the first ``|T_r|`` tokens of the positions sorted by ``-b`` (stable, as
    :func:`hardest`), copies counted: a position weighs ``clip(|T_r| - copies ranked before it, 0, its
    copies)``, so all-ones counts give exactly :func:`hardest`'s set."""
    n_models, n_ctx, n = arr.shape
    samples = counts.shape[0]
    out = {float(r): np.empty((samples, n_models + 1, n_ctx - 1)) for r in r_values}
    tops = {float(r): top_count(r, n) for r in r_values}
    for k in range(n_ctx - 1):
        base = arr[:, k].min(axis=0)  # b(c_k, t)                                      [T]
        order = np.argsort(-base, kind="stable")  # hardest first
        vals = np.concatenate([base[order][None], np.minimum(base[order][None], arr[:, k + 1, order])])  # [1+M, T]
        copies = counts[:, order]  # [S, T]
        before = np.cumsum(copies, axis=1) - copies  # copies ranked before each position   [S, T]
        for r, top in tops.items():
            w = np.clip(top - before, 0, copies)  # copies of each position inside T_r   [S, T]
            out[r][:, :, k] = w @ vals.T / top  # [S, 1+M]
    return out


def gains_of(f: np.ndarray) -> np.ndarray:
    """``g = (exp f(c, c) - exp f(c, c')) / exp f(c, c)`` from :func:`relative_losses`' layout -> ``[S, M, steps]``."""
    return (np.exp(f[:, :1]) - np.exp(f[:, 1:])) / np.exp(f[:, :1])


def relative_gains(losses: np.ndarray, contexts: Sequence[int], r: float) -> np.ndarray:
    """``g[i, k] = g_i(c_k, c_{k+1})`` for every model ``i`` and grid step ``k`` (module docstring)."""
    arr = checked_losses(losses, contexts)
    return gains_of(relative_losses(arr, [r], np.ones((1, arr.shape[2])))[float(r)])[0]


def unnormalized_gains(losses: np.ndarray, contexts: Sequence[int], r: float) -> np.ndarray:
    """``exp f_i(c, c) - exp f_i(c, c')`` per grid step (the paper's Figure 3)."""
    arr = checked_losses(losses, contexts)
    f = relative_losses(arr, [r], np.ones((1, arr.shape[2])))[float(r)][0]  # [1+M, steps]
    return np.exp(f[:1]) - np.exp(f[1:])


def bootstrap_gains(losses: np.ndarray, contexts: Sequence[int], r_values: Sequence[float], *, resamples: int,
                    seed: int = 0, chunk: int = 50) -> dict[float, np.ndarray]:
    """Relative gains on ``resamples`` bootstrap resamples of the scored positions: ``r -> [B, models, steps]``.

    Each resample draws ``n`` positions with replacement (``numpy.random.default_rng(seed)``, ``chunk``
    resamples at a time, so the draws depend on ``seed`` and ``chunk`` only) and redoes the baseline, the
    top-r set and the gains on that multiset (:func:`relative_losses`)."""
    arr = checked_losses(losses, contexts)
    if resamples < 1:
        raise ConfigError(f"resamples must be >= 1, got {resamples}")
    n = arr.shape[2]
    rng = np.random.default_rng(seed)
    parts: dict[float, list[np.ndarray]] = {float(r): [] for r in r_values}
    for lo in range(0, resamples, chunk):
        s = min(chunk, resamples - lo)
        draws = rng.integers(0, n, size=(s, n)) + n * np.arange(s)[:, None]  # flat index of (sample, position)
        counts = np.bincount(draws.ravel(), minlength=s * n).reshape(s, n).astype(np.float64)  # [S, T]
        for r, f in relative_losses(arr, r_values, counts).items():
            parts[r].append(gains_of(f))
    return {r: np.concatenate(p) for r, p in parts.items()}


def recl_from_gains(gains: np.ndarray, contexts: Sequence[int], threshold: float,
                    caps: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """RECL and censoring from gains ``[..., models, steps]``: the first ``c_k`` with ``g(c_k, c_{k+1}) <
    threshold``, else the last grid value (censored); then at most each model's cap (not censored there)."""
    below = gains < threshold
    found = below.any(axis=-1)
    k = np.where(found, below.argmax(axis=-1), len(contexts) - 1)
    values = np.asarray(contexts, dtype=np.int64)[k]
    cap = np.array([np.iinfo(np.int64).max if c is None else c for c in caps], dtype=np.int64)
    over = values > cap
    return np.where(over, cap, values), ~found & ~over


@dataclass
class RECLResult:
    """RECL per model and ``r``, with the gains it was read from, their bootstrap spread and how the losses
    were measured."""

    names: list[str]
    contexts: list[int]
    r_values: list[float]
    threshold: float
    recl: dict[str, dict[float, int]]  # name -> r -> RECL
    censored: dict[str, dict[float, bool]]  # True: still above the threshold at the last grid step
    capped: dict[str, int | None]  # L_max of models that cannot read longer contexts
    tokens: int = 0  # |T|, scored positions
    gains: dict[float, np.ndarray] = field(repr=False, default_factory=dict)  # r -> [models, steps]
    ppl: np.ndarray | None = field(repr=False, default=None)  # [models, contexts] plain perplexity
    method: str | None = None  # how l_i(c, t) was measured (METHODS), one for the group
    receptive_field: dict[str, list[int]] | None = None  # name -> input tokens a prediction can read, per context
    resamples: int = 0  # bootstrap resamples (0: none)
    seed: int | None = None
    interval: tuple[float, float] = (0.05, 0.95)
    recl_interval: dict[str, dict[float, tuple[int, int]]] = field(default_factory=dict)  # name -> r -> (lo, hi)
    recl_agreement: dict[str, dict[float, float]] = field(default_factory=dict)  # share of resamples = RECL
    gain_std: dict[float, np.ndarray] = field(repr=False, default_factory=dict)  # r -> [models, steps]

    @property
    def step(self) -> int | None:
        return grid_step(self.contexts)

    def to_dict(self) -> dict[str, Any]:
        def per_r(d: dict[str, dict[float, Any]]) -> dict[str, dict[str, Any]]:
            return {n: {str(r): v for r, v in x.items()} for n, x in d.items()}

        def per_model(a: np.ndarray) -> dict[str, list[float]]:
            return {n: a[i].round(6).tolist() for i, n in enumerate(self.names)}

        boot = None
        if self.resamples:
            boot = {"resamples": self.resamples, "seed": self.seed,
                    "over": "scored token positions, drawn with replacement",
                    "interval": list(self.interval),
                    "recl_interval": per_r(self.recl_interval),
                    "recl_agreement": per_r(self.recl_agreement),
                    "gain_std": {str(r): per_model(g) for r, g in self.gain_std.items()}}
        return {
            "definition": "Dai et al. 2019, Appendix C (see transformer_xl.experiments.recl)",
            "method": self.method,
            "receptive_field": None if self.method is None else {
                "statement": RECEPTIVE_FIELD[self.method], "tokens": self.receptive_field},
            "contexts": self.contexts, "grid_step": self.step, "r": self.r_values, "threshold": self.threshold,
            "tokens_scored": self.tokens,
            "top_tokens": {str(r): top_count(r, self.tokens) for r in self.r_values} if self.tokens else None,
            "recl": per_r(self.recl), "censored": per_r(self.censored), "max_context": self.capped,
            "bootstrap": boot,
            "gains": {str(r): per_model(g) for r, g in self.gains.items()},
            "ppl": None if self.ppl is None else {n: self.ppl[i].round(4).tolist() for i, n in enumerate(self.names)},
        }


def compute_recl(losses: np.ndarray, contexts: Sequence[int], *, names: Sequence[str] | None = None,
                 r_values: Sequence[float] = (0.1, 0.5, 1.0), threshold: float = 0.01,
                 max_context: Sequence[int | None] | None = None, resamples: int = 0, seed: int = 0,
                 interval: tuple[float, float] = (0.05, 0.95), method: str | None = None,
                 receptive: dict[str, list[int]] | None = None) -> RECLResult:
    """RECL of every model of a group from per-token losses ``[models, contexts, tokens]`` (module docstring).

    ``max_context[i]`` (or None) is the longest context model ``i`` can read; its losses at longer grid
    contexts must already repeat those at ``max_context[i]`` (as :func:`group_losses` builds them).
    ``resamples > 0`` adds the bootstrap (:func:`bootstrap_gains`, ``seed``): the std of each step's gain and
    the ``interval`` quantiles of the resampled RECL. ``method`` and ``receptive`` (per model, per context)
    are recorded as given.
    """
    arr = checked_losses(losses, contexts)
    names = list(names) if names is not None else [f"model{i}" for i in range(arr.shape[0])]
    caps = list(max_context) if max_context is not None else [None] * arr.shape[0]
    if len(names) != arr.shape[0] or len(caps) != arr.shape[0]:
        raise ConfigError("names/max_context must have one entry per model")
    lo_q, hi_q = interval
    if not 0 <= lo_q <= hi_q <= 1:
        raise ConfigError(f"interval must be two quantiles 0 <= lo <= hi <= 1, got {interval}")
    r_values = [float(r) for r in r_values]
    f = relative_losses(arr, r_values, np.ones((1, arr.shape[2])))
    gains = {r: gains_of(f[r])[0] for r in r_values}
    boot = bootstrap_gains(arr, contexts, r_values, resamples=resamples, seed=seed) if resamples else {}
    res = RECLResult(names=names, contexts=[int(c) for c in contexts], r_values=r_values, threshold=threshold,
                     recl={n: {} for n in names}, censored={n: {} for n in names}, capped=dict(zip(names, caps)),
                     tokens=int(arr.shape[2]), gains=gains, ppl=np.exp(arr.mean(axis=2)),
                     method=None if method is None else check_method(method), receptive_field=receptive,
                     resamples=resamples, seed=seed if resamples else None, interval=(lo_q, hi_q))
    for r in r_values:
        values, cens = recl_from_gains(gains[r], contexts, threshold, caps)
        if resamples:
            bvals, _ = recl_from_gains(boot[r], contexts, threshold, caps)  # [B, M]
            q = np.quantile(bvals, [lo_q, hi_q], axis=0, method="inverted_cdf")  # grid values   [2, M]
            res.gain_std[r] = boot[r].std(axis=0, ddof=1) if resamples > 1 else np.zeros_like(gains[r])
        for i, name in enumerate(names):
            res.recl[name][r], res.censored[name][r] = int(values[i]), bool(cens[i])
            if resamples:
                res.recl_interval.setdefault(name, {})[r] = (int(q[0, i]), int(q[1, i]))
                res.recl_agreement.setdefault(name, {})[r] = round(float(np.mean(bvals[:, i] == values[i])), 4)
    return res
