"""txl data fetch / prepare / info."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from transformer_xl.errors import DataError


def test_cli_data_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from transformer_xl.cli import data as cli

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


@pytest.mark.parametrize("argv, message", [
    (["--max-size=-1"], "argument --max-size: expected a positive integer, got '-1'"),
    (["--min-freq=-1"], "argument --min-freq: expected an integer >= 0, got '-1'"),
])
def test_impossible_numbers_are_one_line(tmp_path, capsys, argv: list[str], message: str) -> None:
    from tests.helpers import one_line_error
    from transformer_xl.cli import main

    assert main(["data", "prepare", str(tmp_path), *argv]) == 2
    assert message in one_line_error(capsys, "txl data prepare: error: ")


def test_user_text_options_on_a_known_dataset_are_refused(capsys) -> None:
    from tests.helpers import one_line_error
    from transformer_xl.cli import main

    assert main(["data", "info", "wt2", "--level", "byte"]) == 2
    assert "--level applies to your own text only; wt2 is a known dataset" in one_line_error(capsys)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "manifest.json").write_bytes(b"\xff\xfe"), "is unreadable ('utf-8' codec can't decode"),
    (lambda d: (d / "manifest.json").write_text("[1, 2]"), "is not a JSON object"),
    (lambda d: (d / "manifest.json").write_text('{"splits": "train.npy"}'), "has the wrong structure"),
    (lambda d: (d / "manifest.json").write_text('{"splits": {"train": {"file": "../x", "length": 1, '
                                                '"dtype": "uint8"}}}'), "names '../x', not a plain file name"),
    (lambda d: (d / "train.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '<u1', 'shape': (" + b" " * 110),
     "train.npy: unreadable cache array (its .npy header cannot be parsed)"),
    (lambda d: np.save(d / "train.npy", np.full(450, 200, dtype="uint8")),  # the length of its manifest
     "holds token id 200, but the vocabulary has"),
])
def test_a_damaged_cache_is_one_line(tmp_path, monkeypatch, capsys, damage, message: str) -> None:
    from tests.helpers import corpus_dir, one_line_error
    from transformer_xl.cli import main

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    corpus = corpus_dir(tmp_path)
    assert main(["data", "prepare", str(corpus)]) == 0
    damage(next((tmp_path / "cache").iterdir()))
    capsys.readouterr()
    assert main(["data", "prepare", str(corpus)]) == 2  # `info` lists the caches; `prepare` (or info --prepare) reads
    assert message in one_line_error(capsys, "txl data: error: ")
    assert main(["data", "info", str(corpus), "--rebuild"]) == 0


def test_info_lists_the_caches_and_prepare_builds(tmp_path, monkeypatch, capsys) -> None:
    from tests.helpers import corpus_dir
    from transformer_xl.cli import main

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    corpus = corpus_dir(tmp_path)
    assert main(["data", "info", str(corpus)]) == 0
    assert "no prepared cache" in capsys.readouterr().out and not (tmp_path / "cache").exists()
    assert main(["data", "info", str(corpus), "--level", "char", "--prepare"]) == 0
    assert "metric bpc" in capsys.readouterr().out
    assert main(["data", "prepare", str(corpus)]) == 0
    capsys.readouterr()
    assert main(["data", "info", str(corpus)]) == 0
    out = capsys.readouterr().out
    assert out.count("cache ") == 2 and "char: vocabulary" in out and "word: vocabulary" in out
    assert main(["data", "info", str(corpus), "--level", "char"]) == 0
    assert capsys.readouterr().out.count("cache ") == 1
    assert main(["data", "prepare", str(corpus), "--valid-fraction", "0.5"]) == 2
    assert "expected a fraction in (0, 0.5), got '0.5'" in capsys.readouterr().err


def test_generate_long_range_writes_text_and_spans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformer_xl.cli import main
    from transformer_xl.data.long_range import read_spans

    argv = ["data", "generate", "long-range", str(tmp_path / "a"), "--distances", "12,30", "--span-lens", "4",
            "--alphabet", "wxyz", "--tokens", "3000,800,800", "--seed", "3"]
    assert main(argv) == 0
    assert "copied spans" in capsys.readouterr().out
    spec, spans = read_spans(tmp_path / "a")
    assert spec.distances == (12, 30) and spec.alphabet == "wxyz" and spec.seed == 3
    text = (tmp_path / "a" / "valid.txt").read_text()
    assert len(text) == 801 and set(text[:-1]) <= set("wxyz")
    for start, length, d in spans["valid"]:
        assert text[start : start + length] == text[start - d : start - d + length]
    assert main([*argv[:3], str(tmp_path / "b"), *argv[4:]]) == 0
    assert (tmp_path / "b" / "train.txt").read_text() == (tmp_path / "a" / "train.txt").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "10,10"], "--tokens takes three sizes"),
    (["--distances", "4", "--span-lens", "8"], "longer than a distance"),
    (["--alphabet", "a"], "alphabet"),
])
def test_generate_refuses_bad_parameters_in_one_line(tmp_path, capsys, argv: list[str], message: str) -> None:
    from transformer_xl.cli import main

    assert main(["data", "generate", "long-range", str(tmp_path / "x"), *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not (tmp_path / "x").exists()


def test_generate_writes_over_nothing_of_the_users(tmp_path, capsys) -> None:
    """OUT holding the user's text (a train.txt the generator would overwrite) is refused in one line naming
    --force, every file kept; an earlier long-range corpus is written again in place; --force moves the user's
    folder aside to OUT.old-1, whole."""
    from transformer_xl.cli import main

    small = ["--tokens", "300,80,80", "--distances", "12", "--span-lens", "4"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.txt").write_text("my own text\n")
    assert main(["data", "generate", "long-range", str(mine), *small]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"txl data: error: {mine} holds what txl data generate did not "
                                                   "write (train.txt): refusing to write there; ") and "--force" in err
    assert [p.name for p in mine.iterdir()] == ["train.txt"] and (mine / "train.txt").read_text() == "my own text\n"
    assert main(["data", "generate", "long-range", str(tmp_path / "corpus"), *small]) == 0
    assert main(["data", "generate", "long-range", str(tmp_path / "corpus"), *small, "--seed", "1"]) == 0  # its own
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["long-range.json", "test.txt", "train.txt",
                                                                        "valid.txt"]
    capsys.readouterr()
    assert main(["data", "generate", "long-range", str(mine), *small, "--force"]) == 0
    assert f"txl data: moved the old {mine} aside to {tmp_path / 'mine.old-1'} (--force)" in capsys.readouterr().err
    assert (tmp_path / "mine.old-1" / "train.txt").read_text() == "my own text\n"
    assert sorted(p.name for p in mine.iterdir()) == ["long-range.json", "test.txt", "train.txt", "valid.txt"]
