"""Hugging Face TransfoXL vocabularies (``vocab.pkl`` / ``vocab.bin``) read without running code.

``TransfoXLTokenizer.save_vocabulary`` pickles the tokenizer's ``__dict__``: ``idx2sym`` (list of str),
``sym2idx`` (``OrderedDict`` str -> int), ``counter`` (``collections.Counter``), ``special``,
``min_freq``, ``max_size``, ``lower_case``, ``delimiter``, ``vocab_file``, ``never_split``, ``unk_idx``,
``eos_idx``, ... The published ``transfo-xl-wt103`` file predates that: ``pytorch-pretrained-bert`` wrote
the same dict with ``torch.save`` in torch's legacy format (several pickles in a row, the first being a
magic number), which is why Hugging Face's loader falls back to ``torch.load`` when ``pickle.load`` returns an
int. Unpickling either with :mod:`pickle` would execute whatever the file names (the reason Hugging Face
removed the model), so this module uses :class:`RestrictedUnpickler`:

* allowed: the pickle opcodes for ``None``/bool/int/float/str/bytes/list/tuple/dict/set, plus exactly
  ``collections.Counter``, ``collections.OrderedDict`` and ``builtins.set``/``frozenset`` (and their
  Python 2 names);
* made inert: objects that newer transformers releases leave in the dict and a vocabulary never needs
  (``re._compile`` patterns, ``sacremoses`` tokenizer objects, ``copyreg._reconstructor``): they load as
  :class:`Inert` placeholders whose construction runs nothing;
* refused: every other global (``os.system``, ``builtins.eval``, ``torch._utils...``, any class) and every
  persistent id, with a :class:`~transformer_xl.errors.CheckpointError` naming it. Nothing in the file is executed.

Torch's zip format (``torch.save`` since 1.6) is read the same way from its ``data.pkl`` member.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import CheckpointError

#: File names a Hugging Face TransfoXL directory may hold its vocabulary in, in order of preference.
HF_VOCAB_NAMES = ("vocab.pkl", "vocab.bin")
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER

_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "Counter"): Counter,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
}
_INERT_NAMES = {("re", "_compile"), ("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor")}
_INERT_MODULES = ("sacremoses",)


class Inert:
    """Stand-in for an object a vocabulary does not need; building it runs no code of the file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<inert {type(self).__name__}>"


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only the globals of the module docstring."""

    def __init__(self, file: io.BufferedIOBase, *, source: str = "pickle", encoding: str = "utf-8") -> None:
        super().__init__(file, encoding=encoding)  # encoding: of Python 2's byte strings ("bytes" keeps them bytes)
        self.source = source
        self.inert: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if (module, name) in _INERT_NAMES or module.split(".")[0] in _INERT_MODULES:
            self.inert.add(f"{module}.{name}")
            return type(name, (Inert,), {})
        raise CheckpointError(
            f"{self.source} refers to {module}.{name}, which a vocabulary does not need; txl reads only plain "
            "containers, strings and numbers from pickles and refuses to run code from a file"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(f"{self.source} holds tensors or storages (persistent id {str(pid)[:40]!r}); "
                              "a vocabulary has none, refusing")


def restricted_loads(data: bytes, *, source: str = "pickle") -> Any:
    """Unpickle one object of ``data`` with :class:`RestrictedUnpickler`."""
    return _load_all(data, source)[0]


def _load_all(data: bytes, source: str, limit: int = 4) -> list[Any]:
    """The first ``limit`` pickles stored back to back in ``data`` (torch's legacy format has several)."""
    buf = io.BytesIO(data)
    out = []
    try:
        while len(out) < limit and buf.tell() < len(data):
            out.append(RestrictedUnpickler(buf, source=source).load())
    except CheckpointError:
        raise
    except Exception as exc:  # malformed or truncated pickle: any of a dozen exception types
        if out and out[0] == TORCH_LEGACY_MAGIC and len(out) >= 4:
            return out
        raise CheckpointError(f"{source} is not a readable pickle ({type(exc).__name__}: {exc})") from None
    return out


def read_hf_vocab_dict(path: str | Path) -> dict[str, Any]:
    """The tokenizer dict of a Hugging Face TransfoXL ``vocab.pkl``/``vocab.bin`` (plain pickle, torch's
    legacy format or torch's zip format), read with :class:`RestrictedUnpickler`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    source = str(path)
    if data[:4] == b"PK\x03\x04":  # torch zip format: the object is the member */data.pkl
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                member = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
                if member is None:
                    raise CheckpointError(f"{path} is a zip file without a data.pkl member")
                obj = restricted_loads(zf.read(member), source=source)
        except zipfile.BadZipFile as exc:
            raise CheckpointError(f"{path} is not a readable zip file ({exc})") from None
    else:
        objs = _load_all(data, source)
        obj = objs[0]
        if isinstance(obj, int) and obj == TORCH_LEGACY_MAGIC:  # magic, protocol, sys_info, object
            if len(objs) < 4:
                raise CheckpointError(f"{path} is a truncated torch legacy file")
            obj = objs[3]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} does not hold a TransfoXL tokenizer dict (found {type(obj).__name__})")
    return obj


def vocab_from_hf_dict(d: dict[str, Any], *, source: str = "vocabulary") -> Vocab:
    """Our :class:`Vocab` from a TransfoXL tokenizer dict (``idx2sym``, else ``sym2idx`` ordered by id)."""
    symbols = d.get("idx2sym")
    if symbols is None and isinstance(d.get("sym2idx"), dict):
        pairs = sorted(d["sym2idx"].items(), key=lambda kv: kv[1])
        if [i for _, i in pairs] != list(range(len(pairs))):
            raise CheckpointError(f"{source}: sym2idx ids are not 0..n-1")
        symbols = [s for s, _ in pairs]
    if not isinstance(symbols, (list, tuple)) or not symbols or not all(isinstance(s, str) for s in symbols):
        raise CheckpointError(f"{source}: no idx2sym list of strings (keys: {', '.join(sorted(map(str, d))[:12])})")
    sym2idx = d.get("sym2idx")
    if isinstance(sym2idx, dict) and any(sym2idx.get(s) != i for i, s in enumerate(symbols)):
        raise CheckpointError(f"{source}: idx2sym and sym2idx disagree")
    special = [s for s in (d.get("special") or []) if isinstance(s, str) and s in symbols]
    eos = next((s for s in ("<eos>", "<EOS>", "</s>", "<S>") if s in symbols), None)
    unk = None
    unk_idx = d.get("unk_idx")
    if isinstance(unk_idx, int) and not isinstance(unk_idx, bool) and 0 <= unk_idx < len(symbols):
        unk = symbols[unk_idx]
    unk = unk or next((s for s in ("<unk>", "<UNK>") if s in symbols), None)
    try:
        return Vocab(list(symbols), special=special, eos=eos, unk=unk)
    except Exception as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def load_hf_vocab(path: str | Path) -> Vocab:
    """Read a Hugging Face TransfoXL vocabulary: a pickled ``vocab.pkl``/``vocab.bin`` (without running code), or
    the ``vocab.txt`` + ``tokenizer_config.json`` that ``txl convert --to hf`` writes; a directory: the first of
    them it holds (:func:`find_hf_vocab`)."""
    path = Path(path)
    if path.is_dir():
        found = find_hf_vocab(path)
        if found is None:
            raise CheckpointError(f"no {' or '.join((*HF_VOCAB_NAMES, HF_TOKENIZER_FILES[0]))} in {path}")
        path = found
    if path.name == HF_TOKENIZER_FILES[0]:
        return _vocab_from_tokenizer_files(path)
    return vocab_from_hf_dict(read_hf_vocab_dict(path), source=str(path))


def find_hf_vocab(directory: str | Path) -> Path | None:
    """The vocabulary file of a Hugging Face TransfoXL directory (a pickled one first, then ``vocab.txt`` with its
    ``tokenizer_config.json``), or None."""
    for name in HF_VOCAB_NAMES:
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    txt, cfg = (Path(directory) / n for n in HF_TOKENIZER_FILES[:2])
    return txt if txt.is_file() and cfg.is_file() else None


def _vocab_from_tokenizer_files(path: Path) -> Vocab:
    """The vocabulary of a ``vocab.txt`` (one symbol a line) and the ``tokenizer_config.json`` beside it."""
    from transformer_xl.store.files import read_json

    try:
        symbols = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {path} ({exc})") from None
    cfg = read_json(path.parent / HF_TOKENIZER_FILES[1], error=CheckpointError)
    unk = cfg.get("unk_token")
    return vocab_from_hf_dict({"idx2sym": symbols, "special": cfg.get("special") or [],
                               "unk_idx": symbols.index(unk) if unk in symbols else None}, source=str(path))


# ---------------------------------------------------------------------------------------------- writing, without pickle
#: What ``txl convert --to hf`` writes for ``TransfoXLTokenizer.from_pretrained``: its ``vocab_file`` (one symbol
#: a line, read by ``_build_from_file``), its constructor arguments, and its special tokens.
HF_TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")

#: Pieces of pre-tokenized WikiText that the Moses tokenizer inside ``TransfoXLTokenizer`` would split again:
#: the joiners ``@-@ @,@ @.@`` and clitics standing alone (`` 's``, `` n't``). Moses takes them as
#: ``protected_patterns`` (the tokenizer's ``never_split``); a clitic's pattern includes the space before it,
#: so it is only protected where it already stands alone, and ``game's`` still becomes ``game 's``.
WIKITEXT_PROTECTED = (r"@[-,.]@", r"\s(?:'s|'re|'ve|'ll|'d|'m|'t|n't)(?=\s|$)")


def hf_tokenizer_refusal(vocab: Vocab) -> str | None:
    """Why ``TransfoXLTokenizer`` cannot read ``vocab`` from a ``vocab.txt``, or None when it can: it reads
    word-level vocabularies whose symbols hold no whitespace and whose unknown symbol is ``<unk>``/``<UNK>``."""
    from transformer_xl.data.codec import detect_level

    level = detect_level(vocab)
    if level != "word":
        return f"the vocabulary is {level}-level and TransfoXLTokenizer splits text into words"
    bad = next((s for s in vocab.idx2sym if not s or s != s.strip() or len(s.split()) != 1), None)
    if bad is not None:
        return f"the vocabulary has the symbol {bad!r}, which a one-symbol-a-line vocab.txt cannot hold"
    hf_unk = "<UNK>" if "<UNK>" in vocab else "<unk>" if "<unk>" in vocab else None
    if vocab.unk is None or vocab.unk != hf_unk:
        return (f"TransfoXLTokenizer maps unknown words to {hf_unk or '<unk> or <UNK>'}, the vocabulary's unknown "
                f"symbol is {vocab.unk}")
    return None


def hf_tokenizer_files(vocab: Vocab) -> dict[str, str]:
    """File name -> text of a ``TransfoXLTokenizer`` directory for ``vocab`` (:data:`HF_TOKENIZER_FILES`);
    :func:`hf_tokenizer_refusal` must have found nothing. Prompts are lower-cased when the vocabulary is (as
    :class:`transformer_xl.data.codec.TextCodec` does); no ``<formula>`` or other added token outside the vocabulary."""
    import json
    import re

    from transformer_xl.data.codec import TextCodec

    reason = hf_tokenizer_refusal(vocab)
    if reason is not None:
        raise CheckpointError(f"cannot write a Hugging Face tokenizer: {reason}")
    specials = {"unk_token": vocab.unk, "eos_token": vocab.eos, "additional_special_tokens": []}
    kept = [s for s in dict.fromkeys([*vocab.special, vocab.unk, vocab.eos]) if s is not None]
    config = {
        "tokenizer_class": "TransfoXLTokenizer", "special": list(vocab.special), "lower_case": TextCodec(vocab).lower,
        "delimiter": None, "language": "en", "never_split": [*map(re.escape, kept), *WIKITEXT_PROTECTED],
        **specials, "model_max_length": 1_000_000_000,
    }
    return {
        HF_TOKENIZER_FILES[0]: "".join(f"{s}\n" for s in vocab.idx2sym),
        HF_TOKENIZER_FILES[1]: json.dumps(config, indent=2, ensure_ascii=False) + "\n",
        HF_TOKENIZER_FILES[2]: json.dumps(specials, indent=2, ensure_ascii=False) + "\n",
    }
