"""The prepared-data cache: reused while valid, rebuilt (or refused) when stale; no pickle."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tests.helpers import SHARED_DATA as SHARED
from tests.helpers import needs_shared_data as needs_shared
from txl.data import load_corpus
from txl.errors import DataError


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
