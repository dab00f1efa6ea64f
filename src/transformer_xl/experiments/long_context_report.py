"""The report of a long-context run (:mod:`transformer_xl.experiments.long_context`): rows aggregated over seeds
(mean ± sample standard deviation, :func:`transformer_xl.experiments.ablation_report.mean_spread`), one Markdown
table and one figure per question, and the JSON document. Every figure is in bits per character (loss / ln 2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer_xl.experiments.ablation_report import mean_spread
from transformer_xl.experiments.tables import markdown_table, pyplot

LN2 = math.log(2)


def _bits(values: Sequence[float | None]) -> dict[str, Any] | None:
    vals = [v / LN2 for v in values if v is not None]
    return mean_spread(vals) if vals else None


def _cell(s: dict[str, Any] | None, digits: int = 2) -> str:
    if s is None:
        return "—"
    return f"{s['mean']:.{digits}f}" if s["std"] is None else f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def _eval(row: dict[str, Any], kind: str, length: int | None) -> dict[str, Any] | None:
    """The evaluation of ``kind`` (train, memory, window) at ``length`` (memory or window; None: any)."""
    for e in row["evals"]:
        value = e["window"] if kind == "window" else e["mem_len"]
        if (e["kind"] == kind or (kind == "memory" and e["kind"] == "train")) and length in (None, value):
            return e
    return None


def distances_of(rows: Sequence[dict[str, Any]]) -> list[int]:
    """The copy distances of the rows (their keys are integers: :func:`transformer_xl.experiments.long_context.
    int_distances`)."""
    return sorted({d for r in rows for e in r["evals"] for d in e["distances"]})


def summarize(rows: Sequence[dict[str, Any]], variant: str, kind: str, length: int | None) -> dict[str, Any] | None:
    """Over the seeds of ``variant``: bpc of all tokens, of the copies, of the rest, per distance, and the reach."""
    evs = [(r, e) for r in rows if r["variant"] == variant for e in [_eval(r, kind, length)] if e is not None]
    if not evs:
        return None
    dists = distances_of(rows)
    guess = evs[0][0]["guess_loss"]
    from transformer_xl.experiments.long_context import reach

    return {"variant": variant, "kind": kind, "length": length, "seeds": [r["seed"] for r, _ in evs],
            "all": _bits([e["loss"] for _, e in evs]), "copies": _bits([e["copies"]["loss"] for _, e in evs]),
            "other": _bits([e["other"]["loss"] for _, e in evs]),
            "distances": {d: _bits([e["distances"].get(d, {}).get("loss") for _, e in evs]) for d in dists},
            "reach": mean_spread([reach(e, guess) for _, e in evs]),
            "train_minutes": mean_spread([r["train_minutes"] for r, _ in evs])["mean"]}


def distance_table(entries: Sequence[dict[str, Any]], labels: Sequence[str], *, totals: bool = True) -> str:
    """One row per entry: bpc per distance and, with ``totals`` (rows of one corpus), of the copies, of the other
    tokens, of all, the reach; the seeds (models) summarized."""
    dists = sorted({d for e in entries for d in e["distances"]})
    total = ["copies", "other", "all", "reach"] if totals else []
    body = [[label, *[_cell(e["distances"].get(d)) for d in dists],
             *([_cell(e["copies"]), _cell(e["other"]), _cell(e["all"], 3), _cell(e["reach"], 0)] if totals else []),
             len(set(e["seeds"]))] for e, label in zip(entries, labels)]
    return markdown_table(["model / evaluation", *[f"D = {d}" for d in dists], *total,
                           "seeds" if totals else "seeds per distance"], body)


def plot_distances(entries: Sequence[dict[str, Any]], labels: Sequence[str], path: str | Path, *, guess_bits: float,
                   title: str) -> Path:
    """bpc of the copies against their distance, one line per entry (mean, bars ± std)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for e, label in zip(entries, labels):
        ds = [d for d in sorted(e["distances"]) if e["distances"][d] is not None]
        ys = [e["distances"][d]["mean"] for d in ds]
        err = [e["distances"][d]["std"] or 0.0 for d in ds]
        ax.errorbar(ds, ys, yerr=err, fmt="o-", capsize=3, label=label)
    ax.set_ylim(bottom=0)
    return _save(plt, fig, ax, path, guess_bits=guess_bits, xlabel="distance D of the copied span (tokens)",
                 ylabel="bpc of the copied tokens", title=title)


