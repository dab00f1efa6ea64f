"""Real PTB / WikiText-2 preparation: published counts, official vocabulary order, cache behaviour."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from txl.data import known_datasets, load_corpus
from txl.data.corpora import ASSETS_DIR
from txl.errors import DataError

SHARED = Path(os.environ.get("TXL_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
HAVE_SHARED = (SHARED / "ptb" / "ptb.train.txt.gz").is_file() and (SHARED / "wikitext-2").is_dir()
needs_shared = pytest.mark.skipif(not HAVE_SHARED, reason=f"real datasets not found at {SHARED}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def official_reference(paths: list[Path], lower: bool) -> tuple[list[str], list[list[str]]]:
    """The official Vocab rule, written the slow way: special first, Counter.most_common order."""
    counter: Counter[str] = Counter()
    per_file = []
    for p in paths:
        toks: list[str] = []
        with gzip.open(p, "rt", encoding="utf-8") as f:
            for line in f:
                line = line.strip().lower() if lower else line.strip()
                counter.update(line.split())
                toks.extend([*line.split(), "<eos>"])
        per_file.append(toks)
    symbols = ["<eos>"] + [s for s, _ in counter.most_common() if s != "<eos>"]
    return symbols, per_file


@needs_shared
def test_ptb_published_counts_and_official_vocab(cache: Path) -> None:
    c = load_corpus("ptb", SHARED, cache_dir=cache)
    assert {k: v.shape[0] for k, v in c.splits.items()} == {"train": 929_589, "valid": 73_760, "test": 82_430}
    assert len(c.vocab) == 10_000
    assert c.splits["train"].dtype == np.uint16 and isinstance(c.splits["train"], np.memmap)
    assert not c.char_level and c.metric == "ppl"
    paths = [SHARED / "ptb" / f"ptb.{s}.txt.gz" for s in ("train", "valid", "test")]
    symbols, per_file = official_reference(paths, lower=True)
    assert c.vocab.idx2sym == symbols
    assert c.vocab.eos_idx == 0 and c.vocab.unk_idx == symbols.index("<unk>")
    for split, toks in zip(("train", "valid", "test"), per_file):
        assert c.vocab.decode(c.splits[split]) == toks


@needs_shared
def test_wt2_published_counts_and_official_vocab(cache: Path) -> None:
    c = load_corpus("wt2", SHARED, cache_dir=cache)
    assert {k: v.shape[0] for k, v in c.splits.items()} == {
        "train": 2_088_628,
        "valid": 217_646,
        "test": 245_569,
    }
    assert len(c.vocab) == 33_278
    paths = [SHARED / "wikitext-2" / f"wiki.{s}.tokens.gz" for s in ("train", "valid", "test")]
    symbols, per_file = official_reference(paths, lower=False)
    assert c.vocab.idx2sym == symbols
    np.testing.assert_array_equal(c.splits["valid"], c.vocab.encode(per_file[1]))


def test_embedded_wt2_is_complete(tmp_path: Path) -> None:
    assert sum(f.stat().st_size for f in (ASSETS_DIR / "wikitext-2").iterdir()) < 5_000_000
    c = load_corpus("wikitext-2", tmp_path / "empty", cache_dir=tmp_path / "cache")
    assert c.info()["tokens"] == {"train": 2_088_628, "valid": 217_646, "test": 245_569}
    assert len(c.vocab) == 33_278
    assert str(ASSETS_DIR) in c.manifest["sources"][0]["path"]


@needs_shared
def test_wt2_char_rule(cache: Path) -> None:
    c = load_corpus("wt2-char", SHARED, cache_dir=cache)
    assert c.char_level and c.metric == "bpc" and c.vocab.idx2sym[0] == "<eos>"
    with gzip.open(SHARED / "wikitext-2" / "wiki.valid.tokens.gz", "rt", encoding="utf-8") as f:
        expected = [sym for line in f for sym in [*line.strip(), "<eos>"]]
    assert c.vocab.decode(c.splits["valid"]) == expected
    with gzip.open(SHARED / "wikitext-2" / "wiki.train.tokens.gz", "rt", encoding="utf-8") as f:
        text = f.read()
    n_lines = text.count("\n")
    assert c.splits["train"].shape[0] == sum(len(ln.strip()) for ln in text.split("\n")[:-1]) + n_lines


@needs_shared
def test_cache_reused_then_stale_detected(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "ptb").mkdir(parents=True)
    for s in ("train", "valid", "test"):
        (data / "ptb" / f"ptb.{s}.txt.gz").write_bytes((SHARED / "ptb" / f"ptb.{s}.txt.gz").read_bytes())
    first = load_corpus("ptb", data, cache_dir=tmp_path / "c")
    created = first.manifest["created"]
    manifest = json.loads((first.cache_dir / "manifest.json").read_text())
    assert manifest["vocab"]["size"] == 10_000 and manifest["splits"]["train"]["dtype"] == "uint16"
    assert len(manifest["sources"]) == 3 and all(len(s["sha256"]) == 64 for s in manifest["sources"])
    again = load_corpus("ptb", data, cache_dir=tmp_path / "c")
    assert again.manifest["created"] == created and again.cache_dir == first.cache_dir
    # another txl version wrote it: refused with a clear message, or rebuilt
    manifest["txl_version"] = "0.0.0-other"
    (first.cache_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"stale .*txl 0\.0\.0-other"):
        load_corpus("ptb", data, cache_dir=tmp_path / "c", on_stale="error")
    rebuilt = load_corpus("ptb", data, cache_dir=tmp_path / "c")
    assert rebuilt.manifest["txl_version"] != "0.0.0-other"
    # a different vocabulary file in the cache is detected
    vocab = json.loads((rebuilt.cache_dir / "vocab.json").read_text())
    vocab["symbols"][1], vocab["symbols"][2] = vocab["symbols"][2], vocab["symbols"][1]
    (rebuilt.cache_dir / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(DataError, match="another vocabulary"):
        load_corpus("ptb", data, cache_dir=tmp_path / "c", on_stale="error")
    # changed source content is detected
    os.utime(data / "ptb" / "ptb.test.txt.gz", ns=(1, 1))
    with gzip.open(data / "ptb" / "ptb.test.txt.gz", "wb") as f:
        f.write(b"a b c\n")
    with pytest.raises(DataError, match="changed"):
        load_corpus("ptb", data, cache_dir=tmp_path / "c", on_stale="error")


def test_unknown_name_lists_known() -> None:
    with pytest.raises(DataError, match="unknown dataset 'nope'; known: enwik8, lm1b, ptb"):
        load_corpus("nope")
    assert {"ptb", "wt2", "wt103", "enwik8", "text8", "lm1b", "wt2-char"} <= set(known_datasets())


def test_missing_file_names_file_url_and_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_corpus("ptb", tmp_path, cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path / "ptb" / "ptb.train.txt") in msg
    assert "simple-examples.tgz" in msg and "txl data fetch ptb" in msg
    with pytest.raises(DataError, match=r"enwik8\.zip.*http://mattmahoney\.net/dc/enwik8\.zip"):
        load_corpus("enwik8", tmp_path, cache_dir=tmp_path / "c")


def test_data_and_cache_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from txl.data import resolve_cache_dir, resolve_data_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TXL_DATA_DIR", raising=False)
    monkeypatch.delenv("TXL_CACHE_DIR", raising=False)
    assert resolve_data_dir() == tmp_path / "xdg" / "txl" / "data"
    monkeypatch.setenv("TXL_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_cache_dir() == tmp_path / "xdg" / "txl" / "prepared"
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cenv"))
    assert resolve_cache_dir() == tmp_path / "cenv"
    c = load_corpus("wt2", tmp_path / "nothing-here")  # embedded fallback, cache under TXL_CACHE_DIR
    assert c.cache_dir.parent == tmp_path / "cenv" and not (tmp_path / "nothing-here").exists()
