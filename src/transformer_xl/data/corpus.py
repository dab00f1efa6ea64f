"""``load_corpus``: locate a dataset's files, prepare it once into the cache, and memory-map it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl.data import builders
from transformer_xl.data.builders import Built, Source
from transformer_xl.data.cache import config_key, list_caches, load_arrays, read_manifest, stale_reason, write_cache
from transformer_xl.data.fetch import read_sources
from transformer_xl.data.paths import resolve_cache_dir, resolve_data_dir
from transformer_xl.data.rawtext import with_compressed_variants
from transformer_xl.data.registry import ASSETS_DIR, DatasetSpec, find_resource, get_spec
from transformer_xl.data.subword import build_with_tokenizer
from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import DataError
from transformer_xl.store.layout import VOCAB

log = logging.getLogger(__name__)
PREP_VERSION = 1  # bump when a preparation rule changes: older caches are then rebuilt
USER_SPLIT_NAMES = {"train": ("train",), "valid": ("valid", "val", "dev"), "test": ("test",)}
LEVELS = ("word", "char", "byte")
USER_OPTIONS = ("level", "lower", "min_freq", "max_size", "valid_fraction", "test_fraction", "tokenizer")


@dataclass
class Corpus:
    """A prepared corpus: vocabulary, memory-mapped id arrays per split, and its manifest."""

    name: str
    vocab: Vocab
    splits: dict[str, np.ndarray]
    char_level: bool
    cache_dir: Path
    manifest: dict[str, Any]
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_arrays(cls, name: str, splits: dict[str, Any], *, vocab: Vocab | None = None, n_token: int | None = None,
                    char_level: bool = False) -> Corpus:
        """An in-memory corpus of token-id arrays (no cache on disk); without ``vocab`` the symbols are the ids
        themselves (``"0"``, ``"1"``, ...) for ``n_token`` symbols (default: the largest id + 1)."""
        arrays = {k: np.asarray(v) for k, v in splits.items()}
        if vocab is None:
            n = n_token if n_token is not None else 1 + max(int(a.max()) for a in arrays.values() if a.size)
            vocab = Vocab([str(i) for i in range(n)])
        return cls(name=name, vocab=vocab, splits=arrays, char_level=char_level, cache_dir=Path("."), manifest={})

    @property
    def metric(self) -> str:
        """``bpc`` (bits per character) for char/byte-level corpora, else ``ppl``."""
        return "bpc" if self.char_level else "ppl"

    def sentence_offsets(self, split: str) -> np.ndarray | None:
        """Sentence boundaries (``n+1`` offsets) of a sentence-level corpus (One Billion Word), else None."""
        return self.extras.get(f"{split}.sent_offsets")

    def unknown_tokens(self, split: str) -> int | None:
        """Tokens of ``split`` that a given vocabulary lacked (mapped to its ``unk``): :func:`load_corpus` with
        ``vocab=``; ``None`` for a corpus that built its own vocabulary."""
        count = self.manifest.get("unknown", {}).get(split)
        return int(count) if isinstance(count, int) else None

    def info(self) -> dict[str, Any]:
        """Sizes and counts, as ``txl data info`` prints them."""
        return {
            "name": self.name,
            "vocab_size": len(self.vocab),
            "char_level": self.char_level,
            "metric": self.metric,
            "tokens": {k: int(v.shape[0]) for k, v in self.splits.items()},
            "dtype": str(next(iter(self.splits.values())).dtype),
            "bytes": {k: int(v.nbytes) for k, v in self.splits.items()},
            "cache_dir": str(self.cache_dir),
            "sources": [s["path"] for s in self.manifest.get("sources", [])],
        }


# -- locating source files ----------------------------------------------------------------------
def _missing(spec: DatasetSpec, rel: str, data_dir: Path) -> DataError:
    filename = rel.split("!")[0].split("/")[-1]
    target = data_dir / rel.split("!")[0]
    found = find_resource(spec, filename)
    if found is None:
        return DataError(f"{spec.name}: missing {target}; place the file there by hand")
    res, member = found
    what = f"{member.name} from {res.url}" if member else res.url
    return DataError(
        f"{spec.name}: missing {target} — run `txl data fetch {spec.name}` (needs internet) "
        f"or download {what} by hand and place it at {target}"
    )


def _locate_one(rel: str, base: Path) -> Source | None:
    path, _, member = rel.partition("!")
    for cand in with_compressed_variants(base / path) if not member else [base / path]:
        if cand.is_file():
            return Source(cand, member or None)
    return None


def locate_sources(spec: DatasetSpec, data_dir: Path) -> dict[str, list[Source]]:
    """The files of each split: data dir first, then the embedded copy; else a :class:`DataError`."""
    out: dict[str, list[Source]] = {}
    for split, candidates in spec.files.items():
        if spec.kind == "lm1b" and split == "train":
            root = data_dir / Path(candidates[0]).parent
            paths = sorted(root.glob(Path(candidates[0]).name)) if root.is_dir() else []
            if not paths:
                raise _missing(spec, candidates[0].replace("news.en-*", "news.en-00001-of-00100"), data_dir)
            out[split] = [Source(p) for p in paths]
            continue
        src = next((s for rel in candidates if (s := _locate_one(rel, data_dir))), None)
        if src is None and spec.embedded:
            name = Path(candidates[0].split("!")[0]).name
            src = _locate_one(name, ASSETS_DIR / spec.embedded)
        if src is None:
            raise _missing(spec, candidates[0], data_dir)
        out[split] = [src]
    # the two-split zip datasets (enwik8/text8) list one file for all splits
    return out


def _user_sources(paths: list[Path]) -> dict[str, list[Source]] | list[Source]:
    """Explicit train/valid/test files of a directory, or the sorted list of all its text files."""
    if len(paths) == 1 and paths[0].is_dir():
        root = paths[0]
        split_files: dict[str, Source] = {}
        for split, stems in USER_SPLIT_NAMES.items():
            for stem in stems:
                found = _split_sources(root, stem)
                if found:
                    split_files[split] = found
                    break
        if len(split_files) == 3:
            return split_files
        if split_files:
            have = ", ".join(split_files)
            raise DataError(f"{root}: has {have} but not all of train, valid and test (files train.txt/valid.txt/"
                            "test.txt or folders train/, valid/, test/); give all three, or none to cut the text")
        files = sorted(p for p in root.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.parts))
        if not files:
            raise DataError(f"{root}: no text files in this directory")
        return [Source(p) for p in files]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: no such file")
    return [Source(p) for p in paths]


def _split_sources(root: Path, stem: str) -> list[Source]:
    """The files of one given split: ``stem.txt`` (or ``stem``, compressed variants too), or every file of a
    ``stem/`` folder in name order."""
    src = _locate_one(f"{stem}.txt", root) or _locate_one(stem, root)
    if src:
        return [src]
    folder = root / stem
    if folder.is_dir():
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"{folder}: the {stem} folder holds no files")
        return [Source(p) for p in files]
    return []


def check_fraction(name: str, value: Any) -> float:
    """``valid_fraction`` / ``test_fraction``: a number in (0, 0.5), else a one-line :class:`DataError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 0.5:
        raise DataError(f"{name} must be a number in (0, 0.5), got {value!r}")
    return float(value)


# -- building -----------------------------------------------------------------------------------
def _build_spec(spec: DatasetSpec, sources: dict[str, list[Source]], data_dir: Path, opts: dict[str, Any]) -> Built:
    errors = opts["errors"]
    if spec.kind in ("word", "char"):
        return builders.build_text_splits(
            spec.name,
            sources,
            level=spec.kind,
            lower=spec.lower,
            count_splits=spec.count_splits,
            special=("<eos>",),
            eos="<eos>",
            unk="<unk>",
            errors=errors,
        )
    if spec.kind == "enwik8":
        return builders.build_enwik8(spec.name, sources["train"][0], opts["n_test"])
    if spec.kind == "text8":
        return builders.build_text8(spec.name, sources["train"][0], opts["n_test"])
    if spec.kind == "lm1b":
        return builders.build_lm1b(spec.name, sources, data_dir / spec.extra_files["vocab"], errors)
    raise DataError(f"{spec.name}: unknown preparation kind {spec.kind!r}")  # pragma: no cover


def _build_user(name: str, sources: dict[str, list[Source]] | list[Source], opts: dict[str, Any]) -> Built:
    level, errors = opts.get("level", "word"), opts["errors"]
    fractions = {
        "valid_fraction": opts.get("valid_fraction", 0.05),
        "test_fraction": opts.get("test_fraction", 0.05),
    }
    if opts.get("tokenizer"):
        return build_with_tokenizer(name, sources, Path(opts["tokenizer"]), errors=errors, **fractions)
    if isinstance(sources, dict) and level == "byte":
        return builders.build_byte_splits(name, sources)
    if isinstance(sources, dict) and level != "byte":
        return builders.build_text_splits(
            name,
            sources,
            level=level,
            lower=opts.get("lower", False),
            special=("<eos>", "<unk>"),
            count_splits=("train",),
            min_freq=opts.get("min_freq", 0),
            max_size=opts.get("max_size"),
            errors=errors,
        )
    flat = sources if isinstance(sources, list) else [s for v in sources.values() for s in v]
    return builders.build_user_text(
        name,
        flat,
        level=level,
        lower=opts.get("lower", False),
        min_freq=opts.get("min_freq", 0),
        max_size=opts.get("max_size"),
        errors=errors,
        **fractions,
    )


def load_corpus(name: str, data_dir: str | Path | None = None, *, vocab: Vocab | None = None,
                **options: Any) -> Corpus:
    """Load (preparing once if needed) a dataset by name, or the user's own text.

    ``vocab``: encode the text with this vocabulary instead of building one (a pretrained model's, to fine-tune
    it; word- and char-level text only, of the vocabulary's own level): unknown symbols become its ``unk``,
    :meth:`Corpus.unknown_tokens` counts them, and the cache key includes the vocabulary's SHA-256.

    ``name``: a known dataset (see :func:`known_datasets`), ``"text"`` with ``paths=[...]``, or a path
    to a text file or directory. Options: ``cache_dir``; ``rebuild`` (force); ``on_stale``
    (``"rebuild"`` default, or ``"error"``); ``errors`` (``"strict"`` or ``"replace"`` for non-UTF-8
    bytes); ``n_test`` (enwik8/text8 valid/test size, default 5,000,000); for user text ``level``
    (word/char/byte), ``lower``, ``min_freq``, ``max_size``, ``valid_fraction``, ``test_fraction``,
    ``tokenizer`` (a ``tokenizers`` JSON).
    """
    ddir = resolve_data_dir(data_dir)
    cache_root = resolve_cache_dir(options.pop("cache_dir", None), ddir)
    rebuild = bool(options.pop("rebuild", False))
    on_stale = options.pop("on_stale", "rebuild")
    opts: dict[str, Any] = {"errors": options.pop("errors", "strict")}
    if opts["errors"] not in ("strict", "replace"):
        raise DataError(f"errors must be 'strict' or 'replace', not {opts['errors']!r}")
    paths = options.pop("paths", None)
    user = paths is not None or name == "text" or (name.lower() not in _aliases() and Path(name).exists())
    if user:
        plist = [Path(p).expanduser().resolve() for p in (paths or [name])]
        bad = set(options) - set(USER_OPTIONS)
        if bad:
            raise DataError(f"unknown option(s) for user text: {', '.join(sorted(bad))}")
        opts.update({k: v for k, v in options.items() if v is not None})
        for key in ("valid_fraction", "test_fraction"):
            if key in opts:
                opts[key] = check_fraction(key, opts[key])
        if opts.get("level", "word") not in LEVELS:
            raise DataError(f"unknown level {opts['level']!r}; use {', '.join(LEVELS)}")
        sources = _user_sources(plist)
        flat = sources if isinstance(sources, list) else [s for v in sources.values() for s in v]
        label = "text-" + (plist[0].stem or "corpus")
        char_level = opts.get("level", "word") in ("char", "byte") and not opts.get("tokenizer")
        extra_paths = [Path(opts["tokenizer"]).resolve()] if opts.get("tokenizer") else []
        if extra_paths:
            opts["tokenizer"] = str(extra_paths[0])
        build = lambda: _build_user(label, sources, opts)  # noqa: E731
        if vocab is not None:
            level = "tokenizer" if opts.get("tokenizer") else opts.get("level", "word")
            check_level(vocab, level, label)
            build = lambda: builders.build_with_vocab(  # noqa: E731
                label, sources, vocab, level=level, lower=opts.get("lower", False), errors=opts["errors"],
                **{k: opts[k] for k in ("valid_fraction", "test_fraction") if k in opts})
    else:
        spec = get_spec(name)
        opts["n_test"] = int(options.pop("n_test", 5_000_000))
        if options:
            raise DataError(f"unknown option(s) for {spec.name}: {', '.join(sorted(options))}")
        label, char_level = spec.name, spec.char_level
        if vocab is not None:  # before looking for the files: a refusal needs no data
            check_level(vocab, spec.kind, label)
        sources = locate_sources(spec, ddir)
        flat = list(dict.fromkeys(s for v in sources.values() for s in v))
        extra_paths = [ddir / f for f in spec.extra_files.values()]
        for p in extra_paths:
            if not p.is_file():
                raise _missing(spec, str(p.relative_to(ddir)), ddir)
        build = lambda: _build_spec(spec, sources, ddir, opts)  # noqa: E731
        if vocab is not None:
            build = lambda: builders.build_with_vocab(  # noqa: E731
                label, sources, vocab, level=spec.kind, lower=spec.lower, errors=opts["errors"])
    src_paths = list(dict.fromkeys([s.path for s in flat] + extra_paths))
    config = {
        "prep_version": PREP_VERSION,
        "dataset": label,
        "options": opts,
        "members": [s.member for s in flat],
        "char_level": char_level,
        **({"vocab_sha256": vocab.sha256()} if vocab is not None else {}),
    }
    cache_dir = cache_root / f"{label}-{config_key({**config, 'sources': [str(p) for p in src_paths]})}"
    manifest = None if rebuild else read_manifest(cache_dir)
    if manifest is not None:
        reason = stale_reason(manifest, dataset=label, config=config, sources=src_paths, cache_dir=cache_dir)
        if reason is not None:
            if on_stale == "error":
                raise DataError(f"{label}: cache {cache_dir} is stale ({reason}); rebuild with --rebuild")
            log.warning("%s: rebuilding stale cache %s (%s)", label, cache_dir, reason)
            manifest = None
    if manifest is None:
        built = build()
        fetched = {} if user else fetched_from(spec, src_paths, ddir)  # where a known dataset's files came from
        manifest = write_cache(
            cache_dir,
            built,
            dataset=label,
            config=config,
            sources=src_paths,
            extra={"char_level": char_level, **({"unknown": built.unknown} if built.unknown is not None else {}),
                   **({"fetched_from": fetched} if fetched else {})},
        )
    vocab = Vocab.load(cache_dir / VOCAB)
    splits = load_arrays(cache_dir, manifest["splits"], len(vocab))
    extras = load_arrays(cache_dir, manifest.get("extras", {}))
    return Corpus(label, vocab, splits, char_level, cache_dir, manifest, extras)


def fetched_from(spec: DatasetSpec, paths: list[Path], data_dir: Path) -> dict[str, Any]:
    """Where each source file of a known dataset came from: the record ``txl data fetch`` kept (URL or Hub dataset,
    SHA-256), or the copy embedded in the package; files placed by hand have no entry."""
    records = read_sources(data_dir / spec.subdir)
    out: dict[str, Any] = {}
    for path in paths:
        if path.parent == data_dir / spec.subdir and path.name in records:
            out[path.name] = records[path.name]
        elif ASSETS_DIR in path.parents:
            out[path.name] = {"source": f"embedded in the package ({spec.embedded})"}
    return out


def check_level(vocab: Vocab, level: str, dataset: str) -> None:
    """Refuse, in one line, text of ``level`` (word, char, ...) that ``vocab`` cannot encode: a given vocabulary
    encodes word- or char-level text of its own level only."""
    from transformer_xl.data.codec import detect_level

    have = detect_level(vocab)
    have = "char" if have == "text8" else have
    if level not in ("word", "char") or have != level:
        raise DataError(f"dataset {dataset!r} is {level}-level text but the vocabulary is {have}-level "
                        f"({len(vocab)} symbols): a model's vocabulary encodes only text of its own level")


def _aliases() -> set[str]:
    from transformer_xl.data.registry import dataset_aliases

    return dataset_aliases()


def prepared_caches(name: str, data_dir: str | Path | None = None, cache_dir: str | Path | None = None) -> list[dict]:
    """The caches already prepared for a dataset or a user text path (see
    :func:`transformer_xl.data.cache.list_caches`);
    nothing is built or read besides the manifests."""
    ddir = resolve_data_dir(data_dir)
    root = resolve_cache_dir(cache_dir, ddir)
    if name.lower() not in _aliases() and Path(name).exists():
        path = Path(name).expanduser().resolve()
        return list_caches(root, "text-" + (path.stem or "corpus"), path)
    return list_caches(root, get_spec(name).name)
