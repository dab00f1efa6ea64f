"""A controlled long-range corpus: random text in which some spans are exact copies of the text a given distance
back, so that they are predictable only by a model that can read that far (issue 23; paper Sec. 3.2).

Generation (:func:`generate`, seeded and deterministic: ``numpy.random.default_rng(seed)`` per split, seeded
``seed + split index``):

* every token not in a copy is drawn uniformly from ``filler`` (default: the ``alphabet``, i.e. random letters, so
  the only structure of the text is the copies);
* *copy spans* are laid out left to right: after a gap drawn uniformly from ``0 .. 2 * mean_gap`` a span of length
  ``S`` (drawn from ``span_lens``) at distance ``D`` (drawn from ``distances``) starts at position ``a``; its
  *source* ``[a - D, a - D + S)`` is written with random letters of ``alphabet`` and ``x[t] = x[t - D]`` for every
  ``t`` in ``[a, a + S)``. ``mean_gap`` is chosen so that about ``density`` of the tokens are copies;
* a source never overlaps another span's source or copy (a span is dropped when it would), so every copy is
  predictable from exactly its own distance back and from nothing nearer (except by chance).

The text of a split is one line of characters (no newline), so the character-level reading of a written folder
(``txl train --dataset FOLDER --level char``: the characters of the stripped line, then ``<eos>``) puts the
``i``-th character at token position ``i``: the span table in ``long-range.json`` (``start, length, distance`` per
span) indexes token positions of that reading as well as of :meth:`LongRangeText.corpus`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl.data.builders import SPLITS
from transformer_xl.data.corpus import Corpus
from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import ConfigError, DataError

METADATA = "long-range.json"
DEFAULT_ALPHABET = "abcdefghijklmnop"


@dataclass(frozen=True)
class LongRangeSpec:
    """Parameters of the corpus (module docstring); ``tokens`` per split. The defaults are the setting whose copies
    a 19 k-parameter model learns in every seed tried (docs/long-context.md: 16 letters, one distance, density 0.7;
    with 4 letters, or several distances mixed, most seeds stayed at the uniform guess)."""

    distances: tuple[int, ...] = (20,)
    span_lens: tuple[int, ...] = (8,)
    alphabet: str = DEFAULT_ALPHABET
    filler: str | None = None  # None: the alphabet
    density: float = 0.7  # aimed at; spans whose source would overlap are dropped, so fewer are copies
    tokens: dict[str, int] = field(default_factory=lambda: {"train": 100_000, "valid": 10_000, "test": 10_000})
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.distances or any(not isinstance(d, int) or d < 1 for d in self.distances):
            raise ConfigError(f"distances must be integers >= 1, got {list(self.distances)}")
        if not self.span_lens or any(not isinstance(s, int) or s < 1 for s in self.span_lens):
            raise ConfigError(f"span lengths must be integers >= 1, got {list(self.span_lens)}")
        if max(self.span_lens) > min(self.distances):
            raise ConfigError(f"a span ({max(self.span_lens)}) longer than a distance ({min(self.distances)}) would "
                              "overlap its own source")
        for what, chars in (("alphabet", self.alphabet), ("filler", self.symbols_filler)):
            if len(set(chars)) < 2 or len(set(chars)) != len(chars) or any(c.isspace() for c in chars):
                raise ConfigError(f"the {what} must be >= 2 distinct non-space characters, got {chars!r}")
        if not 0 < self.density < 1:
            raise ConfigError(f"density must be in (0, 1), got {self.density}")
        if set(self.tokens) != set(SPLITS) or any(n < 1 for n in self.tokens.values()):
            raise ConfigError(f"tokens must give train, valid and test sizes >= 1, got {self.tokens}")

    @property
    def symbols_filler(self) -> str:
        return self.alphabet if self.filler is None else self.filler

    @property
    def symbols(self) -> list[str]:
        """The vocabulary: the alphabet's characters, then the filler's not in it."""
        return list(dict.fromkeys(self.alphabet + self.symbols_filler))

    @property
    def mean_gap(self) -> float:
        """The mean filler gap between copies for about ``density`` of the tokens in copies."""
        return float(np.mean(self.span_lens)) * (1 - self.density) / self.density

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(distances=list(self.distances), span_lens=list(self.span_lens))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LongRangeSpec:
        return cls(distances=tuple(d["distances"]), span_lens=tuple(d["span_lens"]), alphabet=d["alphabet"],
                   filler=d["filler"], density=d["density"], tokens=dict(d["tokens"]), seed=d["seed"])


@dataclass
class LongRangeText:
    """The generated splits: token ids (indices into :attr:`LongRangeSpec.symbols`) and the span table per split
    (``[n, 3]``: start, length, distance)."""

    spec: LongRangeSpec
    ids: dict[str, np.ndarray]
    spans: dict[str, np.ndarray]

    def text(self, split: str) -> str:
        return "".join(np.asarray(self.spec.symbols)[self.ids[split]])

    def corpus(self, name: str = "long-range") -> Corpus:
        """An in-memory character-level :class:`Corpus` (no cache on disk)."""
        return Corpus.from_arrays(name, self.ids, vocab=Vocab(self.spec.symbols), char_level=True)

    def write(self, folder: str | Path) -> Path:
        """``train.txt``, ``valid.txt``, ``test.txt`` (one line each) and ``long-range.json`` (spec and spans)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            (out / f"{split}.txt").write_text(self.text(split) + "\n", encoding="utf-8")
        doc = {"spec": self.spec.to_dict(), "columns": ["start", "length", "distance"],
               "positions": "token positions of the character-level reading (the i-th character is token i)",
               "spans": {s: self.spans[s].tolist() for s in SPLITS}}
        (out / METADATA).write_text(json.dumps(doc) + "\n", encoding="utf-8")
        return out