def _save(plt: Any, fig: Any, ax: Any, path: str | Path, *, guess_bits: float, xlabel: str, ylabel: str,
          title: str) -> Path:
    """The uniform-guess line, labels, grid and legend; the figure written to ``path``."""
    ax.axhline(guess_bits, color="k", ls="--", lw=1, label="uniform guess")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_memory(series: dict[str, list[tuple[int, dict[str, Any]]]], path: str | Path, *, train_mem: int,
                guess_bits: float, title: str) -> Path:
    """bpc of all tokens against the evaluation memory, one line per model (mean, bars ± std)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, points in series.items():
        xs = [m for m, _ in points]
        ax.errorbar(xs, [s["mean"] for _, s in points], yerr=[s["std"] or 0.0 for _, s in points], fmt="o-",
                    capsize=3, label=label)
    ax.axvline(train_mem, color="grey", ls=":", lw=1, label=f"training mem_len {train_mem}")
    ax.set_xscale("symlog", linthresh=32)
    ticks = sorted({m for points in series.values() for m, _ in points})
    ax.set_xticks(ticks, [str(m) for m in ticks])  # every evaluated memory, labelled
    ax.minorticks_off()
    return _save(plt, fig, ax, path, guess_bits=guess_bits, xlabel="evaluation mem_len",
                 ylabel="bpc (all valid tokens)", title=title)


def memory_table(rows: Sequence[dict[str, Any]], variants: Sequence[str], mems: Sequence[int]) -> str:
    """bpc of all tokens (copies in brackets) of each variant at each evaluation memory."""
    body = []
    for v in variants:
        cells = []
        for m in mems:
            s = summarize(rows, v, "memory", m)
            cells.append("—" if s is None or s["all"] is None else f"{_cell(s['all'], 3)} ({_cell(s['copies'])})")
        body.append([v, *cells])
    return markdown_table(["model", *[f"eval mem {m}" for m in mems]], body)


def memory_series(rows: Sequence[dict[str, Any]], variant: str,
                  mems: Sequence[int]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for m in mems:
        s = summarize(rows, variant, "memory", m)
        if s is not None and s["all"] is not None:
            out.append((m, s["all"]))
    return out


def per_seed_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per trained model: its corpus (``main``, or the distance of a per-distance corpus), its training
    evaluation and cost."""
    body = [[r["variant"], r.get("corpus_distance", "main"), r["seed"], r["train_mem_len"], r["n_layer"],
             f"{r['params']:,}", r["train_steps"], f"{r['train_tokens']:,}", r["train_minutes"], r["eval_minutes"],
             f"{r['evals'][0]['loss'] / LN2:.3f}", f"{r['evals'][0]['copies']['loss'] / LN2:.2f}",
             r["reach"][f"train:{r['train_mem_len']}"]] for r in rows]
    return markdown_table(["variant", "corpus", "seed", "train mem", "layers", "params", "steps", "train tokens",
                           "train min", "eval min", "bpc", "copies bpc", "reach"], body)


