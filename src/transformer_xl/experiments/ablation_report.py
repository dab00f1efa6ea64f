"""The report of an ablation run (paper Tables 6 and 10): rows aggregated over seeds (mean ± sample standard
deviation), the Markdown tables and the JSON document. Definitions of the figures:
:mod:`transformer_xl.experiments.ablations`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.ablations import ENCODING_NAMES
from transformer_xl.experiments.tables import markdown_table

# ---------------------------------------------------------------------------------------------- seeds
STAT_KEYS = ("loss_init", "ppl_init", "loss_best", "ppl_best", "attn_len_best", "loss_window", "ppl_window")


def mean_spread(values: Sequence[float]) -> dict[str, Any]:
    """``n``, ``mean``, sample standard deviation ``std`` (``ddof = 1``; None for one value), ``min``, ``max``."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ConfigError("no values to aggregate")
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if x.size > 1 else None,
            "min": float(x.min()), "max": float(x.max())}


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per variant (first-seen order): its seeds, training lengths, steps and tokens (mean), and
    :func:`mean_spread` of each of :data:`STAT_KEYS` over the seeds (None where a row has no such value)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["variant"], []).append(r)
    out = []
    for rs in groups.values():
        first = rs[0]
        entry = {k: first[k] for k in ("variant", "recurrence", "encoding", "loss", "train_tgt_len", "train_mem_len")}
        entry.update(seeds=[r["seed"] for r in rs], train_steps=mean_spread([r["train_steps"] for r in rs])["mean"],
                     train_tokens=mean_spread([r["train_tokens"] for r in rs])["mean"],
                     equal_memory=first.get("equal_memory"))
        for k in STAT_KEYS:
            vals = [r[k] for r in rs if r.get(k) is not None]
            entry[k] = mean_spread(vals) if vals else None
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------- report
def report(rows: Sequence[dict[str, Any]], *, char_level: bool = False,
           equal_memory: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The Markdown report and the JSON document of a run: the table over seeds, the per-seed table, the
    equal-memory measurements, and how each figure was obtained."""
    agg = aggregate(rows)
    notes = ("Mean ± sample standard deviation over the seeds (ddof = 1; no spread for one seed). init: the "
             "training lengths; best: the lowest loss over init and the same_length attention-length search; Attn Len: "
             "the shortest attention length within the tolerance of best; window: stride-1 window of the training "
             "length (no-recurrence rows). Definitions: transformer_xl.experiments.ablations.")
    text = f"{notes}\n\n{ablation_aggregate_table(agg, char_level=char_level)}\nPer seed:\n\n" \
           f"{ablation_table(rows, char_level=char_level)}"
    if equal_memory:
        lines = [f"* {name}: tgt_len {e['length']} ({e['bytes'] / 2**20:.2f} MiB) within {e['target_variant']}'s "
                 f"{e['target_bytes'] / 2**20:.2f} MiB" for name, e in equal_memory["lengths"].items()]
        text += (f"\nEqual peak training memory ({equal_memory['method']} on {equal_memory['device']}, batch "
                 f"{equal_memory['batch_size']}, T = {equal_memory['tgt_len']}; "
                 "transformer_xl.experiments.equal_memory):\n\n" + "\n".join(lines) + "\n")
    doc = {"spread": "sample standard deviation (ddof=1)", "aggregate": agg, "equal_memory": equal_memory,
           "rows": [{k: v for k, v in r.items() if k != "train_history"} for r in rows]}
    return text, doc


# ---------------------------------------------------------------------------------------------- tables
def _metric(stat: dict[str, Any] | None, loss: dict[str, Any] | None, char_level: bool, digits: int) -> str:
    if stat is None:
        return "—"
    s = {k: (v / math.log(2) if v is not None and k != "n" else v) for k, v in loss.items()} if char_level else stat
    text = f"{s['mean']:.{digits}f}"
    return text if s["std"] is None else f"{text} ± {s['std']:.{digits}f}"


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,.0f}"


def ablation_aggregate_table(agg: Sequence[dict[str, Any]], *, char_level: bool = False) -> str:
    """Table 6 / 10 layout over seeds (:func:`transformer_xl.experiments.ablations.aggregate`): mean ± sample standard
    deviation (bpc from the losses when ``char_level``)."""
    metric, d = ("bpc", 4) if char_level else ("PPL", 3)
    body = []
    for a in agg:
        attn = a["attn_len_best"]
        attn_text = "—" if attn is None else (f"{attn['mean']:.0f}" if attn["std"] is None else
                                             f"{attn['mean']:.0f} ± {attn['std']:.0f}")
        body.append([a["variant"], "✓" if a["recurrence"] else "✗", ENCODING_NAMES[a["encoding"]],
                     a["loss"].capitalize(), f"{a['train_tgt_len']}/{a['train_mem_len']}",
                     f"{a['train_steps']:,.0f}", _tokens(a["train_tokens"]),
                     _metric(a["ppl_init"], a["loss_init"], char_level, d),
                     _metric(a["ppl_best"], a["loss_best"], char_level, d), attn_text,
                     _metric(a["ppl_window"], a["loss_window"], char_level, d), len(a["seeds"])])
    return markdown_table(["variant", "Recurrence", "Encoding", "Loss", "train tgt/mem", "steps", "train tokens",
                           f"{metric} init", f"{metric} best", "Attn Len", f"{metric} window", "seeds"], body)


def ablation_table(rows: Sequence[dict[str, Any]], *, char_level: bool = False) -> str:
    """One line per seed and variant (plus training lengths, tokens and parameter counts)."""
    def fmt(loss: float | None) -> str:
        if loss is None:
            return "—"
        return f"{loss / math.log(2):.4f}" if char_level else f"{math.exp(loss):.3f}"

    body = [[r["variant"], r["seed"], "✓" if r["recurrence"] else "✗", ENCODING_NAMES[r["encoding"]],
             r["loss"].capitalize(), fmt(r["loss_init"]), fmt(r["loss_best"]), r["attn_len_best"],
             fmt(r["loss_window"]), f"{r['train_tgt_len']}/{r['train_mem_len']}", f"{r['train_steps']:,}",
             _tokens(r["train_tokens"]), f"{r['params']:,}", r["train_minutes"]] for r in rows]
    metric = "bpc" if char_level else "PPL"
    return markdown_table(["variant", "seed", "Recurrence", "Encoding", "Loss", f"{metric} init", f"{metric} best",
                           "Attn Len", f"{metric} window", "train tgt/mem", "steps", "train tokens", "params",
                           "train min"], body)
