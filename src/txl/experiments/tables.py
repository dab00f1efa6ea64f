"""Results (dicts/JSON) to Markdown tables and PNG plots. Plots need matplotlib (``pip install txl[plot]``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txl.errors import ConfigError


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; floats are written as given (format them before)."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'txl[plot]'") from None
    return plt


# ---------------------------------------------------------------------------------------------- ablations
def _metric(stat: dict[str, Any] | None, loss: dict[str, Any] | None, char_level: bool, digits: int) -> str:
    if stat is None:
        return "—"
    s = {k: (v / math.log(2) if v is not None and k != "n" else v) for k, v in loss.items()} if char_level else stat
    text = f"{s['mean']:.{digits}f}"
    return text if s["std"] is None else f"{text} ± {s['std']:.{digits}f}"


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,.0f}"


def ablation_aggregate_table(agg: Sequence[dict[str, Any]], *, char_level: bool = False) -> str:
    """Table 6 / 10 layout over seeds (:func:`txl.experiments.ablations.aggregate`): mean ± sample standard
    deviation (bpc from the losses when ``char_level``)."""
    from txl.experiments.ablations import ENCODING_NAMES

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
    from txl.experiments.ablations import ENCODING_NAMES

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
    plt = _pyplot()
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
def speed_table(rows: Sequence[dict[str, Any]]) -> str:
    body = [[r["attn_len"], f"{r['xl_batch']} x {r['xl_tgt_len']}", f"{r['xl_ms_per_token']:.3f}", r["vanilla_rows"],
             f"{r['vanilla_ms_per_token']:.2f}", f"{r['slowdown']:,.0f}x",
             f"{r['slowdown_median']:,.0f}x" if "slowdown_median" in r else ""] for r in rows]
    return markdown_table(["attn len L", "XL batch x tgt_len (mem_len = L)", "XL ms/token", "vanilla windows/forward",
                           "vanilla ms/token", "vanilla slower by (fastest repeats)", "(medians)"], body)


def plot_speed(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    lens = [r["attn_len"] for r in rows]
    a.plot(lens, [r["xl_ms_per_token"] for r in rows], "o-", label="Transformer-XL (memory)")
    a.plot(lens, [r["vanilla_ms_per_token"] for r in rows], "s-", label="vanilla (sliding window)")
    a.set_yscale("log")
    a.set_xlabel("attention length")
    a.set_ylabel("ms per token")
    a.legend()
    a.grid(alpha=0.3)
    b.plot(lens, [r["slowdown"] for r in rows], "o-", color="C3")
    b.set_xlabel("attention length")
    b.set_ylabel("vanilla time / XL time")
    b.grid(alpha=0.3)
    fig.suptitle(title or "Evaluation speed (paper Table 9)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------------------- RECL
def recl_table(result: Any) -> str:
    """Table 8 layout: one row per model, one column per ``r``; censored values are written ``>= c``."""
    rows = []
    for i, name in enumerate(result.names):
        cells = []
        for r in result.r_values:
            v = result.recl[name][r]
            cells.append(f">= {v}" if result.censored[name][r] else str(v))
        cap = result.capped[name]
        ppl = result.ppl[i] if result.ppl is not None else None
        rows.append([name, *cells, "" if cap is None else cap,
                     "" if ppl is None else f"{ppl[0]:.3f} → {ppl[-1]:.3f}"])
    return markdown_table(["model", *[f"r = {r:g}" for r in result.r_values], "max context",
                           f"plain ppl at {result.contexts[0]} → {result.contexts[-1]}"], rows)


def recl_gain_table(result: Any, r: float) -> str:
    """Relative gains ``g_i(c, c')`` (percent) per grid step for one ``r``."""
    steps = [f"{a}→{b}" for a, b in zip(result.contexts, result.contexts[1:])]
    g = result.gains[r]
    rows = [[name, *[f"{100 * x:.2f}" for x in g[i]]] for i, name in enumerate(result.names)]
    return markdown_table(["model (gain %)", *steps], rows)


def plot_recl(result: Any, path: str | Path, *, unnormalized: dict[float, Any] | None = None,
              title: str = "") -> Path:
    """Left: relative gain g(c, c + Δ) per model for each r with the threshold; right: plain ppl vs context."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(result.r_values) + 1, figsize=(4.2 * (len(result.r_values) + 1), 3.8))
    x = result.contexts[:-1]
    for ax, r in zip(axes, result.r_values):
        for i, name in enumerate(result.names):
            ax.plot(x, 100 * result.gains[r][i], "o-", label=name)
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
    fig.suptitle(title or "Relative effective context length (paper Table 8, Appendix C)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
