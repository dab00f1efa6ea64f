"""The vocabulary of a released TensorFlow model's ``data/`` folder, read without running code.

``tf/data_utils.py`` of the official code (run under Python 2.7, protocol 2) pickles its whole ``Corpus`` as
``data/cache.pkl``: ``__main__.Corpus`` with ``dataset``, ``vocab`` (a ``vocabulary.Vocab``: ``idx2sym``, ``sym2idx``,
``counter``, ``special``, ...), ``train``/``valid``/``test`` (numpy arrays, or for One Billion Word a list of file
names) and ``cutoffs``; and writes ``data/corpus-info.json`` (``vocab_size``, ``cutoffs``, ``dataset``).

Unpickling that file with :mod:`pickle` would run whatever it names. It is read with
:class:`~transformer_xl.interop.hf_vocab.RestrictedUnpickler`'s rules plus three stand-ins that run nothing:
``Corpus`` and ``Vocab`` load as plain records of their attributes, and numpy's array and dtype constructors as inert
placeholders (the token arrays are not needed: txl prepares its own data). Any other global (``os.system``,
``builtins.eval``, any class) is refused in one line. Python 2's byte strings are read as bytes and the symbols decoded
as UTF-8.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import CheckpointError
from transformer_xl.interop.hf_vocab import Inert, RestrictedUnpickler, vocab_from_hf_dict
from transformer_xl.safejson import read_object

#: The classes ``tf/data_utils.py`` pickles, by the module names they have in ``cache.pkl``.
RECORDS = {("__main__", "Corpus"), ("data_utils", "Corpus"), ("vocabulary", "Vocab"), ("__main__", "Vocab")}
#: numpy's reconstructors: loaded as inert placeholders (the token arrays are skipped).
ARRAYS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
          ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
          ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class Record:
    """A pickled object of :data:`RECORDS`: its attributes only (``__setstate__`` stores them, runs nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.state: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = state[0]
        self.state = {_text(k): v for k, v in state.items()} if isinstance(state, dict) else {}


class _CacheUnpickler(RestrictedUnpickler):
    def __init__(self, file: io.BufferedIOBase, *, source: str) -> None:
        super().__init__(file, source=source, encoding="bytes")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in RECORDS:
            return type(name, (Record,), {})
        if (module, name) in ARRAYS:
            return type(name, (Inert,), {})
        return super().find_class(module, name)


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"a symbol or name is not UTF-8: {value[:40]!r}") from None
    return value


def _plain(value: Any) -> Any:
    """Python 2 byte strings as text, in lists, tuples and dicts (recursively)."""
    if isinstance(value, bytes):
        return _text(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def read_corpus_vocab(path: str | Path) -> tuple[Vocab, str | None]:
    """``(vocabulary, dataset name or None)`` of a ``cache.pkl`` written by the official ``tf/data_utils.py``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            corpus = _CacheUnpickler(f, source=str(path)).load()
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # a damaged pickle fails in any of a dozen ways
        raise CheckpointError(f"{path} is not a readable pickle ({type(exc).__name__}: {exc})"[:300]) from None
    if not isinstance(corpus, Record) or not isinstance(corpus.state.get("vocab"), Record):
        raise CheckpointError(f"{path} does not hold the official code's Corpus with a Vocab (found "
                              f"{type(corpus).__name__})")
    fields = {k: _plain(v) for k, v in corpus.state["vocab"].state.items() if k in ("idx2sym", "sym2idx", "special",
                                                                                    "unk_idx")}
    dataset = _plain(corpus.state.get("dataset"))
    return vocab_from_hf_dict(fields, source=str(path)), dataset if isinstance(dataset, str) else None


def read_corpus_info(path: str | Path) -> dict[str, Any]:
    """``corpus-info.json``: ``vocab_size`` (int), ``cutoffs`` (with 0 and the vocabulary size at its ends) and
    ``dataset``, checked; one-line :class:`CheckpointError` otherwise."""
    doc = read_object(Path(path), "corpus-info.json", error=CheckpointError)
    size, cutoffs, dataset = doc.get("vocab_size"), doc.get("cutoffs", []), doc.get("dataset")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise CheckpointError(f"{path}: vocab_size must be a positive integer, got {size!r}"[:200])
    if not isinstance(cutoffs, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cutoffs):
        raise CheckpointError(f"{path}: cutoffs must be a list of integers"[:200])
    if dataset is not None and not isinstance(dataset, str):
        raise CheckpointError(f"{path}: dataset must be a name"[:200])
    return {"vocab_size": size, "cutoffs": [c for c in cutoffs if 0 < c < size], "dataset": dataset}
