"""The ``tokenizers`` pipeline equal to ``LineEncoder``: Python's whitespace and lower-casing where Rust's differ, every
code point of a range at once, the keys of ids no text reaches, the pad and start tokens, and the tokenizers that
are refused because no pipeline gives their ids exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.17")
pytest.importorskip("tokenizers")

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from transformer_xl.data import Vocab
from transformer_xl.errors import ConfigError
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.integrations.hf.tokenizer_build import PAD_TOKEN, build_tokenizer, python_whitespace, special_keys

#: Characters Python 3.11 (Unicode 14) leaves as they are and Rust (Unicode 16) lower-cases, with their Rust lower case.
CASED_DIFFERENTLY = {"\ua7cb": "\u0264", "\ua7dc": "\u019b", "\u1c89": "\u1c8a"}


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def _code_points() -> str:
    """The first 0x3400 code points, Greek and the characters cased differently, and every 61st one beyond."""
    points = [*range(1, 0x3400), *range(0x370, 0x400), *range(0xA7C0, 0xA7E0), *range(0x3400, 0x110000, 61)]
    return "".join(chr(p) for p in points if not 0xD800 <= p <= 0xDFFF) + "".join(CASED_DIFFERENTLY)


def _lower_alphabet(text: str) -> list[str]:
    """Every lower-case letter ``text`` lowers to (the Rust lower cases of the characters cased differently too, so
    that mapping those to the Rust form would find a symbol)."""
    lowered = {c for c in text.lower() if c.lower() != c.upper() or c in CASED_DIFFERENTLY.values()}
    return sorted(lowered - set(CASED_DIFFERENTLY))


@pytest.mark.parametrize("level", ["word", "char"])
def test_every_code_point_of_a_range_at_once(level: str) -> None:
    """One text holding thousands of code points (every whitespace, control and cased letter of the range), each its
    own word (or character): the ids are the encoder's, lower-casing and splitting included."""
    text = _code_points()
    alphabet = _lower_alphabet(text)
    vocab = Vocab(["<eos>", "<unk>", " ", "\t", *alphabet], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    enc = LineEncoder(vocab, level=level)
    assert enc.lower and "\u03c3" in vocab and "\u03c2" in vocab
    spaced = " ".join(text) if level == "word" else text
    assert _ids(build_tokenizer(enc), spaced) == enc.string_ids(spaced)


def test_whitespace_is_pythons_file_separators_included() -> None:
    ws = python_whitespace()
    assert set(ws) == {c for c in map(chr, range(0x3001)) if c.isspace()} and set("\x1c\x1d\x1e\x1f") <= set(ws)
    enc = LineEncoder(Vocab(["<eos>", "<unk>", "a", "b"], eos="<eos>", unk="<unk>"), level="word")
    tok = build_tokenizer(enc)
    for text in ["a\x1cb", "\x1fa\x1e", "a\x85b\u2028a", "a\r\nb\rb\n", "a\x1c\nb"]:
        assert _ids(tok, text) == enc.string_ids(text)
    assert _ids(tok, "a\x1cb\x1d") == [2, 3]


def test_final_sigma_is_lowered_as_python_lowers_it() -> None:
    """``Σ`` lowers to ``ς`` after a cased letter (case-ignorables between) and not before one."""
    syms = ["<eos>", "<unk>", "\u03b1\u03c2", "\u03b1\u03c3", "\u03c3\u03b1\u03c2", "\u03b1'\u03c2", "\u03b1\u03c2'",
            "\u03b1\u0301\u03c2", "\u03c3", "\u03c2", "a\u03c2"]
    enc = LineEncoder(Vocab(syms, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>"))
    tok = build_tokenizer(enc)
    for word in ["\u0391\u03a3", "\u0391\u03a3\u0391", "\u03a3\u0391\u03a3", "\u0391'\u03a3", "\u0391\u03a3'",
                 "\u0391\u0301\u03a3", "\u03a3", "A\u03a3", "1\u03a3", "\u0391\u03a3'\u0391", "\u03a3\u03a3"]:
        assert _ids(tok, word) == enc.string_ids(word), word
    assert _ids(tok, "\u0391\u03a3 \u0391\u03a3\u0391") == [2, 1]


def test_characters_python_and_rust_lower_differently() -> None:
    """Python leaves ``Ꟍ`` (Unicode 16) alone, Rust lowers it to ``ɤ``: a word holding it misses a vocabulary of
    ``ɤ`` in both, and a vocabulary holding ``Ꟍ`` itself is refused in one line."""
    enc = LineEncoder(Vocab(["<eos>", "<unk>", "\u0264", "\u019b"], eos="<eos>", unk="<unk>"))
    for text in ["\ua7cb", "\ua7dc \u0264", "\u1c89"]:
        assert _ids(build_tokenizer(enc), text) == enc.string_ids(text)
    assert enc.string_ids("\ua7cb") == [1]
    with pytest.raises(ConfigError, match=r"^the vocabulary holds characters \(U\+A7CB\) that Python .* lower-case "
                                          r"differently; this vocabulary cannot be made exact$"):
        build_tokenizer(LineEncoder(Vocab(["<eos>", "<unk>", "\ua7cb"], eos="<eos>", unk="<unk>")))


def test_keys_of_ids_no_text_reaches_and_the_special_tokens() -> None:
    """At character level a newline is ``<eos>``: the vocabulary's own ``\\n`` symbol gets an escaped key, so text never
    gives its id; the new pad takes the id one past the vocabulary, never from text; the start symbol comes first."""
    vocab = Vocab(["<eos>", "<unk>", "\n", "a", "<pad>x"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    enc = LineEncoder(vocab, level="char")
    tok = build_tokenizer(enc)
    assert tok.id_to_token(0) == "\n" and tok.id_to_token(2) == "<id 2: '\\n'>" and tok.id_to_token(5) == PAD_TOKEN
    assert tok.encode_special_tokens and _ids(tok, "a\n<pad>") == [3, 0, 1, 1, 3, 1, 1] == enc.string_ids("a\n<pad>")
    assert tok.encode("a").ids == [0, 3]
    assert special_keys(enc, tok) == {"bos_token": "\n", "eos_token": "\n", "unk_token": "<unk>", "pad_token": "<pad>"}
    pilcrow = LineEncoder(Vocab(["\xb6", "a"], eos="\xb6"), level="char")  # a one-character end-of-line symbol
    assert _ids(build_tokenizer(pilcrow), "a\xb6\na") == pilcrow.string_ids("a\xb6\na") == [1, 0, 0, 1]
    assert build_tokenizer(pilcrow).get_vocab() == {"\xb6": 0, "a": 1, PAD_TOKEN: 2}
    no_x = LineEncoder(Vocab(["<unk>", "x", *map(str, range(120))], special=["<unk>", "x"], unk="<unk>"), level="byte")
    assert _ids(build_tokenizer(no_x), "xw") == no_x.string_ids("xw") == [0, 121]  # byte 120 is not the symbol "x"
    taken = build_tokenizer(LineEncoder(Vocab(["<eos>", "<unk>", "<pad>"], eos="<eos>", unk="<unk>")))
    assert taken.id_to_token(3) == "<|pad|>" and _ids(taken, "<pad> <|pad|>") == [2, 1]


def test_unknown_symbols_without_unk_raise_and_bytes_are_utf8() -> None:
    tok = build_tokenizer(LineEncoder(Vocab(["<eos>", "the"], eos="<eos>")))
    assert _ids(tok, "the\nthe") == [1, 0, 1]
    with pytest.raises(Exception, match="Missing \\[UNK\\] token"):
        _ids(tok, "the cat")
    enc = LineEncoder(Vocab([str(b) for b in range(256)]))
    text = "".join(map(chr, range(1, 0x800))) + "\U0001f600\r\n\u4e00"
    lines = text.replace("\r\n", "\n").replace("\r", "\n")
    assert _ids(build_tokenizer(enc), text) == enc.string_ids(text) == list(lines.encode())


def _user_tokenizer(path: Path, *, eos_added: bool = True, normalizer: bool = False, prepend: str = "always",
                    extra: str | None = None) -> LineEncoder:
    words = {"<unk>": 0, "\u2581one": 1, "\u2581two": 2, "<eos>": 3}  # Metaspace writes a space as \u2581
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend)
    if normalizer:
        tok.normalizer = normalizers.NFKC()
    if eos_added:
        tok.add_special_tokens(["<eos>"])
    if extra:
        tok.add_tokens([extra])
    tok.save(str(path))
    syms = [tok.id_to_token(i) for i in range(tok.get_vocab_size(with_added_tokens=True))]
    return LineEncoder(Vocab(syms, eos="<eos>", unk="<unk>"), tokenizer=path)


@pytest.mark.parametrize(("options", "reason"), [
    ({"prepend": "first"}, "its Metaspace pre-tokenizer \\(prepend_scheme 'first'\\) prefixes only"),
    ({"normalizer": True}, "its added token '<eos>' is matched before the normalizer"),
    ({"eos_added": False}, "its end-of-line symbol '<eos>' is not one of its added tokens"),
    ({"extra": "x<e"}, "its added token 'x<e' could match across a line end"),
])
def test_subword_tokenizers_that_cannot_be_exact_are_refused(tmp_path, options, reason) -> None:
    assert _ids(build_tokenizer(_user_tokenizer(tmp_path / "ok.json")), "one\ntwo") == [1, 3, 2]
    with pytest.raises(ConfigError, match=f"^the model's tokenizer cannot be run line by line exactly: {reason}"):
        build_tokenizer(_user_tokenizer(tmp_path / "t.json", **options))


def test_a_word_level_end_of_line_symbol_with_a_space_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^the end-of-line symbol 'end here' is not a word"):
        build_tokenizer(LineEncoder(Vocab(["end here", "a"], eos="end here"), level="word"))
