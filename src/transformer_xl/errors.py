"""Exceptions a user can act on. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to ``name``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an integer (not a bool) ``>= minimum``, else a one-line :class:`ConfigError`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{name} must be {kind}, got {value!r}")
    return value


def one_line(exc: BaseException, limit: int = 200) -> str:
    """The first non-empty line of ``str(exc)`` (at most ``limit`` characters), or the exception's type name: for
    quoting a library's error inside a one-line :class:`TXLError`."""
    line = next((part.strip() for part in str(exc).splitlines() if part.strip()), type(exc).__name__)
    return line if len(line) <= limit else line[:limit - 3] + "..."


def install_hint(extra: str) -> str:
    """How to add the optional dependencies of ``extra``: txl is installed from its checkout or a wheel built from it
    (the distribution is not on the package index)."""
    return (f"pip install -e '.[{extra}]' in the txl checkout (or its wheel with the extra: "
            f"'transformer_xl-VERSION-py3-none-any.whl[{extra}]')")


class TXLError(Exception):
    """Base class of every error caused by user input (files, configs, arguments)."""


class ConfigError(TXLError, ValueError):
    """An impossible or unknown configuration value."""


class CheckpointError(TXLError):
    """A missing, corrupt or incompatible weights/checkpoint file."""


class DataError(TXLError):
    """A missing, corrupt or malformed dataset file, or a bad data argument."""
