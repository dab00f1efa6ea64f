"""Parsing command-line values: lists the library takes, argparse types that refuse impossible numbers
(``positive_int``, ``nonneg_int``, ``clamp_int``, ``seed_int``, ``seed_list``, ``finite_float``, ``positive_float``,
``nonneg_float``), options several commands share (``--no-verify``, ``--threads``: :func:`add_threads`,
:func:`resolve_threads`, :func:`apply_threads`), and notes on stderr (:func:`stderr_note`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from transformer_xl.errors import ConfigError


def parse_int_list(text: str | int | Sequence[int], name: str = "value", *, minimum: int = 0) -> list[int]:
    """``"0,128,512"`` -> ``[0, 128, 512]``; a one-line :class:`ConfigError` for anything else."""
    if isinstance(text, int):
        items: list[Any] = [text]
    elif isinstance(text, str):
        items = [t.strip() for t in text.split(",")]
    else:
        items = list(text)
    out = []
    for item in items:
        try:
            value = int(item)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} values must be >= {minimum}, got {value}")
        out.append(value)
    if not out:
        raise ConfigError(f"{name} is empty")
    return out


def parse_float_list(text: str, name: str) -> list[float]:
    """``"0.1,0.5"`` -> ``[0.1, 0.5]``; a one-line :class:`ConfigError` for anything else."""
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise ConfigError(f"{name} must be a comma-separated list of numbers, got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise ConfigError(f"{name} must hold finite numbers, got {text!r}")
    return values


# ---------------------------------------------------------------------------------------------- argparse types
def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    """An argparse ``type``: an integer >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def clamp_int(text: str) -> int:
    """An argparse ``type`` for ``--clamp-len``: an integer >= -1 (-1 or 0: no clamping)."""
    value = int(_number(text, int))
    if value < -1:
        raise argparse.ArgumentTypeError(f"expected an integer >= -1 (-1 or 0: no clamping), got {text!r}")
    return value


def finite_float(text: str) -> float:
    """An argparse ``type``: a finite number (not nan or inf)."""
    return float(_number(text, float))


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def nonneg_float(text: str) -> float:
    """An argparse ``type``: a finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def seed_int(text: str) -> int:
    """An argparse ``type`` for a random seed: an integer in [0, 2**32 - 1] (what every generator accepts)."""
    value = int(_number(text, int))
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**32 - 1], got {text!r}")
    return value


def seed_list(text: str) -> list[int]:
    """An argparse ``type`` for ``--seeds``: distinct seeds (each a :func:`seed_int`), comma-separated."""
    seeds = [seed_int(t.strip()) for t in text.split(",")]
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds, got {text!r}")
    return seeds


#: What the help of every argument that takes a model adds: a Hub id works too (:mod:`transformer_xl.interop.hub`).
HUB_ID_HELP = ("a Hugging Face Hub id ORG/NAME[@REVISION] works too, fetched through huggingface_hub (its cache, "
               "HF_HUB_OFFLINE, HF_TOKEN; a local path of that name, or under a local ORG/ folder, wins)")


def add_command(sub: argparse._SubParsersAction, name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The subcommand ``name`` described by ``text``: its first paragraph is the one-line help of the command list,
    the rest the description of its own ``--help`` (whitespace folded, as argparse folds it)."""
    summary, _, description = text.strip().partition("\n\n")
    return sub.add_parser(name, help=" ".join(summary.split()), description=" ".join(description.split()) or None,
                          **kwargs)


def add_model(parser: argparse.ArgumentParser, dest: str, metavar: str, what: str) -> None:
    """The positional argument naming a model (``args.<dest>``): ``what`` it may be, and that a Hub id works too."""
    parser.add_argument(dest, metavar=metavar, help=f"{what}; {HUB_ID_HELP}")


#: What a model argument may name (before the Hub id).
MODEL_DIRS = "model directory (config.json + model.safetensors), checkpoint step_* dir, or run dir"
#: The devices ``--device`` names.
DEVICE_HELP = "torch device: cpu, cuda or cuda:N (default: cpu)"


def add_device(parser: argparse.ArgumentParser, help: str = DEVICE_HELP) -> None:
    """``--device`` (``args.device``, default ``cpu``)."""
    parser.add_argument("--device", default="cpu", help=help)


def add_dataset(parser: argparse.ArgumentParser, help: str, *, default: str | None = None,
                splits: Sequence[str] | None = None, any_split: bool = False) -> None:
    """``--dataset`` (required without a ``default``), ``--split`` (default ``valid``: one of ``splits``, or any name
    with ``any_split``; none when neither is given) and ``--data-dir``."""
    parser.add_argument("--dataset", required=default is None, default=default, help=help)
    if splits or any_split:
        parser.add_argument("--split", default="valid", choices=list(splits) if splits else None,
                            help="split (default: valid)")
    parser.add_argument("--data-dir", help="raw data folder (default: $TXL_DATA_DIR, then the cache)")


def add_report_outputs(parser: argparse.ArgumentParser) -> None:
    """``--json PATH`` (the full report) and ``--markdown PATH`` (its table appended) of a benchmark."""
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--markdown", help="append the Markdown table to this file")


def add_no_verify(parser: argparse.ArgumentParser) -> None:
    """``--no-verify`` (``args.no_verify``): read weights without checking them against their ``MANIFEST.json``."""
    parser.add_argument("--no-verify", action="store_true",
                        help="load weights whose files do not match their MANIFEST.json SHA-256 (changed on "
                        "purpose); NaN/inf weights and a config that does not fit them are still refused")


