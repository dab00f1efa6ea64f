"""Command-line list values."""

from __future__ import annotations

import argparse

import pytest

from transformer_xl.cli.args import parse_int_list
from transformer_xl.errors import ConfigError


def test_parse_int_list() -> None:
    assert parse_int_list("0, 128,512") == [0, 128, 512]
    for bad in ("1,x", "", "-1"):
        with pytest.raises(ConfigError):
            parse_int_list(bad, "--mem-len")


def test_add_no_verify() -> None:
    import argparse

    from transformer_xl.cli.args import add_no_verify

    p = argparse.ArgumentParser()
    add_no_verify(p)
    assert p.parse_args([]).no_verify is False and p.parse_args(["--no-verify"]).no_verify is True


def test_stderr_note_is_one_line_on_stderr(capsys) -> None:
    from transformer_xl.cli.args import stderr_note

    stderr_note("txl generate")("using runs/x/best (the best validation model)")
    assert capsys.readouterr() == ("", "txl generate: using runs/x/best (the best validation model)\n")


def test_argparse_types_refuse_impossible_numbers() -> None:
    import argparse

    from transformer_xl.cli.args import (
        clamp_int,
        finite_float,
        nonneg_float,
        nonneg_int,
        positive_float,
        positive_int,
        seed_int,
    )

    assert positive_int("3") == 3 and nonneg_int("0") == 0 and clamp_int("-1") == -1
    assert seed_int("4294967295") == 2**32 - 1 and seed_int("0") == 0
    assert finite_float("-2.5") == -2.5 and nonneg_float("0") == 0.0 and positive_float("1e-3") == 1e-3
    for parse, bad in [(positive_int, "0"), (positive_int, "1.5"), (nonneg_int, "-1"), (clamp_int, "-2"),
                       (seed_int, "-1"), (seed_int, str(2**32)), (seed_int, "1e20"), (finite_float, "nan"),
                       (finite_float, "inf"), (finite_float, "x"), (nonneg_float, "-0.1"), (positive_float, "0"),
                       (positive_float, "-inf")]:
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad).replace(".", r"\.")):
            parse(bad)


def test_parse_float_list_refuses_non_finite_values() -> None:
    from transformer_xl.cli.args import parse_float_list

    assert parse_float_list("0.1,1", "--r") == [0.1, 1.0]
    with pytest.raises(ConfigError, match="--r must hold finite numbers"):
        parse_float_list("0.1,nan", "--r")


def test_resolve_threads_precedence_flag_env_omp_cores() -> None:
    from transformer_xl.cli.args import available_cores, resolve_threads

    assert resolve_threads(3, {"TXL_NUM_THREADS": "2", "OMP_NUM_THREADS": "4"}) == 3
    assert resolve_threads(None, {"TXL_NUM_THREADS": " 2 ", "OMP_NUM_THREADS": "4"}) == 2
    assert resolve_threads(None, {"OMP_NUM_THREADS": "4"}) is None  # torch keeps what OpenMP read
    assert resolve_threads(None, {"TXL_NUM_THREADS": ""}) == available_cores() >= 1
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="TXL_NUM_THREADS: expected"):
            resolve_threads(None, {"TXL_NUM_THREADS": bad})


def test_add_threads_reaches_nested_subcommands_and_keeps_an_earlier_value() -> None:
    from transformer_xl.cli.args import add_threads

    top = argparse.ArgumentParser()
    top.add_argument("--threads", type=int, default=None)
    sub = top.add_subparsers(dest="cmd")
    exp = sub.add_parser("exp")
    exp.add_subparsers(dest="kind").add_parser("recl")
    add_threads(exp)
    assert top.parse_args(["--threads", "3", "exp", "recl"]).threads == 3
    assert top.parse_args(["exp", "recl", "--threads", "2"]).threads == 2
    assert top.parse_args(["exp", "--threads", "2", "recl"]).threads == 2
    assert top.parse_args(["exp", "recl"]).threads is None
    with pytest.raises(SystemExit):
        top.parse_args(["exp", "recl", "--threads", "0"])


@pytest.mark.parametrize("text, ok", [("0.1", True), ("0.49", True), ("0", False), ("0.5", False), ("nan", False),
                                      ("x", False)])
def test_fraction(text: str, ok: bool) -> None:
    import argparse

    from transformer_xl.cli.args import fraction

    if ok:
        assert fraction(text) == float(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            fraction(text)
