"""Vectorized text -> provisional-id encoders shared by every corpus builder.

Text is split by C-level string methods (``str.split``, ``str.replace``) and symbols are mapped to
ids by ``map``/``np.fromiter`` over dictionaries: no Python bytecode runs per token. Ids given
here are *provisional* (first-seen order, see :class:`TypeTable`); a builder turns them into
vocabulary ids with one vectorized lookup once the vocabulary is known.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat

import numpy as np

from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import DataError

NEWLINE = 10


class TypeTable:
    """Every distinct symbol met so far, numbered in first-seen order."""

    def __init__(self, initial: Iterable[str] = ()) -> None:
        self.index: dict[str, int] = {}
        self.symbols: list[str] = []
        self.add(initial)

    def __len__(self) -> int:
        return len(self.symbols)

    def add(self, symbols: Iterable[str]) -> None:
        """Register ``symbols`` (in order) that are not known yet."""
        index = self.index
        new = [s for s in dict.fromkeys(symbols) if s not in index]
        index.update(zip(new, range(len(self.symbols), len(self.symbols) + len(new))))
        self.symbols.extend(new)

    def ids(self, tokens: list[str]) -> np.ndarray:
        """Provisional ids of ``tokens`` (registering new symbols first-seen first)."""
        self.add(tokens)
        return np.fromiter(map(self.index.__getitem__, tokens), dtype=np.int32, count=len(tokens))

    def ids_of_codes(self, codes: np.ndarray, newline_symbol: str) -> np.ndarray:
        """Provisional ids of Unicode code points; code point 10 (a line end) becomes ``newline_symbol``."""
        if codes.size == 0:
            return np.zeros(0, dtype=np.int32)
        uniq, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        syms = [newline_symbol if c == NEWLINE else chr(c) for c in uniq[order].tolist()]
        self.add(syms)
        gid = np.empty(len(uniq), dtype=np.int32)
        gid[order] = [self.index[s] for s in syms]
        return gid[inverse.ravel()]

    def lookup_table(self, vocab: Vocab, context: str) -> np.ndarray:
        """``lut[provisional id] -> vocabulary id`` (unknown symbols -> ``unk``, or a :class:`DataError`)."""
        lut = np.fromiter(map(vocab.sym2idx.get, self.symbols, repeat(-1)), np.int64, len(self.symbols))
        missing = np.flatnonzero(lut < 0)
        if missing.size:
            if vocab.unk_idx is None:
                sym = self.symbols[int(missing[0])]
                raise DataError(f"{context}: symbol {sym!r} is not in the vocabulary, which has no unknown symbol")
            lut[missing] = vocab.unk_idx
        return lut


def word_tokens(text: str, *, lower: bool = False, eos: str | None = None) -> tuple[list[str], int]:
    """Whitespace tokens of every line (``line.strip().split()``), plus ``eos`` after each line.

    Returns the tokens and the number of lines. ``text`` must use ``\\n`` line ends; a final line
    without one still counts as a line (as iterating over a text file does).
    """
    if lower:
        text = text.lower()
    if eos is None:
        return text.split(), text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if text and not text.endswith("\n"):
        text += "\n"
    return text.replace("\n", f" {eos} ").split(), text.count("\n")


def line_char_codes(text: str, *, lower: bool = False) -> np.ndarray:
    """Code points of every stripped line, each line followed by code point 10 (its end-of-line)."""
    if not text:
        return np.zeros(0, dtype=np.uint32)
    if lower:
        text = text.lower()
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    joined = "\n".join(map(str.strip, lines)) + "\n"
    return np.frombuffer(joined.encode("utf-32-le"), dtype="<u4")


def sentence_ids(text: str, vocab: Vocab, bos_eos: str) -> tuple[np.ndarray, np.ndarray]:
    """Encode each line as ``[bos_eos] + line.split() + [bos_eos]`` (official ``add_double_eos``).

    Returns the concatenated vocabulary ids and the token length of every sentence.
    """
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    n_words = np.fromiter(map(len, map(str.split, lines)), dtype=np.int64, count=len(lines))
    words = text.split()
    if int(n_words.sum()) != len(words):  # pragma: no cover - str.split on lines vs text always agree
        raise DataError("internal error: inconsistent line split")
    unk = vocab.unk_idx
    default = -1 if unk is None else unk
    wid = np.fromiter(map(vocab.sym2idx.get, words, repeat(default)), dtype=np.int64, count=len(words))
    if unk is None and (wid < 0).any():
        bad = words[int(np.flatnonzero(wid < 0)[0])]
        raise DataError(f"symbol {bad!r} is not in the vocabulary, which has no unknown symbol")
    lengths = n_words + 2
    out = np.empty(int(lengths.sum()), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    marker = vocab.sym2idx[bos_eos]
    out[starts] = marker
    out[starts + lengths - 1] = marker
    line_of_word = np.repeat(np.arange(len(lines), dtype=np.int64), n_words)
    out[np.arange(len(words), dtype=np.int64) + 2 * line_of_word + 1] = wid
    return out, lengths
