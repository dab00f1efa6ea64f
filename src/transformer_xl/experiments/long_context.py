"""Controlled long-range-dependency experiments (issue 23; paper Secs. 3.2-3.3, Tables 6 and 8) on the corpus of
:mod:`transformer_xl.data.long_range`, where some spans are copies of the text a known distance back.

**Per-distance scoring** (:func:`per_distance`, pure): from the per-token losses of a split, the mean loss of the
copy tokens of each distance ``D`` (those at offset ``>= skip`` inside their span: the first characters of a copy
cannot be told from random letters, since nothing marks where a copy starts), apart from the rest (``other``: the
random letters, whose best loss is ``log |filler|``). :func:`reach` reads from it the distance up to which a model
predicts the copies: the largest ``D`` such that every distance ``<= D`` scores below half the uniform-guess loss.

**Variants** (:class:`LCVariant`): an encoding (``ours``, ``shaw``, ``vaswani``, ``alrfou``: attn_type 0-3, as
:mod:`transformer_xl.experiments.ablations`), a training memory ``mem_len`` (0: no recurrence) and a depth
``n_layer``, all trained at the one segment length ``tgt_len`` with :func:`transformer_xl.experiments.ablations.
train_variant` (:class:`transformer_xl.train.Trainer`, full loss). Sets (:data:`PARTS`): ``recurrence``
(Transformer-XL against the same model without memory), ``encodings`` (the four encodings with the same
recurrence), ``depth`` (``n_layer x mem_len``). :func:`run_distance_curve` trains a set on one corpus per distance
(a model learns copies at one fixed distance where several mixed stay at the uniform guess at a CPU budget).
Training and resuming go through :func:`transformer_xl.experiments.grid.run_seed_grid`.

**Evaluations** of each trained model on the valid split (batch 10 streams, ``same_length`` off,
:func:`score_model`): at its training memory; at every ``eval_mems`` length (shorter and longer than in training;
attn_type 3 only where every key has a learned position); and, for a model without memory, the stride-1 sliding
window of its training length (the vanilla model of Al-Rfou et al.).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl.data.long_range import LongRangeSpec, LongRangeText, generate, span_positions
from transformer_xl.errors import ConfigError, check_int
from transformer_xl.experiments.ablations import ENCODINGS, Variant, train_variant, variant_config
from transformer_xl.experiments.grid import run_seed_grid
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.inference.window import evaluate_sliding_window
from transformer_xl.model import TransformerXLLM, TXLConfig

LN2 = math.log(2)


# ---------------------------------------------------------------------------------------------- scoring
def per_distance(nll: np.ndarray, dist: np.ndarray, offset: np.ndarray, *, skip: int = 2) -> dict[str, Any]:
    """Mean loss (nats) and token count of the copies of each distance (offset ``>= skip``), of the tokens in no
    copy (``other``) and of all scored tokens; tokens whose loss is NaN (not scored) are left out."""
    nll = np.asarray(nll, dtype=np.float64)
    if not nll.shape == dist.shape == offset.shape:
        raise ConfigError(f"losses {nll.shape}, distances {dist.shape} and offsets {offset.shape} differ in shape")
    scored = np.isfinite(nll)

    def stat(mask: np.ndarray) -> dict[str, Any]:
        m = mask & scored
        n = int(m.sum())
        return {"loss": float(nll[m].mean()) if n else None, "tokens": n}

    copies = offset >= skip
    return {"skip": skip, "all": stat(np.ones_like(scored)), "other": stat(dist == 0),
            "copies": stat(copies),
            "distances": {int(d): stat(copies & (dist == d)) for d in np.unique(dist[dist > 0])}}


def reach(scores: dict[str, Any], guess: float) -> int:
    """The largest distance ``D`` with every distance ``<= D`` scoring below ``guess / 2`` (0: none)."""
    out = 0
    for d, s in sorted((int(k), v) for k, v in scores["distances"].items()):
        if s["loss"] is None or s["loss"] >= guess / 2:
            break
        out = d
    return out


def score_model(model: TransformerXLLM, data: np.ndarray, spans: np.ndarray, *, mem_len: int | None = None,
                window: int | None = None, skip: int = 2, batch_size: int = 10, device: Any = None) -> dict[str, Any]:
    """:func:`per_distance` of ``model`` on ``data``: with memory ``mem_len`` (segments of the model's
    ``tgt_len``), or each token from its own ``window`` of previous tokens without memory."""
    dist, offset = span_positions(spans, len(data))
    t0 = time.monotonic()
    if window is not None:
        res = evaluate_sliding_window(model, data, window=window, return_nll=True, device=device)
    else:
        res = evaluate(model, data, batch_size=batch_size, mem_len=mem_len, ext_len=0, same_length=False,
                       return_nll=True, device=device)
    assert res.nll is not None
    return {"mem_len": mem_len, "window": window, "loss": res.loss, "seconds": round(time.monotonic() - t0, 1),
            **per_distance(res.nll, dist, offset, skip=skip)}


# ---------------------------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class LCVariant:
    """A trained model of the experiment: encoding, training memory (0: none) and depth."""

    encoding: str
    mem_len: int
    n_layer: int

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ConfigError(f"encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}")
        check_int("mem_len", self.mem_len, 0)
        check_int("n_layer", self.n_layer, 1)

    @property
    def name(self) -> str:
        return f"{self.encoding}-L{self.n_layer}-m{self.mem_len}"

    def config(self, base: TXLConfig, tgt_len: int) -> TXLConfig:
        """``base`` with this depth, encoding and memory (the ablations' :func:`variant_config`)."""
        cfg = variant_config(base.replace(n_layer=self.n_layer), Variant(self.mem_len > 0, self.encoding, "full"),
                             tgt_len)
        return cfg.replace(mem_len=self.mem_len)


def part_variants(part: str, *, mem_len: int, n_layer: int, depths: Sequence[int],
                  depth_mems: Sequence[int]) -> list[LCVariant]:
    """The variants of one part of the experiment (module docstring)."""
    if part == "recurrence":
        return [LCVariant("ours", mem_len, n_layer), LCVariant("ours", 0, n_layer)]
    if part == "encodings":
        return [LCVariant(e, mem_len, n_layer) for e in ENCODINGS]
    if part == "depth":
        return [LCVariant("ours", m, n) for n in depths for m in depth_mems]
    raise ConfigError(f"unknown part {part!r}; known: {', '.join(PARTS)}")


PARTS = ("recurrence", "encodings", "depth")


def default_base(n_token: int) -> TXLConfig:
    """The experiment's model: 2 layers, d_model 64 (4 heads of 16, d_inner 128), no dropout (the issue's example
    had d_model 128; halved for the shared CPU's budget)."""
    from transformer_xl.model.presets import model_preset

    return model_preset("tiny", n_token).replace(n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128,
                                                 dropout=0.0)


# ---------------------------------------------------------------------------------------------- the experiment
def evaluate_trained(model: TransformerXLLM, v: LCVariant, text: LongRangeText, *, eval_mems: Sequence[int],
                     skip: int = 2, device: Any = None) -> list[dict[str, Any]]:
    """Every evaluation of a trained variant (module docstring), each a :func:`score_model` dict with ``kind``
    ``train``, ``memory`` or ``window``."""
    data, spans = text.ids["valid"], text.spans["valid"]
    cfg = model.config
    out = [{"kind": "train", **score_model(model, data, spans, mem_len=v.mem_len, skip=skip, device=device)}]
    for m in eval_mems:
        if m == v.mem_len or (cfg.max_context is not None and cfg.tgt_len + m > cfg.max_context):
            continue
        out.append({"kind": "memory", **score_model(model, data, spans, mem_len=m, skip=skip, device=device)})
    if v.mem_len == 0:
        out.append({"kind": "window", **score_model(model, data, spans, window=cfg.tgt_len, skip=skip,
                                                    device=device)})
    return out


def run_long_context(base: TXLConfig, text: LongRangeText, out_dir: str | Path, variants: Sequence[LCVariant], *,
                     tgt_len: int, steps: int, seeds: Sequence[int], eval_mems: Sequence[int] = (), skip: int = 2,
                     batch_size: int = 16, lr: float = 1e-3, warmup: int = 50, device: str = "cpu",
                     log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Train (with :func:`transformer_xl.experiments.ablations.train_variant`) and evaluate every variant of every
    seed not finished under ``out_dir`` (``OUT/seed<k>/<variant>/result.json``; resumable, a signal stops it at a
    checkpoint: :func:`transformer_xl.experiments.grid.run_seed_grid`); returns the rows, their distances as
    integers (:func:`int_distances`)."""
    check_int("steps", steps, 1)
    corpus = text.corpus()
    guess = math.log(len(text.spec.symbols_filler))

    def train(seed: int, v: LCVariant, run_dir: Path, label: str) -> tuple[TransformerXLLM, dict[str, Any]]:
        cfg = v.config(base, tgt_len)
        if log is not None:
            log(f"{label}: training {steps} steps (tgt_len {tgt_len}, mem_len {v.mem_len}, n_layer {v.n_layer}, "
                f"attn_type {cfg.attn_type})")
        return train_variant(cfg, corpus, run_dir, steps=steps, batch_size=batch_size, lr=lr, warmup=warmup,
                             seed=seed, device=device)

    def row(seed: int, v: LCVariant, model: TransformerXLLM, train_log: dict[str, Any]) -> dict[str, Any]:
        evals = evaluate_trained(model, v, text, eval_mems=eval_mems, skip=skip, device=device)
        return {"variant": v.name, "seed": seed, "encoding": v.encoding, "train_mem_len": v.mem_len,
                "n_layer": v.n_layer, "train_tgt_len": tgt_len, "params": model.num_parameters(),
                "train_steps": train_log["steps"], "train_tokens": train_log["tokens"],
                "train_minutes": round(train_log["minutes"], 2), "guess_loss": guess,
                "reach": {f"{e['kind']}:{e['mem_len'] if e['window'] is None else e['window']}": reach(e, guess)
                          for e in evals},
                "evals": evals, "train_history": train_log["history"]}

    def done(r: dict[str, Any]) -> str:
        e, at = r["evals"][0], f"train:{r['train_mem_len']}"
        return (f"{e['loss'] / LN2:.3f} bpc, copies {e['copies']['loss'] / LN2:.3f}, reach {r['reach'][at]} "
                f"({r['train_minutes']:.1f} min)")

    return run_seed_grid(out_dir, variants, seeds, name=lambda v: v.name, train=train, evaluate=row,
                         vocab=corpus.vocab, read=int_distances, done=done, log=log)


def int_distances(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the distance keys of its evaluations as integers (JSON gives strings; fresh rows have ints)."""
    for e in row["evals"]:
        e["distances"] = {int(d): s for d, s in e["distances"].items()}
    return row


def run_distance_curve(base: TXLConfig, spec: LongRangeSpec, out_dir: str | Path, variants: Sequence[LCVariant],
                       distances: Sequence[int], **kw: Any) -> list[dict[str, Any]]:
    """:func:`run_long_context` on one corpus per distance (``spec`` with that one distance, into
    ``OUT/d<D>/``): a model learns copies at one fixed distance where several mixed stay at the guess at this
    budget (docs/long-context.md), so the reach over distance is read across corpora. Each row gains
    ``corpus_distance``."""
    rows = []
    for d in distances:
        text = generate(replace(spec, distances=(int(d),)))
        rows += [{**r, "corpus_distance": int(d)} for r in run_long_context(base, text, Path(out_dir) / f"d{d}",
                                                                          variants, **kw)]
    return rows
