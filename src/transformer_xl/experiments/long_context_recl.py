"""RECL (paper Table 8, Appendix C) of the long-context experiment's trained models, on its corpus (issue 23).

Per seed, the group is every trained model of that seed with the main depth (Transformer-XL, the model without
memory, the other encodings): each is read back from ``OUT/seed<k>/<variant>/`` and its per-token loss
``l_i(c, t)`` measured on the valid split by Appendix C's definition (:mod:`transformer_xl.experiments.recl`,
method ``window``: token ``t`` given exactly its ``c`` previous tokens, no memory), cached in ``OUT/recl-cache``;
:func:`transformer_xl.experiments.recl.compute_recl` gives each model's RECL per ``r`` with the bootstrap
interval over tokens. The report gives, per variant, the mean ± sample std of RECL over the seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl.errors import ConfigError
from transformer_xl.experiments import recl as R
from transformer_xl.experiments.ablation_report import mean_spread
from transformer_xl.experiments.tables import markdown_table, plot_recl, recl_protocol
from transformer_xl.model import TransformerXLLM
from transformer_xl.store.layout import weights_digest


def seed_group(out_dir: str | Path, seed: int, variants: Sequence[str], *, device: Any = None) -> list[R.GroupMember]:
    """The trained models ``variants`` of ``seed`` under ``out_dir``, read back as a RECL group."""
    members = []
    for name in variants:
        path = Path(out_dir) / f"seed{seed}" / name
        if not (path / "result.json").is_file():
            raise ConfigError(f"{path} holds no finished model: train it first (RECL reads the trained models)")
        members.append(R.GroupMember(name, TransformerXLLM.from_pretrained(path, map_location=device or "cpu"),
                                     weights_digest(path)))
    return members


def recl_per_seed(out_dir: str | Path, data: np.ndarray, variants: Sequence[str], seeds: Sequence[int], *,
                  contexts: Sequence[int], r_values: Sequence[float] = (0.1, 0.5, 1.0), threshold: float = 0.01,
                  resamples: int = 100, tokens: int | None = None, device: Any = None,
                  log: Callable[[str], None] | None = None) -> dict[int, R.RECLResult]:
    """RECL of the group of each seed (module docstring), over ``tokens`` scored positions from ``max(contexts)``
    (default: the rest of the split)."""
    start = max(contexts)
    n = len(data) - start if tokens is None else tokens
    cache = R.LossCache(Path(out_dir) / "recl-cache")
    out = {}
    for seed in seeds:
        members = seed_group(out_dir, seed, variants, device=device)
        losses, caps = R.group_losses(members, data, contexts, method=R.WINDOW, start=start, tokens=n,
                                      data_key={"dataset": "long-range", "split": "valid"}, cache=cache, device=device)
        out[seed] = R.compute_recl(losses, contexts, names=list(variants), r_values=r_values, threshold=threshold,
                                   max_context=caps, resamples=resamples, seed=seed, method=R.WINDOW,
                                   receptive=R.group_receptive_fields(members, contexts, R.WINDOW))
        if log is not None:
            log(f"RECL seed {seed}: " + ", ".join(f"{v} {out[seed].recl[v][r_values[0]]}" for v in variants)
                + f" (r = {r_values[0]:g})")
    return out


def recl_summary(results: dict[int, R.RECLResult]) -> dict[str, dict[str, Any]]:
    """Per variant and ``r``: the RECL of each seed, their mean and sample std, and how many were censored."""
    first = next(iter(results.values()))
    return {v: {str(r): {"seeds": {s: res.recl[v][r] for s, res in results.items()},
                         **mean_spread([res.recl[v][r] for res in results.values()]),
                         "censored": sum(res.censored[v][r] for res in results.values())}
                for r in first.r_values} for v in first.names}


def recl_report(results: dict[int, R.RECLResult], out_dir: str | Path, *, prefix: str = "long-context") -> str:
    """The Markdown section: RECL mean ± std over seeds per variant and ``r`` (each seed's value after it), and
    the first seed's gains figure ``OUT/<prefix>-recl.png``."""
    summary = recl_summary(results)
    first_seed, first = next(iter(results.items()))
    body = []
    for v, per_r in summary.items():
        cells = []
        for r in first.r_values:
            s = per_r[str(r)]
            spread = "" if s["std"] is None else f" ± {s['std']:.1f}"
            cells.append(f"{s['mean']:.1f}{spread} ({', '.join(map(str, s['seeds'].values()))})"
                         + (f", {s['censored']} censored" if s["censored"] else ""))
        body.append([v, *cells])
    plot_recl(first, Path(out_dir) / f"{prefix}-recl.png",
              title=f"RECL on the long-range corpus, seed {first_seed} (window method, Appendix C)")
    return ("### RECL on this corpus (Table 8, Appendix C)\n\n" + recl_protocol(first)
            + f"\nSeeds {', '.join(map(str, results))}; RECL mean ± std over the seeds (each seed's value in "
            "brackets).\n\n" + markdown_table(["model", *[f"r = {r:g}" for r in first.r_values]], body)
            + f"\n![recl]({prefix}-recl.png)\n")
