"""The exception hierarchy, ``did_you_mean`` suggestions and ``check_int`` validation (``transformer_xl.errors``)."""

from __future__ import annotations

import pytest

import transformer_xl
from transformer_xl.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    TXLError,
    check_int,
    did_you_mean,
    one_line,
)


def test_hierarchy() -> None:
    for cls in (ConfigError, CheckpointError, DataError):
        assert issubclass(cls, TXLError) and issubclass(cls, Exception)
    assert issubclass(ConfigError, ValueError)  # argument/config code that catches ValueError still works
    assert not issubclass(TXLError, ValueError)
    assert not issubclass(ConfigError, DataError | CheckpointError) and not issubclass(DataError, ConfigError)
    assert not issubclass(DataError, CheckpointError) and not issubclass(CheckpointError, DataError)
    with pytest.raises(TXLError):
        raise DataError("x")
    with pytest.raises(ValueError, match="bad"):
        raise ConfigError("bad")


def test_errors_are_exported_from_the_package() -> None:
    exported = (transformer_xl.TXLError, transformer_xl.ConfigError, transformer_xl.CheckpointError,
                transformer_xl.DataError)
    assert exported == (TXLError, ConfigError, CheckpointError, DataError)


def test_did_you_mean() -> None:
    known = ["train", "eval", "generate", "convert"]
    assert did_you_mean("trian", known) == " (did you mean 'train'?)"
    assert did_you_mean("generat", iter(known)) == " (did you mean 'generate'?)"  # any iterable
    assert did_you_mean("zzzzzz", known) == ""
    assert did_you_mean("train", []) == ""
    assert did_you_mean(12, ["12a", "x"]) == " (did you mean '12a'?)"  # a non-string name is compared as text


@pytest.mark.parametrize(("value", "minimum"), [(1, 1), (7, 1), (0, 0), (-3, -3), (10**12, 5)])
def test_check_int_accepts_integers_at_or_above_the_minimum(value: int, minimum: int) -> None:
    assert check_int("n", value, minimum) == value


@pytest.mark.parametrize(
    ("value", "minimum", "message"),
    [
        (0, 1, "batch_size must be a positive integer, got 0"),
        (-1, 1, "batch_size must be a positive integer, got -1"),
        (True, 1, "batch_size must be a positive integer, got True"),  # bools are not integers here
        (False, 0, "batch_size must be an integer >= 0, got False"),
        (2.0, 1, "batch_size must be a positive integer, got 2.0"),
        ("3", 1, "batch_size must be a positive integer, got '3'"),
        (None, 0, "batch_size must be an integer >= 0, got None"),
        (1, 2, "batch_size must be an integer >= 2, got 1"),
        (-2, -1, "batch_size must be an integer >= -1, got -2"),
    ],
)
def test_check_int_refuses_with_a_one_line_config_error(value: object, minimum: int, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        check_int("batch_size", value, minimum)
    assert str(exc.value) == message


def test_one_line_quotes_the_first_line_of_an_error() -> None:
    assert one_line(ValueError("\n  bad header\nmore detail\n")) == "bad header"
    assert one_line(IndexError()) == "IndexError"
    assert one_line(KeyError("x" * 500), limit=20) == "'" + "x" * 16 + "..."
