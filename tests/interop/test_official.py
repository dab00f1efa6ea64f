"""Conversion to and from the official PyTorch state dicts (no pickle anywhere). The numerical equivalence
with the official semantics is ``tests/equivalence/test_official.py``."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import adaptive_model as _model
from tests.helpers import assert_same_outputs as _same_outputs
from transformer_xl.interop.official import from_official, load_official, to_official
from transformer_xl.interop.state_dicts import read_state_dict


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_official_round_trip(attn_type: int) -> None:
    model = _model(attn_type=attn_type, d_embed=16, cutoffs=[20], div_val=1, tie_projs=[False])
    kwargs, state = to_official(model)
    if attn_type in (2, 3):
        assert "layers.0.dec_attn.q_net.weight" in state and "layers.0.dec_attn.kv_net.weight" in state
    if attn_type in (0, 1):
        assert "r_w_bias" in state
    assert "crit.cluster_weight" in state and "word_emb.emb_layers.0.weight" in state
    back = from_official(kwargs, state).eval()
    _same_outputs(model, back)


def test_official_checkpoint_files(tmp_path) -> None:
    model = _model()
    kwargs, state = to_official(model)
    torch.save(state, tmp_path / "state.pt")
    (tmp_path / "kwargs.json").write_text(json.dumps(kwargs))
    _same_outputs(model, load_official(tmp_path / "state.pt", tmp_path / "kwargs.json").eval())
    torch.save({"model_state_dict": {"module." + k: v for k, v in state.items()}}, tmp_path / "wrapped.pt")
    assert set(read_state_dict(tmp_path / "wrapped.pt")) == set(state)


def test_official_kwargs_with_none_lengths() -> None:
    kwargs, state = to_official(_model(ext_len=2, mem_len=6))
    kwargs.update(ext_len=None, mem_len=None, adapt_inp=True)
    model = from_official(kwargs, state)
    assert model.config.ext_len == 0 and model.config.mem_len == 0  # None is 0, not the value kwargs first had
    assert model(torch.zeros(1, 3, dtype=torch.long)).mems == []


