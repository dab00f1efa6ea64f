"""txl data fetch / prepare / info."""

from __future__ import annotations

from pathlib import Path

import pytest

from txl.errors import DataError


def test_cli_data_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from txl.cli import data as cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    corpus = tmp_path / "mine.txt"
    corpus.write_text("one two three\n" * 40)
    args = parser.parse_args(["data", "prepare", str(corpus), "--cache-dir", str(tmp_path / "c"), "--level", "char"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "text-mine: vocabulary" in out and "metric bpc" in out
    args = parser.parse_args(["data", "info", "nope"])
    with pytest.raises(DataError, match="known: enwik8"):
        args.func(args)
