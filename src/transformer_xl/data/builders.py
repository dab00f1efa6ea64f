"""Corpus builders: raw files -> (vocabulary, token-id arrays), following the official preparation rules.

Every builder is vectorized (NumPy over bytes / code points, C-level string splitting) and returns a
:class:`Built`. Rules and their official origin are documented per function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transformer_xl.data.rawtext import decode_utf8, iter_text_chunks, read_bytes
from transformer_xl.data.tokenize import TypeTable, line_char_codes, sentence_ids, word_tokens
from transformer_xl.data.vocab import Vocab, smallest_dtype
from transformer_xl.errors import DataError

SPLITS = ("train", "valid", "test")
#: ASCII code points Python's ``str.split()``/``str.strip()`` treat as whitespace.
ASCII_WHITESPACE = (9, 10, 11, 12, 13, 28, 29, 30, 31, 32)


@dataclass(frozen=True)
class Source:
    """A raw input: a file, or a member of a zip archive."""

    path: Path
    member: str | None = None

    def __str__(self) -> str:
        return f"{self.path}" if self.member is None else f"{self.path}!{self.member}"

    def read(self) -> bytes:
        """The (decompressed) bytes."""
        return read_bytes(self.path, self.member)


@dataclass
class Built:
    """A prepared corpus before it is written to the cache."""

    vocab: Vocab
    splits: dict[str, np.ndarray]
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    unknown: dict[str, int] | None = None  # per split: tokens a given vocabulary lacks (build_with_vocab)


def check_nonempty(name: str, splits: dict[str, np.ndarray], where: str) -> None:
    for split, arr in splits.items():
        if arr.size == 0:
            raise DataError(f"{name}: the {split} split is empty ({where})")


def _finish(
    name: str,
    table: TypeTable,
    ids: dict[str, np.ndarray],
    counted: Sequence[np.ndarray],
    *,
    special: Sequence[str],
    eos: str | None,
    unk: str | None,
    min_freq: int = 0,
    max_size: int | None = None,
) -> Built:
    """Count, build the vocabulary with the official rule, and remap provisional ids."""
    counts = np.zeros(len(table), dtype=np.int64)
    for arr in counted:
        counts += np.bincount(arr, minlength=len(table))
    if eos is not None and eos in table.index:
        counts[table.index[eos]] = 0  # the official counter never sees the appended end-of-line symbol
    vocab = Vocab.from_counts(
        table.symbols, counts, special=special, min_freq=min_freq, max_size=max_size, eos=eos, unk=unk
    )
    lut = table.lookup_table(vocab, name)
    dtype = smallest_dtype(len(vocab))
    return Built(vocab, {s: lut[a].astype(dtype) for s, a in ids.items()})


def _encode(
    table: TypeTable, sources: Sequence[Source], *, level: str, lower: bool, eos: str | None, errors: str
) -> np.ndarray:
    parts: list[np.ndarray] = [np.zeros(0, dtype=np.int32)]
    for src in sources:
        for text in iter_text_chunks(src.read(), str(src), errors):
            if level == "word":
                parts.append(table.ids(word_tokens(text, lower=lower, eos=eos)[0]))
            else:
                parts.append(table.ids_of_codes(line_char_codes(text, lower=lower), eos or "\n"))
    return np.concatenate(parts)


def build_text_splits(
    name: str,
    sources: dict[str, Sequence[Source]],
    *,
    level: str = "word",
    lower: bool = False,
    special: Sequence[str] = ("<eos>",),
    eos: str | None = "<eos>",
    unk: str | None = "<unk>",
    count_splits: Sequence[str] = SPLITS,
    min_freq: int = 0,
    max_size: int | None = None,
    errors: str = "strict",
) -> Built:
    """Word- or character-level corpus with given train/valid/test files (PTB, WikiText, ``*-char``).

    Word level is the official ``Vocab.tokenize`` with ``add_eos=True``: ``line.strip().split()`` and
    ``eos`` after each line. Character level is the official ``delimiter=''`` rule: the characters
    of ``line.strip()`` (spaces inside a line are symbols) followed by ``eos``.
    The vocabulary counts ``count_splits``; ``unk`` (when it occurs) receives unknown symbols.
    """
    table = TypeTable()
    ids = {s: _encode(table, srcs, level=level, lower=lower, eos=eos, errors=errors) for s, srcs in sources.items()}
    check_nonempty(name, ids, ", ".join(str(s) for srcs in sources.values() for s in srcs))
    return _finish(
        name,
        table,
        ids,
        [ids[s] for s in count_splits],
        special=special,
        eos=eos,
        unk=unk,
        min_freq=min_freq,
        max_size=max_size,
    )


def build_with_vocab(
    name: str,
    sources: dict[str, Sequence[Source]] | Sequence[Source],
    vocab: Vocab,
    *,
    level: str = "word",
    lower: bool = False,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    errors: str = "strict",
) -> Built:
    """Word- or character-level text encoded with a GIVEN vocabulary (a pretrained model's, to fine-tune it).

    The tokenization is that of :func:`build_text_splits` (``sources`` by split) or :func:`build_user_text` (one
    file list, cut into train / valid / test), each line ended by the vocabulary's ``eos`` (``<eos>`` when it has
    none); a symbol the vocabulary lacks becomes its ``unk`` (a :class:`DataError` without one), and
    ``Built.unknown`` counts those tokens per split.
    """
    if level not in ("word", "char"):
        raise DataError(f"{name}: a given vocabulary encodes word- or char-level text, not {level!r}")
    table = TypeTable()
    eos = vocab.eos or "<eos>"
    if isinstance(sources, dict):
        ids = {s: _encode(table, srcs, level=level, lower=lower, eos=eos, errors=errors) for s, srcs in sources.items()}
        check_nonempty(name, ids, ", ".join(str(s) for srcs in sources.values() for s in srcs))
    else:
        stream = _encode(table, sources, level=level, lower=lower, eos=eos, errors=errors)
        if stream.size == 0:
            raise DataError(f"{name}: the corpus is empty ({', '.join(map(str, sources))})")
        ids = cut_lines(stream, valid_fraction, test_fraction, name, table.index.get(eos))
    missing = np.fromiter((s not in vocab.sym2idx for s in table.symbols), dtype=bool, count=len(table))
    lut = table.lookup_table(vocab, name)
    dtype = smallest_dtype(len(vocab))
    return Built(vocab, {s: lut[a].astype(dtype) for s, a in ids.items()},
                 unknown={s: int(missing[a].sum()) for s, a in ids.items()})


def tail_split(n: int, valid_fraction: float, test_fraction: float, name: str) -> tuple[int, int]:
    """Sizes of the (valid, test) tail of an ``n``-token stream, enwik8-style (test last)."""
    n_valid, n_test = int(n * valid_fraction), int(n * test_fraction)
    if n - n_valid - n_test < 2 or (valid_fraction > 0 and n_valid < 2) or (test_fraction > 0 and n_test < 2):
        raise DataError(f"{name}: corpus too small to split ({n} tokens, fractions {valid_fraction}/{test_fraction})")
    return n_valid, n_test


def cut_lines(arr: np.ndarray, valid_fraction: float, test_fraction: float, name: str,
              boundary: int | None) -> dict[str, np.ndarray]:
    """Cut a stream into train / valid / test (test last) of about the given fractions, each cut moved forward to
    just after the next line end (the token ``boundary``: ``<eos>``, or the newline byte) so that no line is
    split between two parts; without ``boundary`` (a tokenizer without an eos token) the cut is by token."""
    n = int(arr.shape[0])
    n_valid, n_test = tail_split(n, valid_fraction, test_fraction, name)
    if boundary is None:
        return _cut(arr, n_valid, n_test)
    cuts = []
    for pos in (n - n_valid - n_test, n - n_test):
        ends = np.flatnonzero(arr[max(pos - 1, 0):] == boundary)
        cuts.append(min(n, max(pos - 1, 0) + int(ends[0]) + 1) if ends.size else pos)
    a, b = cuts[0], max(cuts[1], cuts[0])
    if a < 2 or b - a < 1 or n - b < 1:
        raise DataError(f"{name}: corpus too small to split at line ends ({n} tokens, fractions "
                        f"{valid_fraction}/{test_fraction}): give train/valid/test files, or more lines")
    return {"train": arr[:a], "valid": arr[a:b], "test": arr[b:]}


def _cut(arr: np.ndarray, n_valid: int, n_test: int) -> dict[str, np.ndarray]:
    n = len(arr)
    return {
        "train": arr[: n - n_valid - n_test],
        "valid": arr[n - n_valid - n_test : n - n_test],
        "test": arr[n - n_test :],
    }


def build_user_text(
    name: str,
    sources: Sequence[Source],
    *,
    level: str = "word",
    lower: bool = False,
    min_freq: int = 0,
    max_size: int | None = None,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    errors: str = "strict",
) -> Built:
    """User text from one file list: the stream is cut into train / valid / test (test last).

    ``level`` is ``word`` (lines split on whitespace + ``<eos>``), ``char`` (characters of stripped
    lines + ``<eos>``) or ``byte`` (raw bytes, id = byte value, newlines kept). The word/char vocabulary
    counts the train part only, with ``<eos>`` and ``<unk>`` first; ``min_freq``/``max_size`` as the
    official ``Vocab``.
    """
    if level == "byte":
        arr = np.frombuffer(b"".join(s.read() for s in sources), dtype=np.uint8)
        if arr.size == 0:
            raise DataError(f"{name}: the corpus is empty ({', '.join(map(str, sources))})")
        return Built(byte_vocab(), cut_lines(arr, valid_fraction, test_fraction, name, ord("\n")))
    if level not in ("word", "char"):
        raise DataError(f"unknown level {level!r}; use word, char or byte")
    table = TypeTable(["<eos>", "<unk>"])
    stream = _encode(table, sources, level=level, lower=lower, eos="<eos>", errors=errors)
    if stream.size == 0:
        raise DataError(f"{name}: the corpus is empty ({', '.join(map(str, sources))})")
    ids = cut_lines(stream, valid_fraction, test_fraction, name, table.index["<eos>"])
    return _finish(
        name,
        table,
        ids,
        [ids["train"]],
        special=("<eos>", "<unk>"),
        eos="<eos>",
        unk="<unk>",
        min_freq=min_freq,
        max_size=max_size,
    )


def build_byte_splits(name: str, sources: dict[str, Sequence[Source]]) -> Built:
    """Byte-level text of given train / valid / test files: id = byte value, newlines kept."""
    ids = {k: np.frombuffer(b"".join(s.read() for s in v), dtype=np.uint8) for k, v in sources.items()}
    check_nonempty(name, ids, ", ".join(str(s) for srcs in sources.values() for s in srcs))
    return Built(byte_vocab(), ids)


def byte_vocab() -> Vocab:
    """The byte-level vocabulary: symbol ``str(b)`` for each byte value ``b``."""
    return Vocab([str(b) for b in range(256)])


def _first_occurrence(arr: np.ndarray, present: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """Index of the first occurrence of every value 0..255 marked in ``present`` (uint8 ``arr``)."""
    first = np.full(256, np.iinfo(np.int64).max, dtype=np.int64)
    todo = int(present.sum())
    for start in range(0, arr.size, block):
        if todo == 0:
            break
        vals, idx = np.unique(arr[start : start + block], return_index=True)
        new = first[vals] == np.iinfo(np.int64).max
        first[vals[new]] = idx[new] + start
        todo -= int(new.sum())
    return first


def _byte_vocab_by_count(parts: dict[str, np.ndarray], symbol_of: Sequence[str]) -> tuple[Vocab, np.ndarray]:
    """Vocabulary of byte values, most frequent first, ties in first-seen order; and the byte -> id table."""
    stream = np.concatenate(list(parts.values()))
    counts = np.bincount(stream, minlength=256)
    first = _first_occurrence(stream, counts > 0)
    order = np.lexsort((first, -counts))
    order = order[counts[order] > 0]
    lut = np.full(256, -1, dtype=np.int64)
    lut[order] = np.arange(order.size)
    return Vocab([symbol_of[b] for b in order.tolist()]), lut


def _split_tail(data: np.ndarray, n_test: int, what: str) -> dict[str, np.ndarray]:
    if n_test < 1 or data.size <= 2 * n_test:
        raise DataError(f"{what}: {data.size} symbols, need more than 2 x {n_test} (valid + test)")
    return {"train": data[: -2 * n_test], "valid": data[-2 * n_test : -n_test], "test": data[-n_test:]}


def build_enwik8(name: str, source: Source, n_test: int = 5_000_000) -> Built:
    """enwik8 as ``prep_enwik8.py`` + ``data_utils.py``: byte level, last 2 x ``n_test`` bytes are valid/test.

    ``prep_enwik8.py`` writes each byte as its decimal value and each newline byte (10) as a line
    break; the corpus reader then strips and splits every line without adding ``<eos>``, so newline
    bytes are *dropped*. The vocabulary is the byte values present (symbol ``str(byte)``), ordered by
    count over all splits: 204 symbols for the real enwik8 (its 205 distinct bytes minus newline).
    """
    arr = np.frombuffer(source.read(), dtype=np.uint8)
    parts = {k: v[v != 10] for k, v in _split_tail(arr, n_test, str(source)).items()}
    check_nonempty(name, parts, str(source))
    vocab, lut = _byte_vocab_by_count(parts, [str(b) for b in range(256)])
    dtype = smallest_dtype(len(vocab))
    return Built(vocab, {k: lut[v].astype(dtype) for k, v in parts.items()})


def build_text8(name: str, source: Source, n_test: int = 5_000_000) -> Built:
    """text8 as ``prep_text8.py`` + ``data_utils.py``: characters, last 2 x ``n_test`` are valid/test.

    Each part is ``strip()``-ped, spaces become ``_`` and every other character is a symbol (other
    whitespace would be split away). 27 symbols for the real text8 (``a``-``z`` and ``_``).
    """
    raw = source.read()
    arr = np.frombuffer(raw, dtype=np.uint8)
    if arr.size and arr.max() >= 128:
        off = int(np.flatnonzero(arr >= 128)[0])
        decode_utf8(raw[off : off + 4], str(source), off)  # a clear error if not UTF-8 at all
        raise DataError(f"{source}: not text8 (non-ASCII byte at offset {off}; text8 is a-z and space)")
    is_ws = np.zeros(256, dtype=bool)
    is_ws[list(ASCII_WHITESPACE)] = True
    parts = {}
    for split, part in _split_tail(arr, n_test, str(source)).items():
        keep = np.flatnonzero(~is_ws[part])
        part = part[keep[0] : keep[-1] + 1] if keep.size else part[:0]  # str.strip()
        parts[split] = part[(part == 32) | ~is_ws[part]]
    check_nonempty(name, parts, str(source))
    symbols = ["_" if b == 32 else chr(b) for b in range(256)]
    vocab, lut = _byte_vocab_by_count(parts, symbols)
    dtype = smallest_dtype(len(vocab))
    return Built(vocab, {k: lut[v].astype(dtype) for k, v in parts.items()})


def build_lm1b(name: str, sources: dict[str, Sequence[Source]], vocab_file: Path, errors: str = "strict") -> Built:
    """One Billion Word: vocabulary from ``1b_word_vocab.txt`` (unknown -> ``<UNK>``), each sentence
    encoded ``<S> w1 .. wn <S>`` (official ``add_double_eos``), no lower-casing.

    Extras: ``{split}.sent_offsets`` (sentence boundaries, ``n+1``) and ``train.file_offsets``
    (sentence index where each training shard starts, ``n_files+1``) for the sentence iterators.
    """
    vocab = Vocab.from_symbol_file(vocab_file, unk="<UNK>")
    if "<S>" not in vocab:
        raise DataError(f"{vocab_file}: vocabulary file has no <S> symbol")
    dtype = smallest_dtype(len(vocab))
    splits: dict[str, np.ndarray] = {}
    extras: dict[str, np.ndarray] = {}
    for split, srcs in sources.items():
        ids: list[np.ndarray] = [np.zeros(0, dtype=dtype)]
        lengths: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
        file_starts = [0]
        for src in srcs:
            n_sent = 0
            for text in iter_text_chunks(src.read(), str(src), errors):
                tok, lens = sentence_ids(text, vocab, "<S>")
                ids.append(tok.astype(dtype))
                lengths.append(lens)
                n_sent += lens.size
            file_starts.append(file_starts[-1] + n_sent)
        splits[split] = np.concatenate(ids)
        extras[f"{split}.sent_offsets"] = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
        if split == "train":
            extras["train.file_offsets"] = np.asarray(file_starts, dtype=np.int64)
    check_nonempty(name, splits, ", ".join(str(s) for srcs in sources.values() for s in srcs))
    return Built(vocab, splits, extras)
