"""Command-line list values."""

from __future__ import annotations

import pytest

from txl.cli.args import parse_int_list
from txl.errors import ConfigError


def test_parse_int_list() -> None:
    assert parse_int_list("0, 128,512") == [0, 128, 512]
    for bad in ("1,x", "", "-1"):
        with pytest.raises(ConfigError):
            parse_int_list(bad, "--mem-len")


def test_add_no_verify() -> None:
    import argparse

    from txl.cli.args import add_no_verify

    p = argparse.ArgumentParser()
    add_no_verify(p)
    assert p.parse_args([]).no_verify is False and p.parse_args(["--no-verify"]).no_verify is True
