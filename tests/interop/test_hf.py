"""Hugging Face TransfoXL conversion: configs, weight maps (cluster rows reversed), hf_compat and build_hf.
The numerical equivalence in depth is ``tests/equivalence/test_hf.py``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers import adaptive_model, assert_same_outputs, tiny_model
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.interop import hf as hf_module
from transformer_xl.interop.hf import (
    build_hf,
    check_hf_exportable,
    config_from_hf,
    from_hf_state_dict,
    hf_compat,
    hf_config_dict,
    to_hf_state_dict,
)

#: configs that use every field hf_config_dict writes
CONFIGS = {
    "plain": dict(),
    "adaptive": dict(untie_r=True),
    "everything": dict(untie_r=True, pre_lnorm=True, same_length=True, clamp_len=5, d_embed=24, div_val=1,
                       tie_projs=[True, False, True], tie_weight=False, dropout=0.1, dropatt=0.05, mem_len=7,
                       init="uniform", init_range=0.05, proj_init_std=0.02, sample_softmax=-1),
}


def _model(case: str, **kw):
    return tiny_model(**CONFIGS[case], **kw) if case == "plain" else adaptive_model(**CONFIGS[case], **kw)


# ------------------------------------------------------------------ configs
@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_hf_config_dict_round_trip(case: str) -> None:
    model = _model(case)
    hf = hf_config_dict(model)
    assert hf["model_type"] == "transfo-xl" and hf["vocab_size"] == model.config.n_token and hf["attn_type"] == 0
    assert hf["adaptive"] is bool(model.config.cutoffs) and hf["layer_norm_epsilon"] == 1e-5
    back = config_from_hf(hf)
    # a Hugging Face config has no segment length: config_from_hf gives the default 128 (ext_len stays 0)
    assert back.tgt_len == 128
    assert dataclasses.replace(back, tgt_len=model.config.tgt_len) == model.config


def test_hf_config_dict_lists_every_clusters_projection_tie() -> None:
    model = adaptive_model(tie_projs=[False])  # the missing entries are untied
    assert hf_config_dict(model)["tie_projs"] == [False, False, False]
    back = config_from_hf(hf_config_dict(model))
    assert back.tie_projs == (False, False, False) and back.cutoffs == (20, 40)


def test_config_from_hf_old_names_and_shared_projections() -> None:
    old = dict(n_token=60, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, cutoffs=[20, 40], div_val=2,
               tie_weight=False, proj_share_all_but_first=True, tgt_len=32, attn_type=0)
    cfg = config_from_hf(old)
    assert cfg.n_token == 60 and cfg.tie_weight is False and cfg.tie_projs == (False, True, True)
    assert cfg.tgt_len == 32
    assert config_from_hf({**old, "proj_share_all_but_first": False}).tie_projs == (False, False, False)


@pytest.mark.parametrize("hf, message", [
    (dict(attn_type=1), "attn_type 0 only"),
    (dict(layer_norm_epsilon=0.0), r"layer_norm_epsilon must be a number in \(0, 1\), got 0.0"),
])
def test_config_from_hf_refuses_what_txl_cannot_load(hf, message) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_hf({**hf_config_dict(tiny_model()), **hf})


def test_a_layer_norm_epsilon_travels_both_ways() -> None:
    """Hugging Face's TransfoXL has layer_norm_epsilon; txl keeps it (the TF code's 1e-12 among others)."""
    model = tiny_model(layer_norm_epsilon=1e-6)
    assert hf_config_dict(model)["layer_norm_epsilon"] == 1e-6
    assert config_from_hf(hf_config_dict(model)).layer_norm_epsilon == 1e-6
    with pytest.raises(ConfigError, match="no tf_memory"):
        hf_config_dict(tiny_model(tf_memory=True))


@pytest.mark.parametrize("overrides, reason", [
    (dict(attn_type=1), "attn_type 0 only"),
    (dict(attn_type=2, mem_len=0), "attn_type 0 only"),
    (dict(attn_type=3, mem_len=0), "attn_type 0 only"),
    (dict(sample_softmax=5), r"no sampled softmax \(sample_softmax=5; its model refuses sample_softmax > 0\)"),
    (dict(ext_len=3), r"no ext_len \(ext_len=3\): its memory keeps the last mem_len positions"),
])
def test_what_hf_cannot_compute_is_refused(overrides, reason: str) -> None:
    model = tiny_model(**overrides)
    for export in (check_hf_exportable, to_hf_state_dict, hf_config_dict):
        with pytest.raises(ConfigError, match=reason) as info:
            export(model.config if export is check_hf_exportable else model)
        assert "\n" not in str(info.value)


# ------------------------------------------------------------------ weights
@pytest.mark.parametrize("untie_r", [False, True], ids=["tied-r", "untied-r"])
def test_state_dict_round_trip_gives_identical_outputs(untie_r: bool) -> None:
    model = adaptive_model(untie_r=untie_r)
    state = to_hf_state_dict(model)
    back = from_hf_state_dict(model.config, state).eval()
    assert_same_outputs(model, back)
    for name, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name


def test_bias_names_follow_untie_r() -> None:
    """Shared u, v are written under every name HF's model has for them, each layer's alias a copy (a missing
    alias is re-initialized at random by transformers 4.5x after loading)."""
    shared = adaptive_model(untie_r=False)
    tied = to_hf_state_dict(shared)
    assert {"transformer.r_w_bias", "transformer.r_r_bias"} <= set(tied)
    for i in range(shared.config.n_layer):
        for key in ("r_w_bias", "r_r_bias"):
            alias = tied[f"transformer.layers.{i}.dec_attn.{key}"]
            assert torch.equal(alias, getattr(shared.pos_enc, key))
            assert alias.untyped_storage().data_ptr() != tied[f"transformer.{key}"].untyped_storage().data_ptr()
    model = adaptive_model(untie_r=True)
    untied = to_hf_state_dict(model)
    assert "transformer.r_w_bias" not in untied
    for i in range(model.config.n_layer):
        assert torch.equal(untied[f"transformer.layers.{i}.dec_attn.r_w_bias"], model.pos_enc.r_w_bias[i])
        assert torch.equal(untied[f"transformer.layers.{i}.dec_attn.r_r_bias"], model.pos_enc.r_r_bias[i])
    assert torch.equal(untied["transformer.pos_emb.inv_freq"], model.pos_enc.inv_freq)
    assert "transformer.word_emb.emb_layers.0.weight" in untied and "crit.out_layers.0.weight" in untied
    assert "transformer.layers.0.dec_attn.qkv_net.weight" in untied


def test_tied_biases_listed_under_every_layer_are_read_once() -> None:
    """Hugging Face's own state dict also lists the shared u, v under every layer (as build_hf writes it)."""
    model = adaptive_model(untie_r=False)
    state = to_hf_state_dict(model)
    for i in range(model.config.n_layer):
        for key in ("r_w_bias", "r_r_bias"):
            state[f"transformer.layers.{i}.dec_attn.{key}"] = state[f"transformer.{key}"]
    assert_same_outputs(model, from_hf_state_dict(model.config, state).eval())
    del state["transformer.r_w_bias"], state["transformer.r_r_bias"]  # only the per-layer copies
    assert_same_outputs(model, from_hf_state_dict(model.config, state).eval())


