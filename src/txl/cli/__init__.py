"""The ``txl`` command: a thin dispatcher over library functions.

Each subcommand lives in its own module of this package and exposes ``add_parser(subparsers)``
(which registers its arguments and sets ``func``) and a ``run(args) -> int`` function that only
parses/prints and calls into the library. Errors that a user can fix (:class:`txl.errors.TXLError`)
are printed as one line and give exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from txl.errors import TXLError
from txl.version import __version__


def _build_parser() -> argparse.ArgumentParser:
    from txl.cli import bench, convert, data, experiment, generate, plot, train
    from txl.cli import eval as eval_cmd

    parser = argparse.ArgumentParser(prog="txl", description="Transformer-XL: train, evaluate, convert, sample.")
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (train, data, convert, generate, plot, eval_cmd, experiment, bench):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TXLError as exc:
        print(f"txl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"txl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
