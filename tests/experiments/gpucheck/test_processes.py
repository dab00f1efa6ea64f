"""The ``txl`` processes of the GPU check run this checkout's sources (txl is not installed on a GPU machine)."""

from __future__ import annotations

import os

from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.processes import SOURCES, txl_env


def _opts(tmp_path, device: str = "cpu") -> CheckOptions:
    return CheckOptions(device=device, tiny=True, out_dir=tmp_path / "out", log=lambda msg: None)


def test_txl_processes_import_this_checkout_and_keep_a_cache_given(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    monkeypatch.delenv("TXL_CACHE_DIR", raising=False)
    env = txl_env(_opts(tmp_path), cache=tmp_path / "c")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SOURCES), "elsewhere"]
    assert (SOURCES / "transformer_xl" / "__main__.py").is_file()
    assert env["TXL_CACHE_DIR"] == str(tmp_path / "c") and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("TXL_CACHE_DIR", "mine")
    assert txl_env(_opts(tmp_path), cache=tmp_path / "c")["TXL_CACHE_DIR"] == "mine"
