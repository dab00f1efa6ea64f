"""JSON files of the user's (a model's ``config.json``, a run's config) read with a one-line error whatever they hold.

:func:`transformer_xl.store.files.read_json` turns a missing, unreadable or malformed file into a one-line error,
but Python's ``json`` parser recurses once per nesting level: a file of 100,000 ``[`` (or any structure nested
deeper than the interpreter's recursion limit) raises :class:`RecursionError`, which is no :class:`TXLError` and
would end a command with a traceback. :func:`read_object` and :func:`parse_object` give it the same one-line
treatment, as for a number of more digits than Python converts to an integer (a :class:`ValueError`, not a
:class:`json.JSONDecodeError`). :func:`short_repr` quotes a value the user wrote in an error message without
quoting all of it (a value nested hundreds of levels deep, or a megabyte long, stays one short line).
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, TXLError, one_line
from transformer_xl.store.files import parse_json_object, read_json

__all__ = ["nested_too_deeply", "parse_object", "read_object", "short_repr"]

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 3, 8, 8, 60, 60


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a few levels, items and characters (``[[[...]]]``, ``'aaaa...aaaa'``)."""
    return _SHORT.repr(value)


def nested_too_deeply(what: str, error: type[TXLError] = ConfigError) -> TXLError:
    """The one-line ``error`` for JSON (``what``: the file or text) nested deeper than the parser can follow."""
    return error(f"{what} is not a usable JSON object: it is nested too deeply to be read (thousands of levels of "
                 "[ or {); a txl file holds a flat object")


def _guarded(read: Callable[[], dict[str, Any]], label: str, error: type[TXLError]) -> dict[str, Any]:
    try:
        return read()
    except TXLError:  # already one line (a ConfigError is a ValueError too)
        raise
    except RecursionError:
        raise nested_too_deeply(label, error) from None
    except ValueError as exc:  # not a JSONDecodeError: a number of more digits than Python converts
        raise error(f"{label} is not valid JSON: {one_line(exc)}") from None


def parse_object(text: str, what: str, error: type[TXLError] = ConfigError) -> dict[str, Any]:
    """:func:`transformer_xl.store.files.parse_json_object` (the JSON object in ``text``, else a one-line ``error``
    about ``what``), nesting too deep for the parser included."""
    return _guarded(lambda: parse_json_object(text, what, error), what, error)


def read_object(path: str | Path, what: str | None = None, error: type[TXLError] = ConfigError) -> dict[str, Any]:
    """:func:`transformer_xl.store.files.read_json` (the JSON object in ``path``, else a one-line ``error``), nesting
    too deep for the parser included."""
    return _guarded(lambda: read_json(path, what, error), f"{what} {path}" if what else str(path), error)
