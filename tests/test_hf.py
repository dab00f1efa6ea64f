"""``import transformer_xl.hf``: the two-line way into transformers 5's Auto classes."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", minversion="5.17")


def test_importing_it_registers_transfo_xl_with_the_auto_classes() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import transformer_xl.hf as hf

    assert CONFIG_MAPPING["transfo-xl"] is hf.TransfoXLConfig
    config = AutoConfig.for_model("transfo-xl", n_token=10)
    assert isinstance(config, hf.TransfoXLConfig) and config.to_txl().n_token == 10
    assert AutoModelForCausalLM._model_mapping[hf.TransfoXLConfig] is hf.TransfoXLForCausalLM
    assert AutoTokenizer.from_pretrained  # the tokenizer class is registered beside them
    hf.register()  # again: nothing changes
    assert CONFIG_MAPPING["transfo-xl"] is hf.TransfoXLConfig