def int8_check(model: Any, rows: int, note: Callable[[str], None]) -> None:
    """Say in one line (``note``) when ``model``'s int8 weights measure no faster than float32 for products of
    ``rows`` rows on this CPU (:func:`transformer_xl.model.int8.int8_speedup`: a probe of milliseconds)."""
    from transformer_xl.model.int8 import int8_note, int8_speedup

    cfg = model.config
    line = int8_note(int8_speedup(cfg.d_inner, cfg.d_model, rows), rows)
    if line is not None:
        note(line)


def captured_int8_check(model: Any, rows: int, note: Callable[[str], None]) -> None:
    """Say in one line (``note``) when the captured step's int8 products measure no faster than its float32 ones on
    this CPU (txl's kernels: :func:`transformer_xl.model.native.int8_speedup`; inductor's forms, chosen on AVX-512
    CPUs, were measured faster in int8: ``docs/generation-speed.md``)."""
    from transformer_xl.model import native

    if native.products(next(model.parameters()).device) != "native":
        return
    speedup = native.int8_speedup(model.config.d_model, rows)
    if speedup < 1:
        note(f"int8 weights measured {speedup:.2f}x the speed of float32 in the captured step's products on this "
             f"CPU ({rows} rows): --quantize int8 saves memory here, not time")


def add_quantize(parser: argparse.ArgumentParser) -> None:
    """``--quantize int8`` (``args.quantize``): int8 weights for CPU inference (``TransformerXLLM.quantize``)."""
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="int8: quantize the linear layers and the output softmax to int8 weights after loading "
                        "(CPU only; about 2x faster generation at batch 1, measured cost on a trained model's "
                        "perplexity in docs/generation-speed.md) (default: float weights)")


def add_segment_lengths(parser: argparse.ArgumentParser) -> None:
    """``--tgt-len``, ``--clamp-len`` and ``--same-length`` of a command that reads text with memory (``txl eval``,
    ``txl score``; each defaults to the model's setting)."""
    parser.add_argument("--tgt-len", type=positive_int, help="evaluation segment length (default: the model's)")
    parser.add_argument("--clamp-len", type=clamp_int, help="clamp relative distances at this length (<= 0: off)")
    parser.add_argument("--same-length", action=argparse.BooleanOptionalAction, default=None,
                        help="every query attends to the same number of keys (default: the model's setting)")


def add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress/--no-progress`` (``args.progress``, default on; map it with
    :func:`transformer_xl.data.progress.progress_mode`)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="a progress bar on stderr when it is a terminal (--no-progress, or no terminal: plain "
                        "periodic lines)")


def fraction(text: str) -> float:
    """An argparse ``type`` for ``--valid-fraction`` / ``--test-fraction``: a number in (0, 0.5)."""
    value = finite_float(text)
    if not 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 0.5), got {text!r}")
    return value


def add_split_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--valid-fraction`` / ``--test-fraction``: how your own text without train/valid/test files is cut."""
    for split in ("valid", "test"):
        parser.add_argument(f"--{split}-fraction", type=fraction, default=None, metavar="F",
                            help=f"user text without given splits: the {split} part, cut at a line end (0 < F "
                            "< 0.5; default: 0.05)")


def stderr_note(prefix: str) -> Callable[[str], None]:
    """A function printing ``PREFIX: message`` as one line on stderr (e.g. which model of a run directory a
    command uses: ``txl generate: using runs/x/best (the best validation model, step 1200)``)."""

    def note(message: str) -> None:
        print(f"{prefix}: {message}", file=sys.stderr, flush=True)

    return note


# ---------------------------------------------------------------------------------------------- threads
#: Commands that compute with torch: they take ``--threads`` (``txl data`` and ``txl plot`` do not).
THREADED_COMMANDS = ("train", "eval", "score", "generate", "convert", "export", "recl", "experiment", "bench",
                     "serve")
THREADS_HELP = ("CPU threads for torch (default: $TXL_NUM_THREADS, else $OMP_NUM_THREADS, else the cores "
                "available to this process)")


def add_threads(parser: argparse.ArgumentParser, *, default: Any = argparse.SUPPRESS) -> None:
    """``--threads N`` on ``parser`` and on every subcommand below it.

    Below the top level the default is ``SUPPRESS``: a subcommand given no ``--threads`` keeps the value given
    before it (``txl --threads 1 train`` and ``txl train --threads 1`` are the same)."""
    parser.add_argument("--threads", type=positive_int, default=default, metavar="N", help=THREADS_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                add_threads(child)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(flag: int | None, environ: Mapping[str, str] | None = None) -> int | None:
    """The number of torch threads: ``--threads`` > ``TXL_NUM_THREADS`` > (``OMP_NUM_THREADS`` set: None, torch
    keeps what OpenMP read from it, e.g. the 1 ``torchrun`` sets for each worker) > the available cores."""
    environ = os.environ if environ is None else environ
    if flag is not None:
        return flag
    text = environ.get("TXL_NUM_THREADS", "").strip()
    if text:
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"TXL_NUM_THREADS: {exc}") from None
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    return available_cores()


def apply_threads(n: int | None) -> int:
    """``torch.set_num_threads(n)`` (and the inter-op pool, while it has not started); None keeps torch's own
    count. Returns the intra-op thread count torch now uses."""
    import torch

    if n is not None:
        torch.set_num_threads(n)
        with contextlib.suppress(RuntimeError):  # only possible before the first inter-op parallel work
            torch.set_num_interop_threads(n)
    return torch.get_num_threads()
