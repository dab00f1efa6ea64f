"""The released models' ``data/``: ``cache.pkl`` read without running code, ``corpus-info.json`` checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interop.tf_files import hostile_pkl, py2_cache_pkl
from transformer_xl.errors import CheckpointError
from transformer_xl.interop.tf_vocab import read_corpus_info, read_corpus_vocab


def test_a_python2_corpus_pickle_gives_its_vocabulary_in_id_order(tmp_path: Path) -> None:
    symbols = ["<eos>", "the", ",", "café", "<unk>", "@-@"]
    path = tmp_path / "cache.pkl"
    path.write_bytes(py2_cache_pkl(symbols))
    vocab, dataset = read_corpus_vocab(path)
    assert vocab.idx2sym == symbols and dataset == "wt103"
    assert vocab.eos == "<eos>" and vocab.unk == "<unk>"


def test_a_hostile_cache_pkl_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "cache.pkl"
    path.write_bytes(hostile_pkl(marker))
    with pytest.raises(CheckpointError, match=r"refers to os\.system"):
        read_corpus_vocab(path)
    assert not marker.exists()


@pytest.mark.parametrize("blob", [b"", b"\x80\x02]q\x00.", b"not a pickle at all", b"\x80\x02cnumpy\ndtype\n"])
def test_what_is_not_a_corpus_is_one_line(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "cache.pkl"
    path.write_bytes(blob)
    with pytest.raises(CheckpointError) as info:
        read_corpus_vocab(path)
    assert "\n" not in str(info.value)


def test_a_truncated_corpus_pickle_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cache.pkl"
    path.write_bytes(py2_cache_pkl(["<eos>", "a", "b"])[:-40])
    with pytest.raises(CheckpointError, match="not a readable pickle"):
        read_corpus_vocab(path)


def test_corpus_info_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "corpus-info.json"
    path.write_text(json.dumps({"vocab_size": 267735, "cutoffs": [0, 20000, 40000, 200000, 267735],
                                "dataset": "wt103"}))
    assert read_corpus_info(path) == {"vocab_size": 267735, "cutoffs": [20000, 40000, 200000], "dataset": "wt103"}
    for bad in ({"vocab_size": "many"}, {"vocab_size": 5, "cutoffs": "x"}, [1, 2]):
        path.write_text(json.dumps(bad))
        with pytest.raises(CheckpointError):
            read_corpus_info(path)
