"""Vocabularies: official ordering rules, encode/decode, JSON storage and its hash (``transformer_xl.data.vocab``)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import WIKI_WORDS, word_vocab
from transformer_xl.data.vocab import Vocab, smallest_dtype
from transformer_xl.errors import DataError


def _official(tokens: list[str], special: list[str], min_freq: int, max_size: int | None) -> list[str]:
    """The official ``Vocab.build_vocab``: specials, then ``most_common(max_size)`` until below ``min_freq``."""
    counter = Counter(tokens)
    out: list[str] = []
    for sym in special:
        if sym not in out:
            out.append(sym)
    for sym, cnt in counter.most_common(max_size):
        if cnt < min_freq:
            break
        if sym not in out:
            out.append(sym)
    return out


def _counts(tokens: list[str]) -> tuple[list[str], np.ndarray]:
    """Symbols in first-seen order and their counts (what a builder passes to ``from_counts``)."""
    symbols = list(dict.fromkeys(tokens))
    return symbols, np.array([tokens.count(s) for s in symbols])


def test_from_counts_orders_specials_then_count_then_first_seen() -> None:
    tokens = ["b", "a", "c", "a", "b", "d", "a", "e", "c", "b", "f"]  # a:3 b:3 c:2 d:1 e:1 f:1, b seen before a
    symbols, counts = _counts(tokens)
    vocab = Vocab.from_counts(symbols, counts, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    assert vocab.idx2sym == ["<eos>", "<unk>", "b", "a", "c", "d", "e", "f"]
    assert (vocab.eos_idx, vocab.unk_idx, vocab.special) == (0, 1, ["<eos>", "<unk>"])


def test_from_counts_min_freq_max_size_and_zero_counts() -> None:
    symbols, counts = ["x", "y", "z", "w", "never"], np.array([5, 1, 3, 3, 0])
    assert Vocab.from_counts(symbols, counts).idx2sym == ["x", "z", "w", "y"]  # count 0 left out
    assert Vocab.from_counts(symbols, counts, min_freq=3).idx2sym == ["x", "z", "w"]
    assert Vocab.from_counts(symbols, counts, max_size=2, special=["<s>"]).idx2sym == ["<s>", "x", "z"]
    assert Vocab.from_counts(symbols, counts, max_size=0).idx2sym == []
    # a special symbol that was also counted appears once, and still uses one of the max_size places
    assert Vocab.from_counts(symbols, counts, special=["z"], max_size=2).idx2sym == ["z", "x"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("min_freq", "max_size"), [(0, None), (2, None), (0, 5), (3, 4), (1, 100)])
def test_from_counts_matches_official_counter_rule(seed: int, min_freq: int, max_size: int | None) -> None:
    rng = np.random.default_rng(seed)
    pool = [f"w{i}" for i in range(15)] + ["<eos>"]
    tokens = [pool[i] for i in rng.integers(0, len(pool), 60)]  # many ties
    symbols, counts = _counts(tokens)
    special = ["<eos>", "<unk>"]
    vocab = Vocab.from_counts(symbols, counts, special=special, min_freq=min_freq, max_size=max_size)
    assert vocab.idx2sym == _official(tokens, special, min_freq, max_size)


def test_eos_and_unk_only_when_present() -> None:
    vocab = Vocab(["a", "b"], special=["<eos>"], eos="<eos>", unk="<unk>")
    assert vocab.eos is None and vocab.unk is None and vocab.eos_idx is None and vocab.unk_idx is None
    vocab = Vocab(["a", "<unk>", "<eos>"], eos="<eos>", unk="<unk>")
    assert (vocab.eos_idx, vocab.unk_idx) == (2, 1)


def test_duplicate_symbols_are_refused() -> None:
    with pytest.raises(DataError, match="duplicate"):
        Vocab(["a", "b", "a"])


def test_encode_decode_round_trip_and_unknowns() -> None:
    vocab = word_vocab()
    assert len(vocab) == len(WIKI_WORDS) and "game" in vocab and "zebra" not in vocab
    words = ["the", "game", "@-@", "'s", "<eos>"]
    ids = vocab.encode(words)
    assert ids.dtype == np.int64 and ids.tolist() == [WIKI_WORDS.index(w) for w in words]
    assert vocab.decode(ids) == words and vocab.decode(ids.reshape(1, -1).tolist()) == words
    assert vocab.encode(iter(["zebra", "the"])).tolist() == [vocab.unk_idx, 2]
    assert vocab.decode([]) == [] and vocab.encode([]).size == 0
    for bad in ([len(vocab)], [-1]):
        with pytest.raises(DataError, match="out of range"):
            vocab.decode(bad)


def test_encode_without_unk_refuses_unknown_symbols() -> None:
    vocab = Vocab(["a", "b"])
    assert vocab.encode(["b", "a"]).tolist() == [1, 0]
    with pytest.raises(DataError, match=r"symbol 'c' is not in the vocabulary"):
        vocab.encode(["a", "c"])


def test_json_round_trip(tmp_path: Path) -> None:
    vocab = Vocab(["<eos>", "<unk>", "é", "日本", "a b"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    back = Vocab.from_json(vocab.to_json())
    assert (back.idx2sym, back.special, back.eos, back.unk) == (vocab.idx2sym, vocab.special, "<eos>", "<unk>")
    assert json.loads(vocab.to_json())["format"] == "txl-vocab" and "é" in vocab.to_json()  # not \u-escaped
    vocab.save(tmp_path / "sub" / "vocab.json")
    loaded = Vocab.load(tmp_path / "sub" / "vocab.json")
    assert loaded.idx2sym == vocab.idx2sym and loaded.sha256() == vocab.sha256()
    assert (loaded.eos_idx, loaded.unk_idx) == (0, 1)


def test_sha256_is_stable_and_content_sensitive() -> None:
    a = word_vocab()
    assert a.sha256() == word_vocab().sha256() == hashlib.sha256(a.to_json().encode("utf-8")).hexdigest()
    swapped = list(WIKI_WORDS)
    swapped[2], swapped[3] = swapped[3], swapped[2]
    others = [
        Vocab(swapped, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>"),  # order
        Vocab(WIKI_WORDS, special=["<eos>", "<unk>"], eos="<eos>"),  # no unk
        Vocab(WIKI_WORDS, special=["<eos>"], eos="<eos>", unk="<unk>"),  # specials
        Vocab([*WIKI_WORDS, "new"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>"),  # one more symbol
    ]
    digests = {a.sha256(), *(v.sha256() for v in others)}
    assert len(digests) == 5 and all(len(d) == 64 for d in digests)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"symbols": ["a"]}',  # no format
        '{"format": "other", "symbols": ["a"]}',
        '{"format": "txl-vocab"}',  # no symbols
        '{"format": "txl-vocab", "symbols": 5}',
        '{"format": "txl-vocab", "symbols": ["a", "a"]}',
        # found by the fuzz campaign (tests/fuzz): non-strings reached the codec as symbols
        '{"format": "txl-vocab", "symbols": ["a", null]}',
        '{"format": "txl-vocab", "symbols": ["a", 3]}',
        '{"format": "txl-vocab", "symbols": ["a"], "special": [null]}',
        '{"format": "txl-vocab", "symbols": ["a"], "special": "a"}',
        '{"format": "txl-vocab", "symbols": ["a"], "unk": ["a"]}',
    ],
)
def test_malformed_json_gives_data_error(text: str, tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        Vocab.from_json(text)
    assert "\n" not in str(exc.value)
    (tmp_path / "v.json").write_text(text)
    with pytest.raises(DataError):
        Vocab.load(tmp_path / "v.json")


def test_load_missing_file_gives_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read vocabulary"):
        Vocab.load(tmp_path / "absent.json")


def test_load_non_utf8_file_gives_data_error(tmp_path: Path) -> None:
    (tmp_path / "v.json").write_bytes(b'{"format": "txl-vocab", "symbols": ["\xff"]}')
    with pytest.raises(DataError):
        Vocab.load(tmp_path / "v.json")


def test_from_symbol_file(tmp_path: Path) -> None:
    text = "<S> 100\n</S> 90\n<UNK> 0\nthe 50\n\n   \nthe 7\ncat\n"
    path = tmp_path / "1b_word_vocab.txt"
    path.write_text(text, encoding="utf-8")
    vocab = Vocab.from_symbol_file(path)
    assert vocab.idx2sym == ["<S>", "</S>", "<UNK>", "the", "cat"]  # first field, blanks skipped, deduplicated
    assert vocab.unk == "<UNK>" and vocab.unk_idx == 2 and vocab.eos is None
    gz = tmp_path / "v.txt.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert Vocab.from_symbol_file(gz).idx2sym == vocab.idx2sym
    assert Vocab.from_symbol_file(path, unk="cat").unk_idx == 4
    with pytest.raises(DataError, match=r"has no <unk> symbol"):
        Vocab.from_symbol_file(path, unk="<unk>")
    (tmp_path / "bad.txt").write_bytes(b"<UNK>\n\xff\n")
    with pytest.raises(DataError, match="invalid UTF-8 at byte offset 6"):
        Vocab.from_symbol_file(tmp_path / "bad.txt")


@pytest.mark.parametrize(
    ("n", "dtype"),
    [(1, np.uint8), (256, np.uint8), (257, np.uint16), (65_536, np.uint16), (65_537, np.uint32),
     (2**32, np.uint32), (2**32 + 1, np.uint64)],
)
def test_smallest_dtype_holds_every_id(n: int, dtype: type) -> None:
    assert smallest_dtype(n) == np.dtype(dtype)
    assert np.iinfo(smallest_dtype(n)).max >= n - 1
