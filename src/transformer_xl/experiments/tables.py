"""Results (dicts/JSON) to Markdown tables and PNG plots.

Plots need matplotlib (the ``plot`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, install_hint


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; floats are written as given (format them before)."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(f"plots need matplotlib: {install_hint('plot')}") from None
    return plt


# ---------------------------------------------------------------------------------------------- memory sweep
def _attention(r: dict[str, Any]) -> str:
    """Keys a query attends to: exactly mem_len with same_length, else from mem_len + 1 to mem_len + tgt_len."""
    if r["same_length"] and r["mem_len"] > 0:
        return str(r["mem_len"])
    return f"{r['mem_len'] + 1}–{r['mem_len'] + r['tgt_len']}"


def sweep_table(rows: Sequence[dict[str, Any]], char_level: bool) -> str:
    """``txl eval --mem-len a,b,c`` results: one row per memory length."""
    metric = "bpc" if char_level else "ppl"
    body = [[r["mem_len"], r["tgt_len"], _attention(r), r["clamp_len"], r["same_length"],
             f"{r['loss']:.4f}", f"{r[metric]:.4f}" if char_level else f"{r[metric]:.2f}", f"{r['tokens']:,}",
             f"{r['seconds']:.1f}", f"{r['tokens_per_s']:,.0f}"] for r in rows]
    return markdown_table(["mem_len", "tgt_len", "keys per query", "clamp_len", "same_length", "loss (nats)", metric,
                           "tokens", "seconds", "tokens/s"], body)


def plot_sweep(rows: Sequence[dict[str, Any]], path: str | Path, *, char_level: bool, title: str = "") -> Path:
    plt = pyplot()
    metric = "bpc" if char_level else "ppl"
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["mem_len"] for r in rows], [r[metric] for r in rows], "o-")
    ax.set_xlabel("evaluation mem_len")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} vs memory length")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------------------- eval speed
def _med(r: dict[str, Any], key: str, fmt: str, unit: str = "") -> str:
    """``median (min–max)`` of a :mod:`transformer_xl.experiments.speed` row's ``key``, each written with ``fmt``."""
    return f"{r[key]:{fmt}}{unit} ({r[key + '_min']:{fmt}}–{r[key + '_max']:{fmt}})"


def speed_table(rows: Sequence[dict[str, Any]]) -> str:
    """Table 9 twice: vanilla / XL with txl's caches and vanilla / cache-free XL (the paper's code), one row per
    attention length; every cell the median over repeats with (min–max)."""
    body = [[r["attn_len"], _med(r, "xl_cached_ms_per_token", ".4f"), _med(r, "xl_uncached_ms_per_token", ".4f"),
             _med(r, "vanilla_ms_per_token", ".2f"), f"{r['vanilla_rows']} x {r['vanilla_forwards']}",
             _med(r, "slowdown_cached", ",.0f", "x"), _med(r, "slowdown_uncached", ",.0f", "x"),
             _med(r, "cache_speedup", ".2f", "x")] for r in rows]
    table = markdown_table(["attn len L", "XL, txl's caches: ms/token", "XL, cache-free: ms/token",
                            "vanilla: ms/token", "vanilla windows x forwards", "vanilla ÷ XL (txl's caches)",
                            "vanilla ÷ XL (cache-free, as the paper's code)", "cache-free ÷ cached XL"], body)
    if not rows:
        return table
    r = rows[0]
    return table + (f"\nEach cell: the {r['statistic']} over {r['repeats']} repeats (min–max); a ratio is the "
                    f"{r['statistic']} of the repeats' own ratios. Per repeat: XL {r['xl_segments']} segments of "
                    f"{r['xl_batch']} x {r['xl_tgt_len']} tokens (mem_len = L, same_length) after filling the "
                    "memory; vanilla the windows x forwards shown.\n")


