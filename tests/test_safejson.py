"""JSON of the user's read with one-line errors whatever it holds: nesting deeper than the parser recurses, numbers of
more digits than Python converts, and values quoted short in messages."""

from __future__ import annotations

import pytest

from transformer_xl.errors import CheckpointError, ConfigError, DataError
from transformer_xl.safejson import nested_too_deeply, parse_object, read_object, short_repr


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": ' + "[" * 100_000, '{"a": ' + "{\"b\": " * 50_000])
def test_nesting_too_deep_for_the_parser_is_one_line(tmp_path, text) -> None:
    with pytest.raises(ConfigError, match=r"^config is not a usable JSON object: it is nested too deeply") as info:
        parse_object(text, "config")
    assert "\n" not in str(info.value)
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(CheckpointError, match=rf"^model config {tmp_path / 'c.json'} is not a usable JSON object"):
        read_object(tmp_path / "c.json", "model config", CheckpointError)
    with pytest.raises(DataError, match=rf"^{tmp_path / 'c.json'} is not a usable JSON object"):
        read_object(tmp_path / "c.json", error=DataError)


def test_a_number_of_too_many_digits_is_one_line(tmp_path) -> None:
    text = '{"n_token": ' + "7" * 5000 + "}"
    with pytest.raises(ConfigError, match=r"^config is not valid JSON: Exceeds the limit \(4300 digits\)"):
        parse_object(text, "config")
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'c.json'} is not valid JSON: Exceeds the limit"):
        read_object(tmp_path / "c.json")


def test_the_store_readers_errors_pass_unchanged(tmp_path) -> None:
    """What :func:`transformer_xl.store.files.read_json` already refuses in one line keeps its words."""
    assert parse_object('{"a": [1, {"b": 2}]}', "config") == {"a": [1, {"b": 2}]}
    with pytest.raises(ConfigError, match=r"^config is not valid JSON: Expecting property name"):
        parse_object("{1", "config")
    with pytest.raises(ConfigError, match=r"^config JSON must be an object$"):
        parse_object("[1]", "config")
    with pytest.raises(ConfigError, match=r"^config file not found: "):
        read_object(tmp_path / "missing.json", "config file")
    assert str(nested_too_deeply("x", DataError)).startswith("x is not a usable JSON object")


def test_short_repr_quotes_few_levels_items_and_characters() -> None:
    deep: list = []
    for _ in range(900):
        deep = [deep]
    assert short_repr(deep) == "[[[[...]]]]"
    assert len(short_repr(list(range(10**6)))) < 60 and len(short_repr("x" * 10**6)) <= 60
    assert short_repr("normal") == "'normal'" and short_repr(7) == "7"