# ---------------------------------------------------------------------------------------------- the whole report
def _recurrence(rows: Sequence[dict[str, Any]], xl: str, vanilla: str, mem_len: int, path: Path, *, guess_bits: float,
                heading: str, title: str, totals: bool) -> str:
    """Transformer-XL, the model without memory and its sliding window: a table per distance and a figure."""
    entries = [summarize(rows, xl, "train", None), summarize(rows, vanilla, "train", None),
               summarize(rows, vanilla, "window", None)]
    labels = [f"Transformer-XL {xl} (mem {mem_len})", f"no recurrence {vanilla} (segments)",
              f"no recurrence {vanilla}, sliding window (Al-Rfou et al.)"]
    keep = [(e, lab) for e, lab in zip(entries, labels) if e is not None]
    plot_distances([e for e, _ in keep], [lab for _, lab in keep], path, guess_bits=guess_bits, title=title)
    return (f"### {heading}\n\n" + distance_table([e for e, _ in keep], [lab for _, lab in keep], totals=totals)
            + f"\n![{path.stem}]({path.name})\n")


def write_report(rows: Sequence[dict[str, Any]], out: str | Path, *, mem_len: int, n_layer: int,
                 eval_mems: Sequence[int], guess_bits: float, prefix: str = "long-context",
                 curve_rows: Sequence[dict[str, Any]] = ()) -> str:
    """The Markdown sections (a table per question, the figures ``OUT/<prefix>-*.png`` beside them) of the rows
    present; returns the Markdown (written to ``OUT/<prefix>.md`` by the caller)."""
    out = Path(out)
    names = {r["variant"] for r in rows}
    xl, vanilla = f"ours-L{n_layer}-m{mem_len}", f"ours-L{n_layer}-m0"
    parts = []
    if xl in names and vanilla in names:
        parts.append(_recurrence(rows, xl, vanilla, mem_len, out / f"{prefix}-recurrence.png", guess_bits=guess_bits,
                                 heading="Recurrence against none and the sliding window", totals=True,
                                 title="Recurrence vs none: copies predicted at each distance"))
    if curve_rows:
        parts.append(_recurrence(curve_rows, xl, vanilla, mem_len, out / f"{prefix}-distance.png",
                                 guess_bits=guess_bits, totals=False,
                                 heading="Reach over distance (one corpus per distance)",
                                 title="Copies predicted at each distance, one corpus per distance"))
    depth = sorted({(r["n_layer"], r["train_mem_len"]) for r in rows if r["encoding"] == "ours"
                    and r["train_mem_len"] > 0})
    if len(depth) > 1:
        entries = [summarize(rows, f"ours-L{n}-m{m}", "train", None) for n, m in depth]
        labels = [f"{n} layer(s), mem {m}" for n, m in depth]
        plot_distances(entries, labels, out / f"{prefix}-depth.png", guess_bits=guess_bits,
                       title="Reach against depth x memory (n_layer x mem_len)")
        parts.append("### Reach against depth and memory\n\n" + distance_table(entries, labels)
                     + f"\n![depth]({prefix}-depth.png)\n")
    encs = [f"{e}-L{n_layer}-m{mem_len}" for e in ("ours", "shaw", "vaswani", "alrfou")
            if f"{e}-L{n_layer}-m{mem_len}" in names]
    mems = sorted(set(eval_mems) | {mem_len})
    if encs:
        plot_memory({v: memory_series(rows, v, mems) for v in encs + ([vanilla] if vanilla in names else [])},
                    out / f"{prefix}-memory.png", train_mem=mem_len, guess_bits=guess_bits,
                    title="Evaluation memory shorter and longer than in training")
        longer = [m for m in mems if m >= mem_len]
        shorter = [m for m in mems if m <= mem_len]
        parts.append("### Evaluation memory longer than training memory\n\nbpc of all valid tokens (of the "
                     "copies in brackets) at each evaluation memory; attn_type 3 (Al-Rfou et al.) has no learned "
                     "position beyond its training length (—).\n\n" + memory_table(rows, encs, longer)
                     + f"\n![memory]({prefix}-memory.png)\n")
        parts.append("### Evaluation memory shorter than training memory\n\n"
                     + memory_table(rows, encs + ([vanilla] if vanilla in names else []), shorter))
    parts.append("### Every trained model\n\n" + per_seed_table([*rows, *curve_rows]))
    return "\n".join(parts)
