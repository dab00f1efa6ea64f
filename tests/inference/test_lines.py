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


def test_byte_lines_end_with_the_newline_byte_only_when_the_vocabulary_has_it() -> None:
    """Bytes are never lower-cased (a vocabulary of byte values has no upper-case symbol), and a line ends with byte
    ``10`` where the vocabulary has it (a user byte corpus), with nothing where it has not (enwik8)."""
    syms = [str(b) for b in (10, 32, 65, 97, 195, 169)]
    enc = LineEncoder(Vocab(syms))
    assert enc.level == "byte" and not enc.lower and enc.char_level
    assert enc.line_ids("A aé") == [2, 1, 3, 4, 5, 0]
    no_newline = LineEncoder(Vocab(syms[1:]))
    assert no_newline.line_ids("A a") == [1, 0, 2] and no_newline.end_id is None


def test_char_and_text8_line_ends_and_spaces() -> None:
    """A character vocabulary without ``<eos>`` ends a line with its newline symbol (or nothing); text8 writes a
    space as ``_``, ends no line and lower-cases."""
    chars = LineEncoder(Vocab(["\n", " ", "a", "b"]), level="char")
    assert chars.line_ids("  a b ") == [2, 1, 3, 0]
    assert LineEncoder(Vocab([" ", "a", "b"]), level="char").line_ids("a b") == [1, 0, 2]
    with_eos = LineEncoder(Vocab(["<eos>", "\n", "a"], special=["<eos>"], eos="<eos>"), level="char")
    assert with_eos.line_ids("a") == [2, 0]  # <eos> first, as the corpus builder ends a line
    text8 = LineEncoder(Vocab(["_", "a", "b"]))
    assert text8.level == "text8" and text8.lower
    assert text8.line_ids(" A  b ") == [1, 0, 0, 2] and text8.text_ids("a\nb\n") == [1, 2]


def test_a_symbol_outside_a_vocabulary_without_unk_is_one_line() -> None:
    from transformer_xl.errors import DataError

    enc = LineEncoder(Vocab(["<eos>", "the"], eos="<eos>"))
    with pytest.raises(DataError, match=r"^symbol 'cat' is not in the model's vocabulary, which has no unknown "
                                        r"symbol$"):
        enc.line_ids("the cat")
    assert enc.unknown == 0


def test_string_ids_read_carriage_returns_as_line_ends() -> None:
    enc = LineEncoder(word_vocab())
    assert enc.string_ids("the\r\ngame") == enc.string_ids("the\rgame") == [2, 0, 3]
    assert enc.string_ids("") == []
    chars = LineEncoder(Vocab([" ", "a", "b"]), level="char")  # no line-end symbol: nothing to cut from the last line
    assert chars.string_ids("ab") == [1, 2] and chars.string_ids("a\nb") == [1, 2]


def test_the_level_given_wins_over_the_one_the_symbols_show() -> None:
    """``_ a b`` looks like text8; given ``char``, ``_`` is a symbol like another and a line ends with ``<eos>``."""
    from transformer_xl.data.codec import TextCodec

    vocab = Vocab(["<eos>", "_", "a", "b"], special=["<eos>"], eos="<eos>")
    assert LineEncoder(vocab).level == "text8" and LineEncoder(vocab).line_ids("a b") == [2, 1, 3]
    enc = LineEncoder(vocab, level="char")
    assert enc.level == "char" and enc.line_ids("a_b") == [2, 1, 3, 0]
    assert isinstance(enc.codec, TextCodec) and enc.codec.level == "char"
    newline_start = LineEncoder(Vocab(["\n", " ", "a"]), level="char")
    assert newline_start.start_ids() == [0]  # no <eos>: the newline symbol starts the text


def test_for_model_reads_the_runs_level_and_tokenizer(tmp_path) -> None:
    pytest.importorskip("tokenizers")
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    run = tmp_path / "run"
    run.mkdir()
    Vocab(["<eos>", "_", "a", "b"], special=["<eos>"], eos="<eos>").save(run / "vocab.json")
    (run / "config.json").write_text(json.dumps({"train": {"level": "char"}}))
    assert LineEncoder.for_model(run).level == "char"
    assert LineEncoder.for_model(run, level="text8").level == "text8"
    other = tmp_path / "other.json"
    Vocab(["<eos>", "x", "y"], eos="<eos>").save(other)
    assert LineEncoder.for_model(run, vocab=other).line_ids("xy") == [1, 2, 0]
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "one": 1, "two": 2, "<eos>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    Vocab(["<unk>", "one", "two", "<eos>"], eos="<eos>", unk="<unk>").save(run / "vocab.json")
    (run / "config.json").write_text(json.dumps({"train": {"tokenizer": str(tmp_path / "tok.json")}}))
    enc = LineEncoder.for_model(run)
    assert enc.level == "subword" and enc.line_ids("one two") == [1, 2, 3]


def test_a_tokenizer_model_is_not_lower_cased_and_gets_no_special_tokens(tmp_path) -> None:
    """The corpus builder gives a tokenizer the line as it is, without the tokenizer's own special tokens."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from transformer_xl.errors import DataError

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "one": 1, "two": 2, "<eos>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", 3)])
    tok.save(str(tmp_path / "tok.json"))
    vocab = Vocab(["<unk>", "one", "two", "<eos>"], eos="<eos>", unk="<unk>")
    enc = LineEncoder(vocab, tokenizer=tmp_path / "tok.json")
    assert not enc.lower and enc.line_ids(" ONE two ") == [0, 2, 3]
    assert LineEncoder(vocab, level="byte", tokenizer=tmp_path / "tok.json").level == "subword"  # a tokenizer decides
    bare = Tokenizer(models.WordLevel({"<unk>": 0, "one": 1, "two": 2}, unk_token="<unk>"))
    bare.save(str(tmp_path / "bare.json"))
    no_eos = LineEncoder(Vocab(["<unk>", "one", "two"], unk="<unk>"), tokenizer=tmp_path / "bare.json")
    with pytest.raises(DataError, match=r"^the vocabulary has no <eos> to start a text from$"):
        no_eos.start_ids()
