"""Test-only files of the official TensorFlow code's kind:

* the tiny checkpoint that code wrote (``tests/assets/tf_tiny``, written by ``tests/equivalence/tf_oracle.py`` with
  the spec in its ``tf_nll.json``; Adam's slots and ``global_step`` beside the model);
* ``cache.pkl`` files written opcode by opcode as Python 2.7's ``pickle.dump(corpus, f, protocol=2)`` writes the
  official ``tf/data_utils.py`` ``Corpus`` (byte strings as ``SHORT_BINSTRING``/``BINSTRING``, numpy arrays through
  ``numpy.core.multiarray._reconstruct``).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import torch

from tests.helpers import REPO

TF_TINY = REPO / "tests" / "assets" / "tf_tiny"


def tf_tiny(dest: Path) -> Path:
    """A copy of the released layout ``dest/{model,data}`` of the tiny TF checkpoint (tests may damage it)."""
    shutil.copytree(TF_TINY, dest)
    return dest


def tf_golden() -> tuple[dict, np.ndarray]:
    """The spec the tiny checkpoint was made with and TensorFlow's per-token NLL ``[n_seg, tgt_len, bsz]``."""
    doc = json.loads((TF_TINY / "tf_nll.json").read_text())
    return doc["spec"], np.array(doc["nll"])


def segment_nll(model, spec: dict) -> np.ndarray:
    """txl's per-token NLL ``[n_seg, tgt_len, bsz]`` of an oracle spec's stream ``ids [N, bsz]``, read segment by
    segment with the memory carried over and the spec's lengths (as the TF driver evaluates it)."""
    ids = torch.tensor(spec["ids"]).t()  # [B, N]
    lengths = model.config.lengths(mem_len=spec["mem_len"], clamp_len=spec["clamp_len"],
                                   same_length=spec["same_length"])
    t, mems, out = spec["tgt_len"], None, []
    with torch.no_grad():
        for s in range(spec["segments"]):
            res = model(ids[:, s * t:(s + 1) * t], ids[:, s * t + 1:(s + 1) * t + 1], mems, lengths=lengths)
            mems = res.mems
            out.append(res.nll.t().numpy())
    return np.array(out)


def _str(b: bytes) -> bytes:
    return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<i", len(b)) + b)


def _int(i: int) -> bytes:
    return b"K" + bytes([i]) if 0 <= i < 256 else b"J" + struct.pack("<i", i)


def _array(values: np.ndarray) -> bytes:
    """A 1-d int64 array as numpy under Python 2 pickles it (protocol 2)."""
    dtype = b"cnumpy\ndtype\n" + _str(b"i8") + _int(0) + _int(1) + b"\x87R" + b"(" + _int(3) + _str(b"<") + \
        b"NNN" + _int(-1) + _int(-1) + _int(0) + b"tb"
    head = b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _int(0) + b"\x85" + _str(b"b") + b"\x87R"
    state = b"(" + _int(1) + _int(len(values)) + b"\x85" + dtype + b"\x89" + _str(values.astype("<i8").tobytes()) + b"t"
    return head + state + b"b"


def _object(module: bytes, name: bytes, fields: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(_str(k) + v for k, v in fields)
    return b"c" + module + b"\n" + name + b"\n" + b")\x81" + b"}(" + body + b"ub"


def py2_cache_pkl(symbols: list[str], *, dataset: str = "wt103", special: tuple[str, ...] = ("<eos>",)) -> bytes:
    """The ``cache.pkl`` of a ``Corpus`` whose vocabulary is ``symbols`` (in id order), as Python 2.7 wrote it."""
    enc = [s.encode("utf-8") for s in symbols]
    idx2sym = b"](" + b"".join(_str(s) for s in enc) + b"e"
    sym2idx = b"ccollections\nOrderedDict\n)R(" + b"".join(_str(s) + _int(i) for i, s in enumerate(enc)) + b"u"
    counter = b"ccollections\nCounter\n}(" + b"".join(_str(s) + _int(len(enc) - i) for i, s in enumerate(enc)) + \
        b"u\x85R"
    vocab = _object(b"vocabulary", b"Vocab", [
        (b"special", b"](" + b"".join(_str(s.encode()) for s in special) + b"e"), (b"min_freq", _int(0)),
        (b"max_size", b"N"), (b"lower_case", b"\x89"), (b"delimiter", b"N"), (b"vocab_file", b"N"),
        (b"counter", counter), (b"idx2sym", idx2sym), (b"sym2idx", sym2idx)])
    ids = np.arange(len(symbols)) % max(1, len(symbols))
    corpus = _object(b"__main__", b"Corpus", [
        (b"dataset", _str(dataset.encode())), (b"vocab", vocab), (b"train", _array(np.tile(ids, 50))),
        (b"valid", _array(ids)), (b"test", _array(ids)), (b"cutoffs", b"](" + _int(0) + _int(len(symbols)) + b"e")])
    return b"\x80\x02" + corpus + b"."


def hostile_pkl(marker: Path) -> bytes:
    """A ``cache.pkl`` that, unpickled, runs ``touch MARKER`` (``os.system``) where the corpus would be."""
    return b"\x80\x02cos\nsystem\n" + _str(f"touch {marker}".encode()) + b"\x85R."
