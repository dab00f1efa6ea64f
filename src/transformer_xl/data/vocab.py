"""Vocabulary: symbols <-> ids, built with the official Transformer-XL ordering rules, stored as JSON."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from transformer_xl.errors import DataError
from transformer_xl.store.files import write_text

VOCAB_FORMAT = "txl-vocab"
VOCAB_VERSION = 1


class Vocab:
    """An ordered symbol table.

    ``eos`` and ``unk`` name the end-of-line and unknown symbols when the corpus has them; unknown
    symbols are mapped to ``unk`` when it exists and rejected otherwise (as the official code does).
    """

    def __init__(
        self,
        symbols: Sequence[str],
        *,
        special: Sequence[str] = (),
        eos: str | None = None,
        unk: str | None = None,
    ) -> None:
        self.idx2sym: list[str] = list(symbols)
        self.sym2idx: dict[str, int] = {s: i for i, s in enumerate(self.idx2sym)}
        if len(self.sym2idx) != len(self.idx2sym):
            raise DataError("vocabulary has duplicate symbols")
        self.special = list(special)
        self.eos = eos if eos in self.sym2idx else None
        self.unk = unk if unk in self.sym2idx else None

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_counts(
        cls,
        symbols: Sequence[str],
        counts: np.ndarray,
        *,
        special: Sequence[str] = (),
        min_freq: int = 0,
        max_size: int | None = None,
        eos: str | None = None,
        unk: str | None = None,
    ) -> Vocab:
        """Official rule: ``special`` first, then ``Counter.most_common(max_size)``, stop below ``min_freq``.

        ``symbols`` must be in first-seen order and ``counts[i]`` is the count of ``symbols[i]``; a stable
        sort by descending count then reproduces ``most_common``'s tie order (first seen first).
        Symbols with count 0 were never counted and are left out.
        """
        counts = np.asarray(counts, dtype=np.int64)
        order = np.argsort(-counts, kind="stable")
        order = order[counts[order] > 0]
        if max_size is not None:
            order = order[:max_size]
        order = order[counts[order] >= min_freq]
        out = list(dict.fromkeys(special))
        seen = set(out)
        out.extend(s for s in (symbols[i] for i in order.tolist()) if s not in seen)
        return cls(out, special=special, eos=eos, unk=unk)

    @classmethod
    def from_symbol_file(cls, path: Path, unk: str = "<UNK>") -> Vocab:
        """A vocabulary file with one symbol per line (first whitespace field), as ``1b_word_vocab.txt``."""
        from transformer_xl.data.rawtext import decode_utf8, read_bytes

        text = decode_utf8(read_bytes(path), str(path))
        symbols = [line.split()[0] for line in text.splitlines() if line.strip()]
        symbols = list(dict.fromkeys(symbols))
        if unk not in symbols:
            raise DataError(f"{path}: vocabulary file has no {unk} symbol")
        return cls(symbols, unk=unk)

    # -- lookup ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.idx2sym)

    def __contains__(self, sym: object) -> bool:
        return sym in self.sym2idx

    @property
    def eos_idx(self) -> int | None:
        """Id of the end-of-line symbol, or ``None``."""
        return None if self.eos is None else self.sym2idx[self.eos]

    @property
    def unk_idx(self) -> int | None:
        """Id of the unknown symbol, or ``None``."""
        return None if self.unk is None else self.sym2idx[self.unk]

    def encode(self, symbols: Iterable[str]) -> np.ndarray:
        """Ids of ``symbols`` (unknown ones become ``unk``, or raise :class:`DataError` without one)."""
        symbols = list(symbols)
        unk = self.unk_idx
        if unk is None:
            missing = next((s for s in symbols if s not in self.sym2idx), None)
            if missing is not None:
                raise DataError(f"symbol {missing!r} is not in the vocabulary and it has no unknown symbol")
            return np.fromiter(map(self.sym2idx.__getitem__, symbols), dtype=np.int64, count=len(symbols))
        return np.fromiter(map(self.sym2idx.get, symbols, [unk] * len(symbols)), np.int64, len(symbols))

    def decode(self, ids: Iterable[int] | np.ndarray) -> list[str]:
        """Symbols of ``ids``."""
        arr = np.asarray(ids, dtype=np.int64).ravel()
        if arr.size and (arr.min() < 0 or arr.max() >= len(self)):
            raise DataError(f"id out of range for a vocabulary of {len(self)} symbols")
        table = self.idx2sym
        return [table[i] for i in arr.tolist()]

    # -- storage --------------------------------------------------------------------------------
    def to_json(self) -> str:
        """Canonical JSON text (what :meth:`sha256` hashes)."""
        obj = {
            "format": VOCAB_FORMAT,
            "version": VOCAB_VERSION,
            "special": self.special,
            "eos": self.eos,
            "unk": self.unk,
            "symbols": self.idx2sym,
        }
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        """Inverse of :meth:`to_json`."""
        try:
            obj = json.loads(text)
            if obj.get("format") != VOCAB_FORMAT:
                raise ValueError("not a txl vocabulary")
            symbols, special = obj["symbols"], obj.get("special", [])
            for what, names in (("symbols", symbols), ("special", special)):
                if not isinstance(names, list) or not all(isinstance(s, str) for s in names):
                    raise ValueError(f"{what} must be a list of strings")
            if not all(obj.get(k) is None or isinstance(obj[k], str) for k in ("eos", "unk")):
                raise ValueError("eos and unk must be strings or null")
            return cls(obj["symbols"], special=obj.get("special", ()), eos=obj.get("eos"), unk=obj.get("unk"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"invalid vocabulary JSON ({exc})") from None

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` (UTF-8, atomically)."""
        write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Read a vocabulary written by :meth:`save`."""
        try:
            return cls.from_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read vocabulary {path}: {exc}") from None

    def sha256(self) -> str:
        """SHA-256 of the canonical JSON: identifies the vocabulary in manifests."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, eos={self.eos!r}, unk={self.unk!r})"


def smallest_dtype(n_symbols: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds ids ``0 .. n_symbols-1``."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if n_symbols - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)
