"""``AutoConfig`` for ``transfo-xl``: txl's config and Hugging Face TransfoXL's, both read; txl's form written."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", minversion="5.17")

from tests.helpers import tiny_config, tiny_model
from transformer_xl import ConfigError, TXLConfig
from transformer_xl.integrations.hf import TransfoXLConfig
from transformer_xl.interop.hf import config_from_hf, hf_config_dict
from transformer_xl.store.layout import read_model_config


def test_txl_fields_round_trip_and_are_written_as_txl_writes_them(tmp_path) -> None:
    cfg = tiny_config(cutoffs=[10, 30], div_val=2, d_embed=16, same_length=True, clamp_len=5)
    hf = TransfoXLConfig.from_txl(cfg)
    assert hf.to_txl() == cfg and hf.vocab_size == cfg.n_token and hf.hidden_size == cfg.d_model
    hf.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "transfo-xl" and data["architectures"] == ["TransfoXLForCausalLM"]
    assert TXLConfig.from_dict(read_model_config(tmp_path)) == cfg  # txl reads past the transformers keys
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tmp_path).to_txl() == cfg


def test_a_hugging_face_transfoxl_config_is_converted_as_txl_convert_does() -> None:
    data = {**hf_config_dict(tiny_model(untie_r=True, cutoffs=[10, 30])), "tgt_len": 4}
    hf = TransfoXLConfig(**data)
    assert not hf.txl_layout and hf.to_txl() == config_from_hf(data)


def test_a_config_that_describes_no_model_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"attn_type must be one of \[0, 1, 2, 3\], got 7"):
        TransfoXLConfig(**{**tiny_config().to_dict(), "attn_type": 7}).to_txl()
    with pytest.raises(ValueError, match="push_to_hub is not supported"):
        TransfoXLConfig.from_txl(tiny_config()).save_pretrained("unused", push_to_hub=True)
