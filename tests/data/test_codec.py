"""Text <-> ids per vocabulary level: prompt encoding, streaming detokenization, fallbacks."""

from __future__ import annotations

import pytest

from tests.helpers import WIKI_WORDS as WORDS
from tests.helpers import word_vocab as _word_vocab
from transformer_xl.data import Vocab
from transformer_xl.data.codec import PromptWarning, TextCodec, detect_level
from transformer_xl.errors import ConfigError


def test_detect_level() -> None:
    assert detect_level(_word_vocab()) == "word"
    assert detect_level(Vocab(["<eos>", "a", "b", " "], eos="<eos>")) == "char"
    assert detect_level(Vocab(list("abcdefghijklmnopqrstuvwxyz_"))) == "text8"
    assert detect_level(Vocab([str(b) for b in (32, 101, 200, 0)])) == "byte"


def test_word_detokenization_and_prompt_tokenization() -> None:
    codec = TextCodec(_word_vocab())
    syms = ["=", "the", "game", "=", "<eos>", "It", "'s", "well", "@-@", "known", "(", "1", "@,@", "000", ")",
            ",", "do", "n't", ".", "<eos>", "the"]
    ids = [codec.vocab.sym2idx[s] for s in syms]
    assert codec.decode(ids) == "= the game =\nIt's well-known (1,000), don't.\nthe"
    with pytest.warns(PromptWarning, match="zzz"):
        enc = codec.encode("The well-known game (1,000) zzz.\nIt")
    assert codec.vocab.decode(enc) == ["<unk>", "well", "@-@", "known", "game", "(", "1", "@,@", "000", ")",
                                       "<unk>", ".", "<eos>", "It"]  # cased vocabulary: "The" is unknown
    lower = TextCodec(Vocab([s.lower() for s in WORDS], eos="<eos>", unk="<unk>"))
    assert lower.vocab.decode(lower.encode("The game"))[0] == "the"  # lower-cased vocabulary: prompt lowered
    assert codec.encode("") == [codec.vocab.eos_idx]  # empty prompt: start of a line


def test_prompts_already_in_wikitext_form_are_kept_as_they_are() -> None:
    codec = TextCodec(_word_vocab())
    line = "It was the game 's 1 @,@ 000 ( well @-@ known ) , do n't . 3 @.@ 5"
    with pytest.warns(PromptWarning):  # "3" and "5"
        assert codec.vocab.decode(codec.encode(line)) == [s if s in codec.vocab else "<unk>" for s in line.split()]


def test_char_text8_and_byte_levels() -> None:
    char = TextCodec(Vocab(["<eos>", "a", "b", " "], eos="<eos>"))
    with pytest.warns(PromptWarning, match="dropped"):
        ids = char.encode("ab x\nb")
    assert char.decode(ids) == "ab \nb"
    t8 = TextCodec(Vocab(list("abcdefghijklmnopqrstuvwxyz_")))
    assert t8.decode(t8.encode("Hello World")) == "hello world"
    byte_vocab = Vocab([str(b) for b in range(256)])
    byte = TextCodec(byte_vocab)
    ids = byte.encode("héllo €")
    assert byte.decode(ids) == "héllo €"
    dec = byte.decoder()  # a character split over two steps is printed once complete
    euro = "€".encode()
    assert dec.feed([euro[0]]) == "" and dec.feed([euro[1]]) == "" and dec.feed([euro[2]]) == "€"
    assert byte.decode([0xFF, 0x41]) == "\ufffdA"  # invalid UTF-8 -> U+FFFD
    assert byte.decode([0xE2, 0x82]) == "\ufffd"  # truncated at the end
    enwik8_like = TextCodec(Vocab([str(b) for b in (32, 104, 105)]))  # no newline byte, no <unk>
    with pytest.warns(PromptWarning, match="bytes"):
        assert enwik8_like.decode(enwik8_like.encode("hi\nhi")) == "hihi"
    assert enwik8_like.encode("") == [0]  # no <eos>: start from a space




def test_digit_like_characters_are_not_bytes() -> None:
    """``"²"`` is a digit to ``str.isdigit`` but no byte value: a character vocabulary with it stays ``char``."""
    vocab = Vocab(["<eos>", "a", "²", "1"], eos="<eos>")
    assert detect_level(vocab) == "char"
    codec = TextCodec(vocab, "byte")  # forced: the symbols that are not bytes print nothing, no crash
    assert codec.decode(vocab.encode(["1"])) == "\x01"


@pytest.mark.parametrize("symbols, level, detected", [(WORDS, "byte", "word"), (["<eos>", "97", "98"], "char", "byte")])
def test_a_level_that_does_not_fit_the_vocabulary_is_refused(symbols: list[str], level: str, detected: str) -> None:
    vocab = Vocab(symbols, eos="<eos>")
    with pytest.raises(ConfigError, match=f"level '{level}' does not fit this vocabulary of {detected}-level symbols"):
        TextCodec(vocab, level)
