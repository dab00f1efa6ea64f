"""The ``txl`` command: a thin dispatcher over library functions.

Each subcommand lives in its own module of this package and exposes ``add_parser(subparsers)``
(which registers its arguments and sets ``func``) and a ``run(args) -> int`` function that only
parses/prints and calls into the library.

Every input or environment error ends the command with one line on stderr and a non-zero exit:

* an error a user can fix (:class:`transformer_xl.errors.TXLError`, a bad option): ``txl CMD: error: ...``, exit 2;
* the system refusing (disk full, read-only, permission denied, a missing file or folder, see
  :data:`ENVIRONMENT_ERRNOS`), a file that is not UTF-8, memory or CUDA missing:
  ``txl CMD: error: <what> (<path>)``, exit 1;
* Ctrl-C at any moment, imports and argument parsing included: ``txl CMD: interrupted``, exit 130.

Any other exception is a bug and keeps its traceback. ``txl --debug CMD ...`` or ``TXL_DEBUG=1`` shows the
traceback of every error.

Compute commands run on ``--threads N`` CPU threads (before or after the subcommand), else ``TXL_NUM_THREADS``,
else what ``OMP_NUM_THREADS`` gave torch, else the cores available to the process; set once, before dispatch.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from transformer_xl.cli.args import (
    THREADED_COMMANDS,
    THREADS_HELP,
    add_threads,
    apply_threads,
    positive_int,
    resolve_threads,
)
from transformer_xl.errors import TXLError

#: OS error numbers that describe the machine or the user's paths, not a bug: printed as one line.
ENVIRONMENT_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ENOSPC", "EDQUOT", "EACCES", "EPERM", "EROFS", "EISDIR", "ENOTDIR", "ENOENT", "EEXIST", "ENOTEMPTY",
    "ENAMETOOLONG", "ELOOP", "EFBIG", "EIO", "EMFILE", "ENFILE", "EBUSY", "ETXTBSY", "EXDEV", "ENOMEM", "EPIPE",
) if hasattr(errno, name))
_CUDA_HINTS = ("Torch not compiled with CUDA", "Found no NVIDIA driver", "no CUDA GPUs are available",
               "CUDA driver initialization failed")


class UsageError(Exception):
    """A command line argparse refuses: ``txl CMD: error: ... (see txl CMD --help)``, exit 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (a :class:`UsageError` that :func:`main` prints)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def _build_parser() -> argparse.ArgumentParser:
    from transformer_xl.cli import bench, convert, data, experiment, export, generate, plot, score, serve, train
    from transformer_xl.cli import eval as eval_cmd
    from transformer_xl.version import __version__

    parser = Parser(prog="txl", description="Transformer-XL: train, evaluate, convert, sample.",
                    epilog="errors are one line; --debug (or TXL_DEBUG=1) shows their traceback")
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of every error (also TXL_DEBUG=1)")
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N", help=THREADS_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (train, data, convert, export, generate, plot, eval_cmd, score, experiment, bench, serve):
        module.add_parser(sub)
    for name in THREADED_COMMANDS:
        add_threads(sub.choices[name])
    return parser


def _command(argv: Sequence[str]) -> str:
    """``txl CMD`` from the raw arguments (the first word not an option), ``txl`` when there is none."""
    words = [a for a in argv if not a.startswith("-")]
    return f"txl {words[0]}" if words else "txl"


def _debug(argv: Sequence[str]) -> bool:
    """``--debug`` before the subcommand, or ``TXL_DEBUG`` set to a true value."""
    head = []
    for a in argv:
        if not a.startswith("-"):
            break
        head.append(a)
    return "--debug" in head or os.environ.get("TXL_DEBUG", "").lower() in ("1", "true", "yes", "on")


def describe_environment_error(exc: BaseException) -> str | None:
    """One line for an error of the machine or of the user's files, or None for anything else (a bug)."""
    if isinstance(exc, TXLError):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return f"a file is not valid UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, MemoryError):
        return "out of memory" + (f" ({exc})" if str(exc) else "")
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
        what = (exc.strerror or os.strerror(exc.errno)).rstrip(".")
        what = what[:1].lower() + what[1:]
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        return f"{what} ({' -> '.join(paths)})" if paths else what
    if isinstance(exc, (RuntimeError, AssertionError)) and any(h in str(exc) for h in _CUDA_HINTS):
        return f"CUDA is not available ({str(exc).splitlines()[0]}); use --device cpu"
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
        return f"out of GPU memory ({str(exc).splitlines()[0]})"
    if isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc):
        return f"out of memory ({str(exc).splitlines()[0]})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``txl ARGV``; the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug(argv)
    command = _command(argv)
    try:
        args = _build_parser().parse_args(argv)
        command = f"txl {args.command}"
        # set once, before any computation (transformer_xl.cli.args.resolve_threads)
        if args.command in THREADED_COMMANDS:
            args.threads = apply_threads(resolve_threads(args.threads))
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        line = describe_environment_error(exc)
        if line is None or debug:
            raise
        if isinstance(exc, BrokenPipeError):  # the reader went away (`txl generate | head`): nothing to say
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        # One write, so that the lines of several processes sharing a stderr (torchrun's workers) never interleave.
        sys.stderr.write(f"{command}: error: {' '.join(line.split())}\n")
        sys.stderr.flush()
        return 2 if isinstance(exc, TXLError) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