def plot_speed(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Left: ms per token of the three (medians, min–max bars); right: the two slow-downs."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    lens = [r["attn_len"] for r in rows]

    def errorbar(ax: Any, key: str, fmt: str, label: str, **kw: Any) -> None:
        mid = [r[key] for r in rows]
        err = [[m - r[key + "_min"] for m, r in zip(mid, rows)], [r[key + "_max"] - m for m, r in zip(mid, rows)]]
        ax.errorbar(lens, mid, yerr=err, fmt=fmt, capsize=3, label=label, **kw)

    errorbar(a, "xl_cached_ms_per_token", "o-", "Transformer-XL, txl's caches")
    errorbar(a, "xl_uncached_ms_per_token", "^-", "Transformer-XL, cache-free (paper's code)")
    errorbar(a, "vanilla_ms_per_token", "s-", "vanilla (sliding window)")
    a.set_yscale("log")
    a.set_xlabel("attention length")
    a.set_ylabel("ms per token")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    errorbar(b, "slowdown_cached", "o-", "vs XL with txl's caches", color="C0")
    errorbar(b, "slowdown_uncached", "^-", "vs cache-free XL (paper's code)", color="C1")
    b.set_xlabel("attention length")
    b.set_ylabel("vanilla time / XL time")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    stat = rows[0]["statistic"] if rows else "median"
    fig.suptitle(title or f"Evaluation speed (paper Table 9); {stat}s over repeats, bars min–max")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------------------- RECL
def recl_protocol(result: Any) -> str:
    """How the RECL of ``result`` was measured, as Markdown bullets: method and receptive field, grid, tokens,
    top-r sizes, threshold, bootstrap."""
    from transformer_xl.experiments.recl import RECEPTIVE_FIELD, top_count

    lines = []
    if result.method is not None:
        lines.append(f"* l_i(c, t) measured by `{result.method}` for every model of the group: "
                     f"{RECEPTIVE_FIELD[result.method]}.")
        if result.receptive_field:
            fields = "; ".join(f"{n} {v[0]}…{v[-1]}" for n, v in result.receptive_field.items())
            lines.append(f"* Input tokens one prediction can read at c = {result.contexts[0]}…{result.contexts[-1]}: "
                         f"{fields}.")
    step = result.step
    grid = f"{result.contexts[0]}:{result.contexts[-1]}:{step}" if step else ",".join(map(str, result.contexts))
    lines.append(f"* Grid {grid} " + (f"(uniform, Δ = {step})" if step else
                                      "(NOT uniform: the threshold applies per step, a longer step passes it more "
                                      "easily)") + f"; threshold {100 * result.threshold:g}% per step.")
    if result.tokens:
        tops = ", ".join(f"{top_count(r, result.tokens):,} (r = {r:g})" for r in result.r_values)
        lines.append(f"* {result.tokens:,} scored tokens; top-r sets of {tops}.")
    if result.resamples:
        lo, hi = result.interval
        lines.append(f"* Spread: bootstrap over the scored tokens, {result.resamples} resamples (seed {result.seed}); "
                     f"RECL [{100 * lo:g}–{100 * hi:g} % interval of the resampled RECL], gains ± their std.")
    return "\n".join(lines) + "\n"


def recl_table(result: Any) -> str:
    """Table 8 layout: one row per model, one column per ``r``; censored values are written ``>= c``, and
    with a bootstrap each RECL is followed by its interval ``[lo–hi]``."""
    rows = []
    for i, name in enumerate(result.names):
        cells = []
        for r in result.r_values:
            v = result.recl[name][r]
            cell = f">= {v}" if result.censored[name][r] else str(v)
            if result.recl_interval:
                lo, hi = result.recl_interval[name][r]
                cell += f" [{lo}–{hi}]"
            cells.append(cell)
        cap = result.capped[name]
        ppl = result.ppl[i] if result.ppl is not None else None
        rows.append([name, *cells, "" if cap is None else cap,
                     "" if ppl is None else f"{ppl[0]:.3f} → {ppl[-1]:.3f}"])
    method = f" ({result.method})" if result.method else ""
    return markdown_table(["model", *[f"r = {r:g}" for r in result.r_values], "max context",
                           f"plain ppl at {result.contexts[0]} → {result.contexts[-1]}{method}"], rows)


def recl_gain_table(result: Any, r: float) -> str:
    """Relative gains ``g_i(c, c')`` (percent) per grid step for one ``r``, ``± std`` with a bootstrap."""
    steps = [f"{a}→{b}" for a, b in zip(result.contexts, result.contexts[1:])]
    g = result.gains[r]
    sd = result.gain_std.get(r)
    rows = [[name, *[f"{100 * x:.2f}" + ("" if sd is None else f" ± {100 * sd[i, k]:.2f}") for k, x in enumerate(g[i])]]
            for i, name in enumerate(result.names)]
    return markdown_table(["model (gain %)", *steps], rows)


def plot_recl(result: Any, path: str | Path, *, unnormalized: dict[float, Any] | None = None,
              title: str = "") -> Path:
    """Left: relative gain g(c, c + Δ) per model for each r (± its bootstrap std) with the threshold; right:
    plain ppl vs context."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(result.r_values) + 1, figsize=(4.2 * (len(result.r_values) + 1), 3.8))
    x = result.contexts[:-1]
    for ax, r in zip(axes, result.r_values):
        sd = result.gain_std.get(r)
        for i, name in enumerate(result.names):
            ax.errorbar(x, 100 * result.gains[r][i], yerr=None if sd is None else 100 * sd[i], fmt="o-",
                        capsize=2, label=name)
        ax.axhline(100 * result.threshold, color="k", ls="--", lw=1, label=f"{100 * result.threshold:g}% threshold")
        ax.set_title(f"r = {r:g}")
        ax.set_xlabel("short context c (gain of c → next)")
        ax.set_ylabel("relative gain g(c, c') %")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if result.ppl is not None:
        for i, name in enumerate(result.names):
            axes[-1].plot(result.contexts, result.ppl[i], "o-", label=name)
        axes[-1].set_xlabel("context length")
        axes[-1].set_ylabel("perplexity (plain)")
        axes[-1].set_title("perplexity vs context")
        axes[-1].grid(alpha=0.3)
    method = f", l_i(c, t) by {result.method}" if result.method else ""
    fig.suptitle(title or f"Relative effective context length (paper Table 8, Appendix C{method})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
