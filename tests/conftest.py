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
def onnx_export(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], tuple[TransformerXLLM, Path, Path]]:
    """``onnx_export()``: ``(model, model directory, export directory)``, a tiny adaptive-softmax model with a word
    vocabulary exported by ``txl export onnx`` once for the session (the exporter takes tens of seconds): read it,
    never change it. The export is made by the first test that calls ``onnx_export()``, within that test (mutation
    testing sizes each test's time limit by the time of its own body, fixtures left out), and the command's output
    and files are checked there: the other tests of the command reuse its one export."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    root = tmp_path_factory.mktemp("onnx")
    made: list[tuple[TransformerXLLM, Path, Path]] = []

    def get() -> tuple[TransformerXLLM, Path, Path]:
        if not made:
            made.append(_export_onnx_once(root))
        return made[0]

    return get


def _export_onnx_once(root: Path) -> tuple[TransformerXLLM, Path, Path]:
    import contextlib
    import io
    import json

    from transformer_xl.cli import main

    vocab = helpers.word_vocab()
    model = helpers.generation_model(3, n_token=len(vocab), cutoffs=[8, 14], div_val=2)
    model.save_pretrained(root / "model", vocab=vocab)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["export", "onnx", str(root / "model"), str(root / "export")]) == 0
    export = root / "export"
    assert out.getvalue() == ""
    assert err.getvalue() == f"txl export: wrote {export} (segment.onnx, step.onnx; see {export}/onnx_export.json)\n"
    assert (export / "vocab.json").read_text() == vocab.to_json()  # the vocabulary beside the model, and its level
    assert json.loads((export / "onnx_export.json").read_text())["text"] == {"level": "word"}
    return model, root / "model", export


def pytest_configure(config: pytest.Config) -> None:
    """The ``exports`` marker; and, for ``make test-hf4`` (TXL_REQUIRE_HF4=1), which runs the tests whose oracle is
    transformers 4's TransfoXL, a stop at once where the oracle is missing, rather than each test skipping."""
    config.addinivalue_line("markers", "exports: exports a model to ONNX itself (tens of seconds); runs last")
    config.addinivalue_line("markers", "longest: minutes long; runs first (pytest-xdist hands tests out in their "
                                       "order, so the other workers share the rest meanwhile)")
    if os.environ.get("TXL_REQUIRE_HF4"):
        from transformer_xl.interop.hf import hf_available

        if not hf_available():
            pytest.exit("TXL_REQUIRE_HF4 is set but transformers 4 with TransfoXL is not installed", returncode=3)


#: The time budget of a test marked ``slow`` (the default run's is ``timeout`` in pyproject.toml): a whole small
#: training run or several compiles; over it, the test fails with its name.
SLOW_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``longest`` run first, so that a run of parallel workers does not wait for one of them at its
    end. The tests that export to ONNX (marked ``exports``, or using the session's ``onnx_export``) run last, in their
    order: under ``pytest -x`` a quick test that fails stops the run before an export (tens of seconds) is made. A
    test marked ``slow`` and no ``timeout`` of its own gets :data:`SLOW_TIMEOUT_S`."""
    items.sort(key=lambda item: (item.get_closest_marker("longest") is None,
                                 "onnx_export" in getattr(item, "fixturenames", ()) or
                                 item.get_closest_marker("exports") is not None))
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
