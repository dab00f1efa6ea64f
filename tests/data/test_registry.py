"""The dataset registry: known names, the embedded WikiText-2."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_xl.data import known_datasets, load_corpus
from transformer_xl.data.registry import ASSETS_DIR
from transformer_xl.errors import DataError


def test_embedded_wt2_is_complete(tmp_path: Path) -> None:
    assert sum(f.stat().st_size for f in (ASSETS_DIR / "wikitext-2").iterdir()) < 5_000_000
    c = load_corpus("wikitext-2", tmp_path / "empty", cache_dir=tmp_path / "cache")
    assert c.info()["tokens"] == {"train": 2_088_628, "valid": 217_646, "test": 245_569}
    assert len(c.vocab) == 33_278
    assert str(ASSETS_DIR) in c.manifest["sources"][0]["path"]


def test_unknown_name_lists_known() -> None:
    with pytest.raises(DataError, match="unknown dataset 'nope'; known: enwik8, lm1b, ptb"):
        load_corpus("nope")
    assert {"ptb", "wt2", "wt103", "enwik8", "text8", "lm1b", "wt2-char"} <= set(known_datasets())