def test_cluster_rows_are_reversed_in_the_hf_dict() -> None:
    model = adaptive_model()
    weight, bias = model.crit.cluster_weight.detach(), model.crit.cluster_bias.detach()
    assert weight.shape[0] == 2 and not torch.equal(weight[0], weight[1])  # so a reversal shows
    bias.data.copy_(torch.tensor([0.5, -0.25]))
    state = to_hf_state_dict(model)
    assert torch.equal(state["crit.cluster_weight"], weight.flip(0))
    assert torch.equal(state["crit.cluster_bias"], torch.tensor([-0.25, 0.5]))
    # and a Hugging Face dict is reversed on the way in
    hf_state = dict(state)
    hf_state["crit.cluster_bias"] = torch.tensor([1.0, 2.0])
    assert torch.equal(from_hf_state_dict(model.config, hf_state).crit.cluster_bias, torch.tensor([2.0, 1.0]))


def test_from_hf_state_dict_refuses_missing_weights() -> None:
    model = adaptive_model()
    state = to_hf_state_dict(model)
    del state["transformer.layers.1.pos_ff.CoreNet.0.weight"]
    state["transformer.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"missing: layers\.1\.pos_ff\.CoreNet\.0\.weight; unexpected: extra"):
        from_hf_state_dict(model.config, state)


# ------------------------------------------------------------------ running Hugging Face's model
def test_hf_compat_lets_type_as_take_a_dtype_and_restores_it() -> None:
    original = torch.Tensor.type_as
    x, y = torch.arange(3), torch.zeros(2, dtype=torch.float64)
    with hf_compat():
        assert torch.Tensor.type_as is not original
        assert x.type_as(dtype=torch.float32).dtype == torch.float32
        assert x.type_as(y).dtype == torch.float64  # the usual call still works
    assert torch.Tensor.type_as is original


def test_hf_compat_restores_type_as_when_the_block_raises() -> None:
    original = torch.Tensor.type_as
    with pytest.raises(RuntimeError, match="inside"), hf_compat():
        raise RuntimeError("inside")
    assert torch.Tensor.type_as is original


def test_build_hf_without_transformers(monkeypatch) -> None:
    monkeypatch.setattr(hf_module, "_hf_module", lambda: None)
    assert not hf_module.hf_available()
    with pytest.raises(ConfigError, match=r"transformers .* is not installed"):
        build_hf(adaptive_model())


@pytest.mark.hf4
@pytest.mark.parametrize("untie_r", [False, True], ids=["tied-r", "untied-r"])
def test_build_hf_gives_the_same_nll(untie_r: bool) -> None:
    pytest.importorskip("transformers.models.deprecated.transfo_xl.modeling_transfo_xl")
    from transformer_xl.experiments.bench import check_equal

    assert hf_module.hf_available()
    with pytest.raises(ConfigError, match="attn_type 0 only"):
        build_hf(tiny_model(attn_type=2, mem_len=0))
    model = adaptive_model(untie_r=untie_r)
    hf = build_hf(model)
    assert type(hf).__name__ == "TransfoXLLMHeadModel" and hf.config.untie_r is untie_r
    assert hf.config.cutoffs == [20, 40] and hf.config.mem_len == model.config.mem_len
    x = torch.randint(0, model.config.n_token, (2, 5), generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, model.config.n_token, (2, 5), generator=torch.Generator().manual_seed(4))
    assert check_equal(model, hf, x, y, n_seg=2) < 1e-5
    # the weights are copies: training Hugging Face's model leaves ours alone
    before = model.crit.cluster_weight.detach().clone()
    with torch.no_grad():
        hf.crit.cluster_weight.add_(1.0)
    assert torch.equal(model.crit.cluster_weight, before)


@pytest.mark.parametrize("change, message", [
    ({"layer_norm_epsilon": None}, "layer_norm_epsilon must be a number"),
    ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon must be a number"),
    ({"cutoffs": 7}, "cutoffs must be a list of integers, got 7"),
    ({"tgt_len": "x"}, "tgt_len"),
])
def test_config_values_of_the_wrong_type_are_config_errors(change, message) -> None:
    """Found by the fuzz campaign: these raised TypeError/ValueError from inside config_from_hf."""
    hf = {**hf_config_dict(tiny_model()), **change}
    with pytest.raises(ConfigError, match=message):
        config_from_hf(hf)
