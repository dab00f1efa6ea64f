"""Render every table of figures in README.md and docs/*.md from its result file (``make figures``).

Blocks sit between ``<!-- figures: benchmarks/results/NAME.json -->`` and ``<!-- /figures -->``
(:mod:`transformer_xl.experiments.bench.figures`). Usage::

    python benchmarks/render_docs.py          # rewrite the blocks
    python benchmarks/render_docs.py --check  # exit 1 and name the pages that are out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformer_xl.errors import TXLError
from transformer_xl.experiments.bench.figures import update_pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report the pages whose blocks are out of date")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository root")
    args = p.parse_args(argv)
    try:
        changed = update_pages(args.root, check=args.check)
    except TXLError as exc:
        print(f"render_docs: {exc}", file=sys.stderr)
        return 2
    for page in changed:
        print(f"{'out of date' if args.check else 'rendered'}: {page.relative_to(args.root)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
