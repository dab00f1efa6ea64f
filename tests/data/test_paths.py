"""Where data lives: data and cache directory resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_xl.data import load_corpus


def test_data_and_cache_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_xl.data import resolve_cache_dir, resolve_data_dir

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
