"""enwik8 / text8 / One Billion Word / user text on small local files of the same structure."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import numpy as np
import pytest

from transformer_xl.data import load_corpus
from transformer_xl.errors import DataError


def fake_enwik8(tmp_path: Path, n: int = 300_000, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    values = np.concatenate([np.arange(32, 127), [10, 10, 9, 195, 169, 226]])
    raw = rng.choice(values, size=n, p=None).astype(np.uint8).tobytes()
    (tmp_path / "enwik8").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(tmp_path / "enwik8" / "enwik8.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("enwik8", raw)
    return raw


def official_enwik8(raw: bytes, n_test: int) -> tuple[list[str], dict[str, list[str]]]:
    """prep_enwik8.py + data_utils.py, the slow way."""
    from collections import Counter

    parts = {"train": raw[: -2 * n_test], "valid": raw[-2 * n_test : -n_test], "test": raw[-n_test:]}
    counter: Counter[str] = Counter()
    toks = {}
    for split, part in parts.items():
        text = " ".join(str(c) if c != ord("\n") else "\n" for c in part)
        toks[split] = [t for line in text.split("\n") for t in line.strip().split()]
        counter.update(toks[split])
    return [s for s, _ in counter.most_common()], toks


def test_enwik8_matches_official_rules(tmp_path: Path) -> None:
    raw = fake_enwik8(tmp_path)
    c = load_corpus("enwik8", tmp_path, cache_dir=tmp_path / "c", n_test=20_000)
    symbols, toks = official_enwik8(raw, 20_000)
    assert c.vocab.idx2sym == symbols and "10" not in c.vocab
    assert c.char_level and c.metric == "bpc" and c.splits["train"].dtype == np.uint8
    for split in ("train", "valid", "test"):
        assert c.vocab.decode(c.splits[split]) == toks[split]
    assert sum(v.shape[0] for v in c.splits.values()) == len(raw) - raw.count(b"\n")
    assert c.splits["test"].shape[0] == 20_000 - raw[-20_000:].count(b"\n")


def test_enwik8_too_small_and_plain_file(tmp_path: Path) -> None:
    fake_enwik8(tmp_path, n=1000)
    with pytest.raises(DataError, match="need more than 2 x 5000000"):
        load_corpus("enwik8", tmp_path, cache_dir=tmp_path / "c")
    (tmp_path / "enwik8" / "enwik8.zip").unlink()
    (tmp_path / "enwik8" / "enwik8").write_bytes(b"ab\ncd" * 100)
    c = load_corpus("enwik8", tmp_path, cache_dir=tmp_path / "c", n_test=50)
    assert len(c.vocab) == 4 and c.splits["test"].shape[0] == 40


def test_text8_matches_official_rules(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    raw = b" " + rng.choice(letters, size=200_000).tobytes() + b" "
    (tmp_path / "text8").mkdir()
    with zipfile.ZipFile(tmp_path / "text8" / "text8.zip", "w") as zf:
        zf.writestr("text8", raw)
    c = load_corpus("text8", tmp_path, cache_dir=tmp_path / "c", n_test=10_000)
    data = raw.decode()
    parts = {"train": data[:-20_000], "valid": data[-20_000:-10_000], "test": data[-10_000:]}
    from collections import Counter

    counter: Counter[str] = Counter()
    for split, part in parts.items():
        toks = " ".join("_" if ch == " " else ch for ch in part.strip()).split()
        counter.update(toks)
        assert c.vocab.decode(c.splits[split]) == toks
    assert c.vocab.idx2sym == [s for s, _ in counter.most_common()]
    assert len(c.vocab) == 27 and c.char_level


def test_text8_rejects_non_ascii(tmp_path: Path) -> None:
    (tmp_path / "text8").mkdir()
    (tmp_path / "text8" / "text8").write_bytes(b"abc d" * 100 + "é".encode() + b"x" * 100)
    with pytest.raises(DataError, match="non-ASCII byte at offset 500"):
        load_corpus("text8", tmp_path, cache_dir=tmp_path / "c", n_test=10)


def make_lm1b(tmp_path: Path) -> Path:
    root = tmp_path / "lm1b" / "1-billion-word-language-modeling-benchmark-r13output"
    train = root / "training-monolingual.tokenized.shuffled"
    held = root / "heldout-monolingual.tokenized.shuffled"
    train.mkdir(parents=True)
    held.mkdir(parents=True)
    rng = np.random.default_rng(2)
    words = ["the", "cat", "sat", "on", "mat", "dog", "zebra"]
    for k in (1, 2, 3):
        lines = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(200)]
        (train / f"news.en-0000{k}-of-00100").write_text("\n".join(lines) + "\n")
    (held / "news.en.heldout-00000-of-00050").write_text("the cat sat\nunknownword dog\n")
    vocab = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "on", "mat", "dog"]  # no zebra
    (tmp_path / "lm1b" / "1b_word_vocab.txt").write_text("".join(f"{w} {100 - i}\n" for i, w in enumerate(vocab)))
    return tmp_path


def test_lm1b_sentences_and_vocab_file(tmp_path: Path) -> None:
    c = load_corpus("lm1b", make_lm1b(tmp_path), cache_dir=tmp_path / "c")
    assert len(c.vocab) == 9 and c.vocab.unk == "<UNK>" and not c.char_level
    assert c.vocab.decode(c.splits["valid"]) == [
        "<S>",
        "the",
        "cat",
        "sat",
        "<S>",
        "<S>",
        "<UNK>",
        "dog",
        "<S>",
    ]
    np.testing.assert_array_equal(c.sentence_offsets("valid"), [0, 5, 9])
    np.testing.assert_array_equal(c.splits["valid"], c.splits["test"])  # official: both are heldout-00000
    assert c.extras["train.file_offsets"].tolist() == [0, 200, 400, 600]
    off = c.sentence_offsets("train")
    s_id = c.vocab.sym2idx["<S>"]
    assert (c.splits["train"][off[:-1]] == s_id).all() and (c.splits["train"][off[1:] - 1] == s_id).all()
    assert "zebra" not in c.vocab and (c.splits["train"] == c.vocab.unk_idx).any()


def test_user_text_levels_and_splits(tmp_path: Path) -> None:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("hello world\nhello there\n" * 50)
    (d / "b.txt.gz").write_bytes(gzip.compress(b"rare words here\n" * 10))
    word = load_corpus(str(d), cache_dir=tmp_path / "c", min_freq=2)
    assert word.vocab.idx2sym[:2] == ["<eos>", "<unk>"] and "hello" in word.vocab
    n = 50 * 2 * 3 + 10 * 4
    assert sum(v.shape[0] for v in word.splits.values()) == n
    eos = word.vocab.eos_idx  # the cuts are moved forward to the next line end: no line is split
    assert word.splits["train"][-1] == eos and word.splits["valid"][-1] == eos and word.splits["test"][-1] == eos
    assert 0 < int(n * 0.05) - word.splits["test"].shape[0] < 4  # "rare words here <eos>": 4 tokens a line
    capped = load_corpus("text", paths=[d / "a.txt"], cache_dir=tmp_path / "c", max_size=1)
    assert capped.vocab.idx2sym == ["<eos>", "<unk>", "hello"]
    char = load_corpus("text", paths=[d / "a.txt"], cache_dir=tmp_path / "c", level="char")
    assert char.char_level and char.vocab.decode(char.splits["train"][:12]) == [*"hello world", "<eos>"]
    byte = load_corpus("text", paths=[d / "a.txt"], cache_dir=tmp_path / "c", level="byte")
    assert len(byte.vocab) == 256 and bytes(byte.splits["train"][:12].tolist()) == b"hello world\n"


def test_user_text_explicit_splits_and_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path / "d"
    d.mkdir()
    for s in ("train", "valid", "test"):
        (d / f"{s}.txt").write_text(f"{s} one two\nthree {s}\n")
    c = load_corpus(str(d), cache_dir=tmp_path / "c")
    # the vocabulary counts train only: "valid" is unknown
    assert c.vocab.decode(c.splits["valid"]) == ["<unk>", "one", "two", "<eos>", "three", "<unk>", "<eos>"]
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "one": 2, "two": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "lines.txt").write_text("one two\nthree one\ntwo\none\n")
    t = load_corpus(
        str(tmp_path / "lines.txt"),
        cache_dir=tmp_path / "c",
        tokenizer=str(tmp_path / "tok.json"),
        valid_fraction=0.3,
        test_fraction=0.3,
    )
    # 10 tokens: the cuts at 4 and 7 move to the next line ends (after ids 6 and 8)
    assert [t.splits[s].tolist() for s in ("train", "valid", "test")] == [[2, 3, 1, 0, 2, 1], [3, 1], [2, 1]]
    assert t.vocab.eos_idx == 1
    given = load_corpus(str(d), cache_dir=tmp_path / "c", tokenizer=str(tmp_path / "tok.json"))  # given splits
    assert given.splits["valid"].tolist() == [0, 2, 3, 1, 0, 0, 1]


def test_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\n" + b"caf\xe9 ok\n" + b"good line\n" * 3)
    with pytest.raises(DataError, match=rf"{bad}: invalid UTF-8 at byte offset 13"):
        load_corpus(str(bad), cache_dir=tmp_path / "c")
    c = load_corpus(str(bad), cache_dir=tmp_path / "c", errors="replace", valid_fraction=0.2, test_fraction=0.2)
    assert "caf\ufffd" in c.vocab
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="corpus is empty"):
        load_corpus(str(empty), cache_dir=tmp_path / "c")
    (tmp_path / "ptb").mkdir()
    for s in ("train", "valid", "test"):
        (tmp_path / "ptb" / f"ptb.{s}.txt").write_text("a b\n" if s != "valid" else "")
    with pytest.raises(DataError, match="the valid split is empty"):
        load_corpus("ptb", tmp_path, cache_dir=tmp_path / "c")


def test_build_with_vocab_counts_what_the_vocabulary_lacks(tmp_path: Path) -> None:
    from transformer_xl.data import Vocab
    from transformer_xl.data.builders import Source, build_with_vocab

    for split, text in (("train", "a b c\nb x\n"), ("valid", "y a\n"), ("test", "b\n")):
        (tmp_path / f"{split}.txt").write_text(text)
    sources = {s: [Source(tmp_path / f"{s}.txt")] for s in ("train", "valid", "test")}
    vocab = Vocab(["<eos>", "<unk>", "a", "b", "c"], eos="<eos>", unk="<unk>")
    built = build_with_vocab("t", sources, vocab)
    assert built.vocab is vocab and built.unknown == {"train": 1, "valid": 1, "test": 0}
    assert built.splits["train"].tolist() == [2, 3, 4, 0, 3, 1, 0] and built.splits["valid"].tolist() == [1, 2, 0]
    with pytest.raises(DataError, match="word- or char-level text, not 'byte'"):
        build_with_vocab("t", sources, vocab, level="byte")
