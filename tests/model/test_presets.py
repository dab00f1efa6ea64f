"""Model presets: the paper's architectures and CPU sizes as functions (``transformer_xl.model.presets``)."""

from __future__ import annotations

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.model import TransformerXLLM
from transformer_xl.model.presets import MODEL_PRESETS, cpu_small, model_preset, tiny, wt103_base


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_model_preset_is_a_valid_config_with_overrides(name: str) -> None:
    n_token = 1_000_000  # above every preset's cutoffs
    cfg = model_preset(name, n_token, dropout=0.0)
    assert cfg.n_token == n_token and cfg.dropout == 0.0
    assert model_preset(name, n_token, mem_len=7).mem_len == 7


def test_cpu_small_switches_to_an_adaptive_softmax_for_word_vocabularies() -> None:
    assert cpu_small(204).cutoffs == ()
    big = cpu_small(33_278)
    assert big.cutoffs == (2000, 10000) and big.div_val == 4 and big.tie_projs == (False, True, True)


def test_wt103_base_is_the_official_architecture() -> None:
    cfg = wt103_base()
    assert (cfg.n_token, cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner) == (267_735, 16, 410, 10,
                                                                                          41, 2100)
    assert cfg.cutoffs == (20000, 40000, 200000) and cfg.tie_projs == (False, True, True, True)


def test_tiny_builds_a_model_in_test_sizes() -> None:
    model = TransformerXLLM(tiny(40))
    assert model.config.d_model == 32 and model.num_parameters() < 50_000


def test_unknown_model_preset_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'wt103-base'"):
        model_preset("wt103-bsae", 100)