def _split(spec: LongRangeSpec, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n_alpha = len(spec.alphabet)
    lut = {c: i for i, c in enumerate(spec.symbols)}
    filler = np.array([lut[c] for c in spec.symbols_filler])
    ids = filler[rng.integers(0, len(filler), n)]
    taken = np.zeros(n, dtype=bool)  # sources and copies laid out so far
    spans = []
    pos = 0
    while True:
        gap = int(rng.integers(0, int(2 * spec.mean_gap) + 1))
        length = int(rng.choice(spec.span_lens))
        dist = int(rng.choice(spec.distances))
        a = pos + gap
        if a + length > n:
            break
        src = a - dist
        if src >= 0 and not taken[src : src + length].any() and not taken[a : a + length].any():
            ids[src : src + length] = rng.integers(0, n_alpha, length)  # the alphabet's ids come first
            ids[a : a + length] = ids[src : src + length]
            taken[src : src + length] = taken[a : a + length] = True
            spans.append((a, length, dist))
        pos = a + length
    return ids.astype(np.uint8 if len(spec.symbols) < 256 else np.int32), np.array(spans, dtype=np.int64).reshape(-1, 3)


def generate(spec: LongRangeSpec) -> LongRangeText:
    """The corpus of ``spec`` (module docstring); the same ``spec`` gives the same text."""
    ids, spans = {}, {}
    for k, split in enumerate(SPLITS):
        ids[split], spans[split] = _split(spec, spec.tokens[split], np.random.default_rng(spec.seed + k))
    return LongRangeText(spec, ids, spans)


def read_spans(folder: str | Path) -> tuple[LongRangeSpec, dict[str, np.ndarray]]:
    """The spec and span tables of a folder written by :meth:`LongRangeText.write`."""
    path = Path(folder) / METADATA
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        spans = {s: np.asarray(doc["spans"][s], dtype=np.int64).reshape(-1, 3) for s in SPLITS}
        return LongRangeSpec.from_dict(doc["spec"]), spans
    except FileNotFoundError:
        raise DataError(f"{path} not found: not a folder written by `txl data generate long-range`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is unreadable ({e})") from None


def span_positions(spans: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token position of a split of ``n`` tokens: the distance of the copy it belongs to (0: not in a copy)
    and its offset inside that copy (-1: not in a copy)."""
    dist = np.zeros(n, dtype=np.int64)
    offset = np.full(n, -1, dtype=np.int64)
    for start, length, d in np.asarray(spans).reshape(-1, 3):
        if start + length > n:
            raise DataError(f"a span [{start}, {start + length}) lies beyond the {n} tokens")
        dist[start : start + length] = d
        offset[start : start + length] = np.arange(length)
    return dist, offset


def parse_spec(distances: Sequence[int] | None = None, span_lens: Sequence[int] | None = None,
               **kw: Any) -> LongRangeSpec:
    """A spec from optional parts (None keeps the default)."""
    over: dict[str, Any] = {k: v for k, v in kw.items() if v is not None}
    if distances is not None:
        over["distances"] = tuple(distances)
    if span_lens is not None:
        over["span_lens"] = tuple(span_lens)
    return LongRangeSpec(**over)
