"""Fixtures shared by the whole suite (see ``tests/helpers.py``) and the test-run settings."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # no test reaches the Hugging Face Hub (set before huggingface_hub reads it)

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import helpers
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.train.config import TrainConfig


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One intra-op thread per test: tiny models run faster so on 2 cores, and a busy machine cannot change
    which kernels (and so which rounding) a test sees."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config() -> Callable[..., TXLConfig]:
    """``tiny_config(**overrides)``: the tiny architecture of ``tests/helpers.py`` with overrides."""
    return helpers.tiny_config


@pytest.fixture
def tiny_model() -> Callable[..., TransformerXLLM]:
    """``tiny_model(seed=0, train=False, **overrides)``: a seeded tiny model."""
    return helpers.tiny_model


@pytest.fixture
def word_corpus(tmp_path: Path) -> Path:
    """A directory of ``train.txt``, ``valid.txt``, ``test.txt`` word sentences."""
    return helpers.corpus_dir(tmp_path)


@pytest.fixture
def tiny_run(tmp_path: Path) -> Callable[..., TrainConfig]:
    """``tiny_run(dataset=..., **overrides)``: a tiny training config writing to ``tmp_path/run``."""

    def make(dataset: str = "unused", **kw: Any) -> TrainConfig:
        return helpers.tiny_train_config(tmp_path / "run", dataset, **kw)

    return make


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(run directory, corpus directory)`` of a tiny run trained once for the session (``helpers.train_tiny_run``):
    read it, copy it, never change it."""
    return helpers.train_tiny_run(tmp_path_factory.mktemp("trained"))


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face Hub cache (``HF_HUB_CACHE``) used offline (``HF_HUB_OFFLINE``), and a private txl cache
    (``TXL_CACHE_DIR``, where Hub models are converted); fill it with ``helpers.hub_repo``."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "txl-cache"))
    return cache


@pytest.fixture(scope="session")
def onnx_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[TransformerXLLM, Path, Path]:
    """``(model, model directory, export directory)``: a tiny adaptive-softmax model with a word vocabulary, exported
    once for the session by ``txl export onnx`` (the exporter takes tens of seconds): read it, never change it."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from transformer_xl.cli import main

    root = tmp_path_factory.mktemp("onnx")
    vocab = helpers.word_vocab()
    model = helpers.generation_model(3, n_token=len(vocab), cutoffs=[8, 14], div_val=2)
    model.save_pretrained(root / "model", vocab=vocab)
    assert main(["export", "onnx", str(root / "model"), str(root / "export")]) == 0
    return model, root / "model", root / "export"
