"""Parsing the values of command-line options that the library takes as lists, and options several
commands share."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from txl.errors import ConfigError


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
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise ConfigError(f"{name} must be a comma-separated list of numbers, got {text!r}") from None


def add_no_verify(parser: argparse.ArgumentParser) -> None:
    """``--no-verify`` (``args.no_verify``): read weights without checking them against their ``MANIFEST.json``."""
    parser.add_argument("--no-verify", action="store_true",
                        help="load weights whose files do not match their MANIFEST.json SHA-256 (changed on "
                        "purpose); NaN/inf weights and a config that does not fit them are still refused")
