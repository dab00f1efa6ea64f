"""A vocabulary named by its dataset: ``--init-vocab wt103`` / ``txl convert --vocab wt103``.

A vocabulary flag takes a file (a txl ``vocab.json``, a ``vocab.txt``, a Hugging Face ``vocab.pkl``) or the name of
a known dataset, which stands for the ``vocab.json`` of that dataset's prepared cache: the vocabulary built by the
official rules (for ``wt103`` the 267,735 words the official WT103 checkpoints predict). An existing path wins over
a name. Nothing is prepared here: a name with no prepared cache is a one-line :class:`DataError` saying what to run.
"""

from __future__ import annotations

from pathlib import Path

from transformer_xl.data.cache import read_manifest
from transformer_xl.data.corpus import PREP_VERSION, prepared_caches
from transformer_xl.data.registry import get_spec
from transformer_xl.errors import DataError
from transformer_xl.store.layout import VOCAB


def is_dataset_name(value: str | Path) -> bool:
    """True when ``value`` is no existing path but the name (or an alias) of a known dataset."""
    if Path(value).expanduser().exists():
        return False
    try:
        get_spec(str(value))
    except DataError:
        return False
    return True


def dataset_vocab(name: str, *, cache_dir: str | Path | None = None, flag: str = "--vocab") -> Path:
    """The ``vocab.json`` of the newest prepared cache of dataset ``name`` built by its own rules (not one encoded
    with a given vocabulary, nor by another preparation version); a one-line :class:`DataError` when there is none."""
    spec = get_spec(name)
    for cache in prepared_caches(spec.name, None, cache_dir):
        folder = Path(cache["cache_dir"])
        config = (read_manifest(folder) or {}).get("config", {})
        if config.get("prep_version") == PREP_VERSION and "vocab_sha256" not in config and (folder / VOCAB).is_file():
            return folder / VOCAB
    raise DataError(f"{flag} {name}: no prepared vocabulary of {spec.name} yet; run `txl data prepare {spec.name}` "
                    f"first (or give the path of a vocabulary file)")


def resolve_vocab(value: str | Path | None, *, cache_dir: str | Path | None = None,
                  flag: str = "--vocab") -> Path | None:
    """``value`` as a vocabulary file: a path as given, a dataset name as :func:`dataset_vocab`; ``None`` stays."""
    if value is None:
        return None
    if is_dataset_name(value):
        return dataset_vocab(str(value), cache_dir=cache_dir, flag=flag)
    return Path(value).expanduser()


__all__ = ["dataset_vocab", "is_dataset_name", "resolve_vocab"]
