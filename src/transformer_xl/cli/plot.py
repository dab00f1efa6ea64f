"""``txl plot RUN_DIR``: learning curves of a training run as a PNG (see :mod:`transformer_xl.train.plot`)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot a training run's learning curves to a PNG",
                       description="Train/valid loss against step and wall time, learning rate and tokens/s.")
    p.add_argument("run_dir", help="a `txl train` output directory (holding metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    p.add_argument("--title", default=None, help="figure title (default: preset, dataset and model size)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformer_xl.train.plot import plot_run

    print(plot_run(args.run_dir, args.out, title=args.title))
    return 0
