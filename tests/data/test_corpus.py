"""Real PTB / WikiText-2 preparation: published counts, official vocabulary order, cache behaviour."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import SHARED_DATA as SHARED
from tests.helpers import needs_shared_data as needs_shared
from transformer_xl.data import load_corpus
from transformer_xl.errors import DataError


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def official_reference(paths: list[Path], lower: bool) -> tuple[list[str], list[list[str]]]:
    """The official Vocab rule, written the slow way: special first, Counter.most_common order."""
    counter: Counter[str] = Counter()
    per_file = []
    for p in paths:
        toks: list[str] = []
        with gzip.open(p, "rt", encoding="utf-8") as f:
            for line in f:
                line = line.strip().lower() if lower else line.strip()
                counter.update(line.split())
                toks.extend([*line.split(), "<eos>"])
        per_file.append(toks)
    symbols = ["<eos>"] + [s for s, _ in counter.most_common() if s != "<eos>"]
    return symbols, per_file


@needs_shared
def test_ptb_published_counts_and_official_vocab(cache: Path) -> None:
    c = load_corpus("ptb", SHARED, cache_dir=cache)
    assert {k: v.shape[0] for k, v in c.splits.items()} == {"train": 929_589, "valid": 73_760, "test": 82_430}
    assert len(c.vocab) == 10_000
    assert c.splits["train"].dtype == np.uint16 and isinstance(c.splits["train"], np.memmap)
    assert not c.char_level and c.metric == "ppl"
    paths = [SHARED / "ptb" / f"ptb.{s}.txt.gz" for s in ("train", "valid", "test")]
    symbols, per_file = official_reference(paths, lower=True)
    assert c.vocab.idx2sym == symbols
    assert c.vocab.eos_idx == 0 and c.vocab.unk_idx == symbols.index("<unk>")
    for split, toks in zip(("train", "valid", "test"), per_file):
        assert c.vocab.decode(c.splits[split]) == toks


@needs_shared
def test_wt2_published_counts_and_official_vocab(cache: Path) -> None:
    c = load_corpus("wt2", SHARED, cache_dir=cache)
    assert {k: v.shape[0] for k, v in c.splits.items()} == {
        "train": 2_088_628,
        "valid": 217_646,
        "test": 245_569,
    }
    assert len(c.vocab) == 33_278
    paths = [SHARED / "wikitext-2" / f"wiki.{s}.tokens.gz" for s in ("train", "valid", "test")]
    symbols, per_file = official_reference(paths, lower=False)
    assert c.vocab.idx2sym == symbols
    np.testing.assert_array_equal(c.splits["valid"], c.vocab.encode(per_file[1]))


@needs_shared
def test_wt2_char_rule(cache: Path) -> None:
    c = load_corpus("wt2-char", SHARED, cache_dir=cache)
    assert c.char_level and c.metric == "bpc" and c.vocab.idx2sym[0] == "<eos>"
    with gzip.open(SHARED / "wikitext-2" / "wiki.valid.tokens.gz", "rt", encoding="utf-8") as f:
        expected = [sym for line in f for sym in [*line.strip(), "<eos>"]]
    assert c.vocab.decode(c.splits["valid"]) == expected
    with gzip.open(SHARED / "wikitext-2" / "wiki.train.tokens.gz", "rt", encoding="utf-8") as f:
        text = f.read()
    n_lines = text.count("\n")
    assert c.splits["train"].shape[0] == sum(len(ln.strip()) for ln in text.split("\n")[:-1]) + n_lines


def test_missing_file_names_file_url_and_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_corpus("ptb", tmp_path, cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path / "ptb" / "ptb.train.txt") in msg
    assert "simple-examples.tgz" in msg and "txl data fetch ptb" in msg
    with pytest.raises(DataError, match=r"enwik8\.zip.*http://mattmahoney\.net/dc/enwik8\.zip"):
        load_corpus("enwik8", tmp_path, cache_dir=tmp_path / "c")




def test_a_given_vocabulary_encodes_the_embedded_wt2(tmp_path: Path) -> None:
    """``vocab=``: the text is encoded with the given vocabulary (unknown words -> ``<unk>``, counted), cached
    apart from the dataset's own preparation (the key holds the vocabulary's SHA-256)."""
    from transformer_xl.data import Vocab

    own = load_corpus("wt2", tmp_path / "none", cache_dir=tmp_path / "c")
    kept = own.vocab.idx2sym[:2000]
    small = Vocab(kept, special=own.vocab.special, eos=own.vocab.eos, unk=own.vocab.unk)
    given = load_corpus("wt2", tmp_path / "none", cache_dir=tmp_path / "c", vocab=small)
    assert given.vocab.sha256() == small.sha256() and given.cache_dir != own.cache_dir
    for split, ids in own.splits.items():
        expect = np.where(ids < 2000, ids, small.unk_idx)
        assert np.array_equal(given.splits[split], expect), split
        unknown = int((ids >= 2000).sum())  # own ids >= 2000 are words the small vocabulary lacks
        assert given.unknown_tokens(split) == unknown > 0
    assert own.unknown_tokens("train") is None
    again = load_corpus("wt2", tmp_path / "none", cache_dir=tmp_path / "c", vocab=small)
    assert again.cache_dir == given.cache_dir and again.unknown_tokens("valid") == given.unknown_tokens("valid")


def test_a_given_vocabulary_must_fit_the_level(tmp_path: Path) -> None:
    from transformer_xl.data import Vocab

    words = Vocab(["<eos>", "<unk>", "the", "cat"], eos="<eos>", unk="<unk>")
    chars = Vocab(["<eos>", "<unk>", "a", "b", " "], eos="<eos>", unk="<unk>")
    with pytest.raises(DataError, match="'ptb-char' is char-level text but the vocabulary is word-level"):
        load_corpus("ptb-char", tmp_path / "nothing", vocab=words)  # refused before looking for the files
    with pytest.raises(DataError, match="'wt2' is word-level text but the vocabulary is char-level"):
        load_corpus("wt2", tmp_path / "nothing", vocab=chars)
    with pytest.raises(DataError, match="is enwik8-level text"):
        load_corpus("enwik8", tmp_path / "nothing", vocab=words)
    (tmp_path / "t.txt").write_text("the cat sat\nab ba\n" * 50)
    user = load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c", level="char", vocab=chars)
    unk = int((user.splits["train"] == chars.unk_idx).sum())  # the text holds no literal <unk>
    assert user.unknown_tokens("train") == unk > 0 and user.char_level
    flat = load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c", vocab=words)
    n = len(flat.splits["train"]) + len(flat.splits["valid"]) + len(flat.splits["test"])
    assert n == 50 * 7 and set(flat.vocab.decode(flat.splits["train"])) <= {"the", "cat", "<eos>", "<unk>"}
    with pytest.raises(DataError, match="not in the vocabulary, which has no unknown symbol"):
        load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c", vocab=Vocab(["<eos>", "the"], eos="<eos>"))


def test_given_split_folders_are_used_as_given(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    for split, texts in (("train", ["a b\n", "b c\n"]), ("valid", ["c d\n"]), ("test", ["a a\n"])):
        (d / split).mkdir(parents=True)
        for i, text in enumerate(texts):
            (d / split / f"part{i}.txt").write_text(text)
    c = load_corpus(str(d), cache_dir=tmp_path / "c")
    assert c.vocab.decode(c.splits["train"]) == ["a", "b", "<eos>", "b", "c", "<eos>"]
    assert c.vocab.decode(c.splits["valid"]) == ["c", "<unk>", "<eos>"]  # "d" is not in train: unknown
    byte = load_corpus(str(d), cache_dir=tmp_path / "c", level="byte")
    assert bytes(byte.splits["test"].tolist()) == b"a a\n"


def test_some_split_files_without_the_others_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "train.txt").write_text("a b\n" * 50)
    (d / "test.txt").write_text("a b\n")
    with pytest.raises(DataError, match="has train, test but not all of train, valid and test"):
        load_corpus(str(d), cache_dir=tmp_path / "c")


@pytest.mark.parametrize("fraction", [0, 0.5, -0.1, "0.1", True])
def test_fractions_outside_the_open_interval_are_refused(tmp_path: Path, fraction) -> None:
    (tmp_path / "t.txt").write_text("a b\n" * 100)
    with pytest.raises(DataError, match=r"valid_fraction must be a number in \(0, 0.5\)"):
        load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c", valid_fraction=fraction)


def test_fractions_cut_whole_lines(tmp_path: Path) -> None:
    lines = [f"line {i} " + "x " * (i % 7) + "\n" for i in range(200)]
    (tmp_path / "t.txt").write_text("".join(lines))
    c = load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c", valid_fraction=0.1, test_fraction=0.2)
    text = {k: " ".join(c.vocab.decode(v)).split(" <eos>") for k, v in c.splits.items()}
    assert text["valid"][0].startswith("line ") and text["test"][0].startswith("line ")
    n = sum(v.size for v in c.splits.values())
    assert abs(c.splits["test"].size - 0.2 * n) < 10 and abs(c.splits["valid"].size - 0.1 * n) < 10


def test_prepared_caches_lists_without_building(tmp_path: Path) -> None:
    from transformer_xl.data.corpus import prepared_caches

    (tmp_path / "t.txt").write_text("a b\n" * 100)
    assert prepared_caches(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c") == []
    assert not (tmp_path / "c").exists()
    load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c", level="char")
    load_corpus(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c")
    listed = prepared_caches(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c")
    assert sorted(c["level"] for c in listed) == ["char", "word"]
    char = next(c for c in listed if c["level"] == "char")
    assert char["vocab_size"] == 5 and sum(char["tokens"].values()) == 400 and char["created"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "t.txt").write_text("a b\n" * 100)  # same label, another folder: not listed
    assert prepared_caches(str(tmp_path / "other" / "t.txt"), cache_dir=tmp_path / "c") == []
