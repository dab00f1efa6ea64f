"""save_pretrained/from_pretrained and official-format conversion (no pickle anywhere)."""

from __future__ import annotations

import json

import pytest
import torch

from txl import CheckpointError, ConfigError, TransformerXLLM, TXLConfig
from txl.convert import from_official, load_official, read_state_dict, to_official


def _model(**kw) -> TransformerXLLM:
    base = dict(n_token=60, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=4,
                cutoffs=[20, 40], div_val=2, tie_projs=[False, True, True], init_std=0.3)
    base.update(kw)
    torch.manual_seed(0)
    return TransformerXLLM(TXLConfig(**base)).eval()


def _same_outputs(a: TransformerXLLM, b: TransformerXLLM) -> None:
    x = torch.randint(0, 60, (2, 4), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a(x, x).nll, b(x, x).nll, atol=0, rtol=0)


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_save_load_round_trip(tmp_path, attn_type: int) -> None:
    model = _model(attn_type=attn_type)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = TransformerXLLM.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    assert loaded.crit.out_layers[1].weight is loaded.word_emb.emb_layers[1].weight  # ties restored
    _same_outputs(model, loaded)


def test_saves_built_lengths_after_reset_length(tmp_path) -> None:
    model = _model(attn_type=1)
    model.reset_length(mem_len=50)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["mem_len"] == 4
    TransformerXLLM.from_pretrained(tmp_path)


def test_corrupt_or_missing_files_fail_clearly(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        TransformerXLLM.from_pretrained(tmp_path / "nope")
    model = _model()
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        TransformerXLLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        TransformerXLLM.from_pretrained(tmp_path)


def test_weights_that_do_not_fit_the_config(tmp_path) -> None:
    _model().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["d_inner"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="wrong shape"):
        TransformerXLLM.from_pretrained(tmp_path)
    cfg["bogus"] = 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="bogus"):
        TransformerXLLM.from_pretrained(tmp_path)


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


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_whole_pickled_model_is_refused(tmp_path, capsys) -> None:
    torch.save({"model": Evil()}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="does not unpickle"):
        read_state_dict(tmp_path / "model.pt")
    assert "pwned" not in capsys.readouterr().out


def test_official_kwargs_with_none_lengths() -> None:
    kwargs, state = to_official(_model())
    kwargs.update(ext_len=None, adapt_inp=True)
    model = from_official(kwargs, state)
    assert model.config.ext_len == 0


def test_tied_names_with_different_values_are_refused() -> None:
    kwargs, state = to_official(_model())
    state = dict(state)
    state["crit.out_layers.1.weight"] = state["crit.out_layers.1.weight"] + 1.0
    with pytest.raises(CheckpointError, match="tied"):
        from_official(kwargs, state)
