"""The checks of a model directory, each on its own (the whole path, ``save_pretrained``/``from_pretrained``, is in
``tests/model/test_lm.py``)."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_model
from transformer_xl import TransformerXLLM
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.model.pretrained import check_vocab_json, check_weights_header, checked_vocab_json, mismatch
from transformer_xl.store.layout import WEIGHTS
from transformer_xl.store.tensors import read_header


def test_a_vocabulary_must_be_txl_json_of_the_model_size() -> None:
    check_vocab_json('{"symbols": ["a", "b"]}', 2)
    with pytest.raises(ConfigError, match="not a txl vocabulary"):
        check_vocab_json("[1, 2]", 2)
    with pytest.raises(ConfigError, match="has 2 symbols but the model predicts n_token=3"):
        check_vocab_json('{"symbols": ["a", "b"]}', 3)
    assert checked_vocab_json(None, 3) is None


def test_mismatch_names_missing_unexpected_and_misshaped_keys() -> None:
    assert mismatch({"a": (2,), "b": (3,)}, {"a": (2,), "b": (3,)}) is None
    why = mismatch({"a": (2,), "b": (3,)}, {"b": (4,), "c": (1,)})
    assert why == "missing: a; unexpected: c; wrong shape: b"


def test_the_header_of_another_config_is_refused(tmp_path) -> None:
    model = tiny_model(n_layer=2)
    model.save_pretrained(tmp_path)
    header = read_header(tmp_path / WEIGHTS)
    check_weights_header(model.config, header, tmp_path, build=TransformerXLLM)
    with pytest.raises(CheckpointError, match="weights of 2 layers but its config says n_layer=3"):
        check_weights_header(model.config.replace(n_layer=3), header, tmp_path, build=TransformerXLLM)
    # a count no set of indices fits in memory (the fuzz campaign's seed 24 found it: a MemoryError before)
    with pytest.raises(CheckpointError, match=r"weights of 2 layers but its config says n_layer=1000000000000:"):
        check_weights_header(model.config.replace(n_layer=10**12), header, tmp_path, build=TransformerXLLM)
    with pytest.raises(CheckpointError, match="parameters but its config"):
        check_weights_header(model.config.replace(d_inner=model.config.d_inner + 1), header, tmp_path,
                             build=TransformerXLLM)
