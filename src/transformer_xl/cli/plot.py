"""``txl plot RUN_DIR``: learning curves of a training run as a PNG (see :mod:`transformer_xl.train.plot`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer_xl.errors import ConfigError

#: The first bytes of every PNG file: an existing ``--out`` without them is not a plot to replace.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot a training run's learning curves to a PNG",
                       description="Train/valid loss against step and wall time, learning rate and tokens/s.")
    p.add_argument("run_dir", help="a `txl train` output directory (holding metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png); an existing file there must "
                   "be a PNG (replaced)")
    p.add_argument("--force", action="store_true", help="write --out even over a file that is not a PNG: the old "
                   "file is moved aside to OUT.old-N, not deleted")
    p.add_argument("--title", default=None, help="figure title (default: preset, dataset and model size)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformer_xl.train.plot import plot_run

    out = None if args.out is None else Path(args.out)
    backup = None if out is None else _claim(out, args.force)
    if backup is None:
        print(plot_run(args.run_dir, args.out, title=args.title))
        return 0
    import os
    import sys
    import uuid

    # --force: the plot is drawn beside --out (which may be a file the plot reads), then takes its place
    stage = out.with_name(f".{out.name}.new-{uuid.uuid4().hex[:8]}.png")
    try:
        plot_run(args.run_dir, stage, title=args.title)
    except BaseException:
        stage.unlink(missing_ok=True)
        raise
    os.rename(out, backup)
    os.rename(stage, out)
    print(f"txl plot: moved the old {out} aside to {backup} (--force)", file=sys.stderr)
    print(out)
    return 0


def _claim(out: Path, force: bool) -> Path | None:
    """Where ``--force`` moves an ``out`` that exists and is not a PNG (a directory, the run's metrics.jsonl), or
    ``None`` when ``out`` may be written (absent, or a PNG: replaced); without ``force`` such an ``out`` is refused in
    one line (:func:`transformer_xl.store.outputs.backup_path`)."""
    from transformer_xl.store.outputs import backup_path

    if not out.exists():
        return None
    if out.is_file():
        with open(out, "rb") as f:
            if f.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE:
                return None
    backup = backup_path(out)
    if not force:
        raise ConfigError(f"{out} exists and is not a PNG: refusing to write over it; give another --out, or --force "
                          f"to move it aside to {backup}")
    return backup
