"""Lines of text -> ids as the corpus preparation made them, per vocabulary level: the ids of a prepared corpus."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import word_vocab
from transformer_xl.data import Vocab, load_corpus
from transformer_xl.inference.lines import LineEncoder, split_lines

TEXT = "The cat sat  on the mat .\n  a dog, ran é\n\nthe end\n"


@pytest.mark.parametrize("level", ["word", "char", "byte"])
def test_text_ids_are_those_of_the_prepared_corpus(tmp_path, monkeypatch, level) -> None:
    """A user corpus of given splits prepared at ``level``: encoding its valid text gives the split's ids."""
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "corpus"
    root.mkdir()
    for split in ("train", "valid", "test"):
        (root / f"{split}.txt").write_text(TEXT, encoding="utf-8")
    corpus = load_corpus(str(root), level=level)
    enc = LineEncoder(corpus.vocab, level=level)
    assert enc.level == level and enc.char_level == (level != "word")
    np.testing.assert_array_equal(enc.text_ids(TEXT), corpus.splits["valid"])


def test_start_symbol_unknown_words_and_lower_case() -> None:
    enc = LineEncoder(word_vocab())
    assert enc.start_ids() == [0]  # <eos>
    assert enc.line_ids("the game zyzzyva") == [2, 3, 1, 0] and enc.unknown == 1
    ptb = LineEncoder(Vocab(["<eos>", "<unk>", "the", "cat"], eos="<eos>", unk="<unk>"))
    assert ptb.lower and ptb.line_ids("The CAT") == [2, 3, 0]  # a lower-case vocabulary lower-cases the text


def test_string_ids_end_lines_only_at_newlines() -> None:
    enc = LineEncoder(word_vocab())
    assert enc.string_ids("the game") == [2, 3]
    assert enc.string_ids("the game\n") == [2, 3, 0]
    assert enc.string_ids("the\ngame") == [2, 0, 3]
    assert enc.text_ids("the game") == enc.text_ids("the game\n") == [2, 3, 0]


def test_split_lines_as_a_file_holds_them() -> None:
    assert split_lines("a\nb\n") == ["a", "b"]
    assert split_lines("a\r\nb\rc") == ["a", "b", "c"]
    assert split_lines("") == [] and split_lines("\n") == [""]


def test_a_tokenizer_model_encodes_lines_as_its_prepared_corpus(tmp_path) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from transformer_xl.data.builders import Source
    from transformer_xl.data.subword import build_with_tokenizer

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "one": 1, "two": 2, "<eos>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    text = "one two\n  two three one \n\n"
    (tmp_path / "t.txt").write_text(text)
    built = build_with_tokenizer("t", {s: [Source(tmp_path / "t.txt")] for s in ("train", "valid", "test")},
                                 tmp_path / "tok.json")
    vocab = Vocab(["<unk>", "one", "two", "<eos>"], eos="<eos>", unk="<unk>")
    enc = LineEncoder(vocab, tokenizer=tmp_path / "tok.json")
    assert enc.level == "subword" and not enc.char_level and enc.start_ids() == [3]
    assert enc.text_ids(text) == built.splits["valid"].tolist() == [1, 2, 3, 2, 0, 1, 3, 3]
