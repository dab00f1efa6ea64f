"""The ``txl`` command line: thin subcommands, one-line errors with non-zero exit."""

from __future__ import annotations

from txl.cli import main


def test_errors_are_one_line_with_exit_2(tmp_path, capsys) -> None:
    assert main(["convert", str(tmp_path / "missing"), "--from", "hf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txl convert: error:") and "\n" not in err
    assert main(["convert", str(tmp_path / "s.pt"), "--from", "official", "--out", str(tmp_path / "x")]) == 2
    assert "--config" in capsys.readouterr().err
