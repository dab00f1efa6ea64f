"""TXLConfig (official names, frozen, validation with clear errors, JSON round-trip) and the per-forward Lengths."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_xl import ConfigError, Lengths, TransformerXLLM, TXLConfig
from transformer_xl.store.files import write_text


def test_official_constructor_names_are_fields() -> None:
    official = ["n_token", "n_layer", "n_head", "d_model", "d_head", "d_inner", "dropout", "dropatt",
                "tie_weight", "d_embed", "div_val", "tie_projs", "pre_lnorm", "tgt_len", "ext_len", "mem_len",
                "cutoffs", "same_length", "attn_type", "clamp_len", "sample_softmax"]
    names = {f.name for f in dataclasses.fields(TXLConfig)}
    assert set(official) <= names
    assert "untie_r" in names


def test_json_round_trip(tmp_path) -> None:
    cfg = TXLConfig(n_token=100, cutoffs=[10, 50], div_val=2, tie_projs=[False, True, True], d_embed=64,
                    untie_r=True, same_length=True, clamp_len=30)
    path = write_text(tmp_path / "config.json", cfg.to_json())
    assert TXLConfig.from_json(path) == cfg
    assert TXLConfig.from_dict(cfg.to_dict()) == cfg
    assert TXLConfig.from_json(cfg.to_json()) == cfg


def test_d_embed_defaults_to_d_model() -> None:
    assert TXLConfig(n_token=10, d_model=48, d_head=12).d_embed == 48


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(mem_len=-1), "mem_len"),
        (dict(ext_len=-2), "ext_len"),
        (dict(n_head=0), "n_head"),
        (dict(dropout=1.0), "dropout"),
        (dict(attn_type=7), "attn_type"),
        (dict(cutoffs=[50, 20]), "increasing"),
        (dict(cutoffs=[20, 100]), "n_token"),
        (dict(cutoffs=[20], tie_projs=[False, True, True]), "tie_projs"),
        (dict(attn_type=3, d_model=64, n_head=4, d_head=8), "n_head\\*d_head"),
        (dict(d_model=33, d_head=11, n_head=3), "even"),
        (dict(same_length=True, mem_len=0), "same_length"),
        (dict(untie_r=True, attn_type=1), "untie_r"),
        (dict(div_val=4, cutoffs=[10, 20, 30, 40], d_embed=16), "div_val"),
        (dict(sample_softmax=10, div_val=2, cutoffs=[20]), "sample_softmax"),
        (dict(init="xavier"), "init"),
        (dict(init=3), "init"),
        (dict(cutoffs=["a"]), r"cutoffs must be a list of integers, got \['a'\]"),
        (dict(cutoffs="20"), "cutoffs must be a list of integers"),
        (dict(cutoffs=[20.5]), "cutoffs must be a list of integers"),
        (dict(cutoffs=[True]), "cutoffs must be a list of integers"),
        (dict(cutoffs=[20], tie_projs=["yes", 1]), "tie_projs must be a list of true/false values"),
        (dict(clamp_len=-100), r"clamp_len must be an integer >= -1 \(-1 or 0: no clamping\), got -100"),
        (dict(clamp_len=2.5), "clamp_len must be an integer"),
        (dict(sample_softmax=-2), "sample_softmax must be an integer >= -1"),
        (dict(dropout=float("nan")), r"dropout must be in \[0, 1\), got nan"),
        (dict(dropatt="0.1"), "dropatt must be in"),
        (dict(init_std=float("inf")), "init_std must be a finite number >= 0"),
        (dict(init_range=-0.1), "init_range must be a finite number >= 0"),
        (dict(proj_init_std=True), "proj_init_std must be a finite number >= 0"),
        (dict(tie_weight=1), "tie_weight must be true or false"),
        (dict(pre_lnorm="no"), "pre_lnorm must be true or false"),
        (dict(attn_type=True), "attn_type"),
        (dict(n_layer=2.0), "n_layer must be a positive integer"),
    ],
)
def test_impossible_configs_fail_clearly(kwargs, message) -> None:
    base = dict(n_token=100, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32)
    base.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        TXLConfig(**base)


@pytest.mark.parametrize("attn_type", [0, 1, 2])
def test_official_allows_d_model_other_than_heads(attn_type: int) -> None:
    """The official code projects n_head*d_head back to d_model, so they may differ for attn_type 0-2."""
    cfg = TXLConfig(n_token=10, d_model=32, n_head=3, d_head=7, d_inner=16, n_layer=1, attn_type=attn_type)
    model = TransformerXLLM(cfg)
    assert model.layers[0].dec_attn.qkv_net.weight.shape == (3 * 21, 32)
    assert model.layers[0].dec_attn.o_net.weight.shape == (32, 21)
    out = model(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    assert out.nll.shape == (2, 5) and out.mems[0].shape == (2, 5, 32)


def test_unknown_key_is_rejected_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown model config key 'mem_lenn' \(did you mean 'mem_len'\?\)"):
        TXLConfig.from_dict({"n_token": 10, "mem_lenn": 5})
    with pytest.raises(ConfigError, match="n_token"):
        TXLConfig.from_dict({"n_layer": 2})


def test_bad_json(tmp_path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        TXLConfig.from_json(bad)
    with pytest.raises(ConfigError, match="not found"):
        TXLConfig.from_json(tmp_path / "missing.json")


def test_config_is_frozen_and_replace_validates() -> None:
    cfg = TXLConfig(n_token=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.mem_len = 5  # type: ignore[misc]
    adaptive = TXLConfig(n_token=100, cutoffs=[10, 50], tie_projs=[False, True])
    assert adaptive.cutoffs == (10, 50) and hash(adaptive) == hash(TXLConfig.from_dict(adaptive.to_dict()))
    assert adaptive.to_dict()["cutoffs"] == [10, 50]  # JSON values
    assert cfg.replace(mem_len=5).mem_len == 5 and cfg.mem_len == 128
    with pytest.raises(ConfigError, match="mem_len"):
        cfg.replace(mem_len=-1)


def test_lengths_default_to_the_config_and_are_validated() -> None:
    cfg = TXLConfig(n_token=10, mem_len=8, ext_len=2, clamp_len=5, same_length=True)
    assert cfg.lengths() == Lengths(mem_len=8, ext_len=2, clamp_len=5, same_length=True)
    assert cfg.lengths(mem_len=100, clamp_len=None) == Lengths(mem_len=100, ext_len=2, clamp_len=5, same_length=True)
    for bad, match in ((dict(mem_len=-1), "mem_len"), (dict(ext_len=-1), "ext_len"), (dict(clamp_len=1.5), "clamp"),
                       (dict(mem_len=0), "same_length"), (dict(same_length="yes"), "same_length")):
        with pytest.raises(ConfigError, match=match):
            cfg.lengths(**bad)


def test_max_context_is_bounded_only_for_learned_absolute_positions() -> None:
    assert TXLConfig(n_token=10, attn_type=3, d_model=64, n_head=2, d_head=32, tgt_len=8, mem_len=4).max_context == 12
    for attn_type in (0, 1, 2):
        assert TXLConfig(n_token=10, attn_type=attn_type).max_context is None


_SHAPES = [dict(), dict(d_embed=8), dict(d_embed=8, tie_projs=[True]), dict(tie_weight=False, untie_r=True),
           dict(cutoffs=[10, 30], d_embed=8, tie_projs=[False, True, True]), dict(cutoffs=[10, 30], tie_projs=[False]),
           dict(cutoffs=[10, 30], div_val=2, tie_projs=[False, True, True]),
           dict(cutoffs=[10, 30], div_val=2, tie_weight=False, tie_projs=[False, False, True]),
           dict(attn_type=1), dict(attn_type=2, sample_softmax=5),
           dict(attn_type=3, sample_softmax=5, tie_weight=False)]


@pytest.mark.parametrize("kw", _SHAPES)
def test_parameter_count_from_the_config_alone_equals_the_models(kw) -> None:
    cfg = TXLConfig(n_token=50, n_layer=3, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=6, **kw)
    with torch.device("meta"):
        model = TransformerXLLM(cfg)
    assert cfg.parameter_count() == model.num_parameters()
    assert cfg.parameter_count(tied_names=True) == sum(t.numel() for t in model.state_dict().values())
    assert [tuple(e.weight.shape) for e in model.word_emb.emb_layers] == cfg.cluster_shapes()


def test_parameter_count_of_a_huge_config_is_instant() -> None:
    cfg = TXLConfig(n_token=10**9, n_layer=100000, d_model=10**4, n_head=10, d_head=1000, d_inner=4 * 10**4)
    assert cfg.parameter_count() > 10**14


def test_off_values_and_list_forms_keep_their_meaning() -> None:
    base = dict(n_token=100, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32)
    x = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))

    def nll(**kw) -> torch.Tensor:
        torch.manual_seed(0)
        model = TransformerXLLM(TXLConfig(**base, init_std=0.5, **kw)).eval()
        assert not hasattr(model, "sampler") and hasattr(model, "crit")  # sample_softmax off: the full softmax
        return model(x, x).nll

    unclamped = nll(clamp_len=1000)
    for off in (-1, 0):  # the official clamp_len <= 0 and sample_softmax <= 0 mean "off"
        torch.testing.assert_close(nll(clamp_len=off, sample_softmax=off), unclamped, rtol=0, atol=0)
    assert (nll(clamp_len=1) - unclamped).abs().max() > 1e-4  # a clamp that acts changes the scores
    cfg = TXLConfig(**base, cutoffs=[20, 50], tie_projs=[0, 1, True])
    assert cfg.cutoffs == (20, 50) and cfg.tie_projs == (False, True, True)


def test_a_config_nested_deeper_than_the_parser_recurses_is_one_line(tmp_path) -> None:
    """``config.json`` of 100,000 ``[`` (or an object that deep): a one-line :class:`ConfigError`, not the parser's
    :class:`RecursionError`; a value nested, or a string a megabyte long, is refused in a short line before any field's
    check quotes it."""
    for i, text in enumerate(["[" * 100_000, '{"n_token": ' + "[" * 100_000, "{" + '"a": {' * 60_000]):
        path = write_text(tmp_path / f"{i}.json", text)
        with pytest.raises(ConfigError, match="is nested too deeply to be read") as info:
            TXLConfig.from_json(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="is nested too deeply to be read"):
        TXLConfig.from_json("{" + '"a": {' * 60_000)
    deep: list = [10]
    for _ in range(900):
        deep = [deep]
    for key, value, kind in (("n_token", deep, "a number, true/false, null or a name"),
                             ("cutoffs", [deep], "a list of numbers"), ("init", "x" * 10**6, "a number"),
                             ("mem_len", list(range(10**5)), "a number"), ("d_model", {"a": 1}, "a number")):
        with pytest.raises(ConfigError, match=rf"^model config key '{key}' must be {kind}") as info:
            TXLConfig.from_dict({"n_token": 10, key: value})
        assert len(str(info.value)) < 200
    with pytest.raises(ConfigError, match=r"^unknown model config key 'xxxxx") as info:
        TXLConfig.from_dict({"n_token": 10, "x" * 10**6: 1})
    assert len(str(info.value)) < 200
    assert TXLConfig.from_dict({"n_token": 10, "cutoffs": [4], "tie_projs": [True, 0], "d_embed": None}).cutoffs == (4,)
