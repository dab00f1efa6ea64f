"""``txl experiment long-context``: controlled long-range dependencies (:mod:`transformer_xl.experiments.long_context`,
issue 23)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from transformer_xl.cli.args import nonneg_int, parse_int_list, positive_float, positive_int, seed_list
from transformer_xl.errors import ConfigError
from transformer_xl.store.files import write_json, write_text


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_long_context(ex: argparse._SubParsersAction) -> None:
    """``txl experiment long-context`` (transformer_xl.experiments.long_context)."""
    from transformer_xl.cli.data import add_long_range_flags

    p = ex.add_parser("long-context", help="controlled long-range dependencies: recurrence, depth x memory, "
                      "encodings and evaluation memory, per copy distance (issue 23)",
                      description="Generates the long-range corpus (the flags of `txl data generate long-range`), "
                      "trains the variants of --parts per seed with the ablations' Trainer loop and scores the copies "
                      "of each distance apart from the rest (see transformer_xl.experiments.long_context). "
                      "Resumable: finished models are skipped. Writes OUT/long-context.md, .json and the figures "
                      "OUT/long-context-*.png.")
    add_long_range_flags(p)
    p.add_argument("--parts", default="recurrence,curve,encodings,depth,recl",
                   help="comma-separated: recurrence (Transformer-XL vs no memory vs the sliding window), curve (the "
                   "recurrence part again on one corpus per --curve-distances distance), encodings (ours, shaw, "
                   "vaswani, alrfou with the same recurrence), depth (n_layer x mem_len), recl (RECL, Appendix C, "
                   "of each seed's recurrence and encodings models) (default: all five)")
    p.add_argument("--curve-distances", default="8,12,28,40",
                   help="curve part: the copy distance of each extra corpus (default: 8,12,28,40)")
    p.add_argument("--tgt-len", type=positive_int, default=8, help="training segment length (default: 8)")
    p.add_argument("--mem-len", type=positive_int, default=24, help="training memory (default: 24)")
    p.add_argument("--n-layer", type=positive_int, default=2, help="layers of the main models (default: 2)")
    p.add_argument("--d-model", type=positive_int, default=32,
                   help="model width; 4 heads of d_model // 4, d_inner 2 * d_model (default: 32)")
    p.add_argument("--depths", default="1,2", help="depth part: layers (default: 1,2)")
    p.add_argument("--depth-mems", default="8,24", help="depth part: training memories (default: 8,24)")
    p.add_argument("--eval-mems", default="0,8,16,48,96",
                   help="evaluation memories besides the training one (recurrence and encodings parts; default: "
                   "0,8,16,48,96)")
    p.add_argument("--recl-grid", default="4:40:4", metavar="START:STOP:STEP",
                   help="recl part: the uniform context grid (default: 4:40:4)")
    p.add_argument("--recl-resamples", type=nonneg_int, default=100,
                   help="recl part: bootstrap resamples of the scored tokens (default: 100)")
    p.add_argument("--skip", type=nonneg_int, default=2,
                   help="copy tokens at offsets below this inside their span are not counted as copies (their "
                   "start cannot be told from random letters; default: 2)")
    p.add_argument("--steps", type=positive_int, default=3000, help="training steps per model (default: 3000)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="training batch (default: 16)")
    p.add_argument("--lr", type=positive_float, default=2e-3, help="Adam learning rate (default: 2e-3)")
    p.add_argument("--warmup", type=nonneg_int, default=20, help="warm-up steps (default: 20)")
    p.add_argument("--seeds", type=seed_list, default="0,1,2", help="seeds of the recurrence part (default: 0,1,2)")
    p.add_argument("--encoding-seeds", type=seed_list, help="seeds of the encodings part (default: --seeds)")
    p.add_argument("--depth-seeds", type=seed_list, help="seeds of the depth part (default: --seeds)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=run_long_context)


def run_long_context(args: argparse.Namespace) -> int:
    import math

    from transformer_xl.cli.data import long_range_spec
    from transformer_xl.data.long_range import generate
    from transformer_xl.experiments import long_context as L
    from transformer_xl.experiments.long_context_recl import recl_per_seed, recl_report, recl_summary
    from transformer_xl.experiments.long_context_report import write_report
    from transformer_xl.experiments.recl import parse_grid
    from transformer_xl.inference.loading import check_device

    device = str(check_device(args.device))
    parts = [x.strip() for x in args.parts.split(",")]
    depths = parse_int_list(args.depths, "--depths", minimum=1)
    depth_mems = parse_int_list(args.depth_mems, "--depth-mems", minimum=0)
    eval_mems = parse_int_list(args.eval_mems, "--eval-mems", minimum=0)
    unknown = [x for x in parts if x not in (*L.PARTS, "curve", "recl")]
    if unknown:
        raise ConfigError(f"--parts: unknown {', '.join(unknown)}; known: {', '.join(L.PARTS)}, curve, recl")
    curve = parse_int_list(args.curve_distances, "--curve-distances", minimum=1) if "curve" in parts else []
    contexts = parse_grid(args.recl_grid) if "recl" in parts else []
    plan = [(L.part_variants(part, mem_len=args.mem_len, n_layer=args.n_layer, depths=depths,
                             depth_mems=depth_mems), part) for part in parts if part in L.PARTS]
    text = generate(long_range_spec(args))
    base = L.default_base(len(text.spec.symbols)).replace(d_model=args.d_model, d_head=max(1, args.d_model // 4),
                                                          d_inner=2 * args.d_model)
    kw = dict(tgt_len=args.tgt_len, steps=args.steps, skip=args.skip, batch_size=args.batch_size, lr=args.lr,
              warmup=args.warmup, device=device, log=_log)
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for variants, part in plan:
        depth = part == "depth"
        seeds = {"depth": args.depth_seeds, "encodings": args.encoding_seeds}.get(part) or args.seeds
        for r in L.run_long_context(base, text, args.out, variants, seeds=seeds, eval_mems=[] if depth else eval_mems,
                                    **kw):
            rows[(r["seed"], r["variant"])] = r
    curve_rows = []
    if curve:
        recurrence = L.part_variants("recurrence", mem_len=args.mem_len, n_layer=args.n_layer, depths=[],
                                     depth_mems=[])
        curve_rows = L.run_distance_curve(base, text.spec, Path(args.out) / "curve", recurrence, curve,
                                          seeds=args.seeds, eval_mems=[], **kw)
        if len(text.spec.distances) == 1:  # the main corpus is one more point of the curve
            names = {v.name for v in recurrence}
            curve_rows += [{**r, "corpus_distance": text.spec.distances[0]} for r in rows.values()
                           if r["variant"] in names and r["seed"] in args.seeds]
    out = Path(args.out)
    guess = math.log2(len(text.spec.symbols_filler))
    md = write_report(list(rows.values()), out, mem_len=args.mem_len, n_layer=args.n_layer, eval_mems=eval_mems,
                      guess_bits=guess, curve_rows=curve_rows)
    recl = None
    if contexts:
        recl_seeds = args.encoding_seeds or args.seeds if "encodings" in parts else args.seeds
        group = [v.name for variants, part in plan if part in ("recurrence", "encodings") for v in variants
                 if all((s, v.name) in rows for s in recl_seeds)]
        if len(group) < 2:
            raise ConfigError("--parts recl compares a group: train the recurrence or encodings part with it")
        results = recl_per_seed(out, text.ids["valid"], list(dict.fromkeys(group)), recl_seeds, contexts=contexts,
                                resamples=args.recl_resamples, device=device, log=_log)
        md += "\n" + recl_report(results, out)
        recl = {"seeds": {s: r.to_dict() for s, r in results.items()}, "summary": recl_summary(results)}
    doc = {"command": {k: v for k, v in vars(args).items() if k != "func"}, "corpus": text.spec.to_dict(),
           "copied_spans": {s: len(v) for s, v in text.spans.items()}, "model": base.to_dict(),
           "guess_bits": guess, "rows": list(rows.values()), "curve_rows": curve_rows, "recl": recl}
    write_text(out / "long-context.md", md)
    write_json(out / "long-context.json", doc, sort_keys=False)
    print(md)
    print(f"wrote {out}/long-context.md, .json, long-context-*.png", file=sys.stderr)
    return 0
