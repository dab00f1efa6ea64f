"""Vectorized text encoders checked against slow per-line re-computations of the same rules
(``transformer_xl.data.tokenize``)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from transformer_xl.data.tokenize import TypeTable, line_char_codes, sentence_ids, word_tokens
from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import DataError

TEXTS = [
    "",
    "\n",
    "\n\n\n",
    "one line\n",
    "no final newline",
    "  lead and trail  \n\tTabs\tand  doubles  \n\nAfter Empty\n",
    "The Cat sat.\nthe cat SAT .\nlast",
    "mixed\x0bvertical\x0cfeed\r\ncarriage\n",
    "unicode space\u00a0nbsp\u2003em ÉTÉ Straße\n😀 emoji\n",
    "   \n \t \n x \n",
]


def _file_lines(text: str) -> list[str]:
    """Lines as iterating over a text file with ``\\n`` line ends gives them (each with its ``\\n``)."""
    return list(io.StringIO(text, newline="\n"))


def _ref_word_tokens(text: str, lower: bool, eos: str | None) -> tuple[list[str], int]:
    tokens: list[str] = []
    lines = _file_lines(text)
    for line in lines:
        if lower:
            line = line.lower()
        tokens += line.strip().split()
        if eos is not None:
            tokens.append(eos)
    return tokens, len(lines)


def _ref_line_char_codes(text: str, lower: bool) -> list[int]:
    codes: list[int] = []
    for line in _file_lines(text):
        if lower:
            line = line.lower()
        codes += [ord(c) for c in line.strip()] + [10]
    return codes


def _ref_provisional(symbols: list[str], table: dict[str, int]) -> list[int]:
    out = []
    for s in symbols:
        if s not in table:
            table[s] = len(table)
        out.append(table[s])
    return out


def test_type_table_numbers_symbols_in_first_seen_order() -> None:
    table = TypeTable(["<eos>", "a"])
    assert table.symbols == ["<eos>", "a"] and table.index == {"<eos>": 0, "a": 1} and len(table) == 2
    table.add(["b", "a", "c", "b", "<eos>"])
    assert table.symbols == ["<eos>", "a", "b", "c"] and table.index == {s: i for i, s in enumerate(table.symbols)}
    table.add([])
    assert len(table) == 4


def test_type_table_ids_match_reference_across_calls() -> None:
    table, ref = TypeTable(), {}
    for text in TEXTS:
        tokens = text.split()
        ids = table.ids(tokens)
        assert ids.dtype == np.int32 and ids.tolist() == _ref_provisional(tokens, ref)
    assert table.index == ref and table.symbols == list(ref)


def test_type_table_ids_of_codes_match_reference() -> None:
    table, ref = TypeTable(["<eos>"]), {"<eos>": 0}
    for text in TEXTS:
        codes = line_char_codes(text)
        ids = table.ids_of_codes(codes, "<eos>")
        syms = ["<eos>" if c == 10 else chr(c) for c in codes.tolist()]
        assert ids.dtype == np.int32 and ids.tolist() == _ref_provisional(syms, ref)
    assert table.symbols == list(ref) and "\n" not in table.index
    empty = table.ids_of_codes(np.zeros(0, dtype=np.uint32), "<eos>")
    assert empty.dtype == np.int32 and empty.size == 0 and table.symbols == list(ref)


def test_type_table_ids_of_codes_agrees_with_ids_of_symbols() -> None:
    codes = np.array([ord(c) for c in "zz\nay\nza😀\n"], dtype=np.uint32)
    by_codes, by_symbols = TypeTable(["y"]), TypeTable(["y"])
    a = by_codes.ids_of_codes(codes, "\n")
    b = by_symbols.ids([chr(c) for c in codes.tolist()])
    assert a.tolist() == b.tolist() and by_codes.symbols == by_symbols.symbols == ["y", "z", "\n", "a", "😀"]


def test_lookup_table_maps_unknown_to_unk_or_raises() -> None:
    table = TypeTable(["the", "cat", "zebra", "<eos>"])
    with_unk = Vocab(["<eos>", "<unk>", "cat", "the"], eos="<eos>", unk="<unk>")
    lut = table.lookup_table(with_unk, "ptb")
    assert lut.tolist() == [3, 2, 1, 0] and lut.dtype == np.int64
    without_unk = Vocab(["<eos>", "cat", "the"], eos="<eos>")
    with pytest.raises(DataError, match=r"^ptb: symbol 'zebra' is not in the vocabulary, which has no unknown"):
        table.lookup_table(without_unk, "ptb")
    assert TypeTable(["the", "cat"]).lookup_table(without_unk, "ptb").tolist() == [2, 1]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("eos", [None, "<eos>"])
def test_word_tokens_match_per_line_reference(text: str, lower: bool, eos: str | None) -> None:
    assert word_tokens(text, lower=lower, eos=eos) == _ref_word_tokens(text, lower, eos)


def test_word_tokens_examples() -> None:
    assert word_tokens("A b\n\nc", eos="<eos>") == (["A", "b", "<eos>", "<eos>", "c", "<eos>"], 3)
    assert word_tokens("A b\n\nc", lower=True) == (["a", "b", "c"], 3)
    assert word_tokens("A B\n", lower=True, eos="<EOS>") == (["a", "b", "<EOS>"], 1)  # eos is not lowered
    assert word_tokens("") == ([], 0) and word_tokens("", eos="<eos>") == ([], 0)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("lower", [False, True])
def test_line_char_codes_match_per_line_reference(text: str, lower: bool) -> None:
    codes = line_char_codes(text, lower=lower)
    assert codes.dtype.kind == "u" and codes.dtype.itemsize == 4
    assert codes.tolist() == _ref_line_char_codes(text, lower)


def test_line_char_codes_examples() -> None:
    assert line_char_codes(" Ab \nc").tolist() == [65, 98, 10, 99, 10]
    assert line_char_codes(" Ab \nc", lower=True).tolist() == [97, 98, 10, 99, 10]
    assert line_char_codes("😀\n").tolist() == [0x1F600, 10]  # one code point, not two UTF-16 halves
    assert line_char_codes("").size == 0


def _vocab(unk: bool = True) -> Vocab:
    syms = ["<S>", "the", "cat", "sat", "Ã©"] + (["<UNK>"] if unk else [])
    return Vocab(syms, unk="<UNK>" if unk else None)


def _ref_sentence_ids(text: str, vocab: Vocab, marker: str) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    lengths: list[int] = []
    m = vocab.sym2idx[marker]
    for line in _file_lines(text):
        sent = [m] + [vocab.sym2idx.get(w, vocab.unk_idx) for w in line.split()] + [m]
        ids += sent
        lengths.append(len(sent))
    return ids, lengths


@pytest.mark.parametrize(
    "text",
    [t for t in TEXTS if t] + ["the cat sat\nsat the cat the\n", "  the   dog \n\ncat", "unknown words only\n"],
)
def test_sentence_ids_match_per_line_reference(text: str) -> None:
    vocab = _vocab()
    ids, lengths = sentence_ids(text, vocab, "<S>")
    ref_ids, ref_lengths = _ref_sentence_ids(text, vocab, "<S>")
    assert ids.tolist() == ref_ids and lengths.tolist() == ref_lengths
    assert int(lengths.sum()) == ids.size


def test_sentence_ids_example_and_missing_unk() -> None:
    ids, lengths = sentence_ids("the cat\n\ndog sat\n", _vocab(), "<S>")
    assert ids.tolist() == [0, 1, 2, 0, 0, 0, 0, 5, 3, 0] and lengths.tolist() == [4, 2, 4]
    with pytest.raises(DataError, match=r"symbol 'dog' is not in the vocabulary, which has no unknown symbol"):
        sentence_ids("the cat\ndog sat\n", _vocab(unk=False), "<S>")
    ids, lengths = sentence_ids("the cat\n", _vocab(unk=False), "<S>")
    assert ids.tolist() == [0, 1, 2, 0] and lengths.tolist() == [4]
