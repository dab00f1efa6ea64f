"""The single package version: a PEP 440 string, the installed metadata and ``txl --version``
(``transformer_xl.version``)."""

from __future__ import annotations

import importlib.metadata

import pytest
from packaging.version import Version

import transformer_xl
from transformer_xl.cli import main
from transformer_xl.version import __version__


def test_version_is_a_normalized_pep440_string() -> None:
    assert isinstance(__version__, str) and __version__ == __version__.strip()
    assert str(Version(__version__)) == __version__  # parses, and is already in normal form
    assert transformer_xl.__version__ == __version__


def test_installed_metadata_reads_the_same_version() -> None:
    assert importlib.metadata.version("transformer-xl") == __version__


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"txl {__version__}\n"
