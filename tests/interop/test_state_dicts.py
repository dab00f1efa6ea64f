"""Reading other libraries' state dicts without unpickling code; tied names filled in or refused."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import adaptive_model
from transformer_xl import CheckpointError
from transformer_xl.interop.official import from_official, to_official
from transformer_xl.interop.state_dicts import check_size, fill_tied, own_tensors, read_state_dict


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_whole_pickled_model_is_refused(tmp_path, capsys) -> None:
    torch.save({"model": Evil()}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="does not unpickle"):
        read_state_dict(tmp_path / "model.pt")
    assert "pwned" not in capsys.readouterr().out


def test_tied_names_with_different_values_are_refused() -> None:
    kwargs, state = to_official(adaptive_model())
    state = dict(state)
    state["crit.out_layers.1.weight"] = state["crit.out_layers.1.weight"] + 1.0
    with pytest.raises(CheckpointError, match="tied"):
        from_official(kwargs, state)


def test_read_state_dict_formats(tmp_path) -> None:
    """safetensors and plain ``torch.save``'d dicts (also wrapped as ``{"state_dict": ...}`` with ``module.``)."""
    from transformer_xl.store.tensors import save_tensors

    state = {"a.weight": torch.randn(3, 2), "b": torch.zeros(4)}
    save_tensors(state, tmp_path / "s.safetensors")
    torch.save({"state_dict": {"module." + k: v for k, v in state.items()}}, tmp_path / "w.pt")
    for path in (tmp_path / "s.safetensors", tmp_path / "w.pt"):
        got = read_state_dict(path)
        assert set(got) == set(state) and all(torch.equal(got[k], state[k]) for k in state)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="state dict of tensors"):
        read_state_dict(tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="not found"):
        read_state_dict(tmp_path / "missing.pt")


def test_fill_tied_adds_the_missing_names_of_tied_parameters() -> None:
    model = adaptive_model()
    state = model.state_dict()
    tied = "crit.out_layers.1.weight"  # tied to word_emb.emb_layers.1.weight
    assert state[tied].data_ptr() == state["word_emb.emb_layers.1.weight"].data_ptr()
    partial = {k: v for k, v in state.items() if k != tied}
    filled = fill_tied(model, partial)
    assert torch.equal(filled[tied], state[tied]) and set(filled) == set(state)


def test_non_finite_tensors_are_refused_in_either_format(tmp_path) -> None:
    from safetensors.torch import save_file

    state = {"w": torch.tensor([0.0, float("nan")]), "ids": torch.arange(2)}
    torch.save(state, tmp_path / "s.pt")
    save_file(state, str(tmp_path / "s.safetensors"))
    for name in ("s.pt", "s.safetensors"):
        with pytest.raises(CheckpointError, match=r"tensor 'w' holds non-finite values \(1 NaN"):
            read_state_dict(tmp_path / name)


def test_a_config_larger_than_the_file_is_refused_before_building() -> None:
    model = adaptive_model()
    state = dict(model.state_dict())
    check_size(model.config, state, "f")  # as many numbers as the model's parameters (and more: tied names)
    with pytest.raises(CheckpointError, match=r"f holds [\d,]+ numbers but its config \(n_layer=3, .*the config does"):
        check_size(model.config.replace(n_layer=3), state, "f")


def test_own_tensors_gives_every_tied_name_its_own_copy(tmp_path) -> None:
    from safetensors.torch import load_file

    from transformer_xl.store.tensors import save_tensors

    model = adaptive_model()  # tie_weight and tied projections
    _, state = to_official(model)
    def ptr(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    assert ptr(state["crit.out_layers.1.weight"]) == ptr(state["word_emb.emb_layers.1.weight"])
    own = own_tensors(state)
    assert own.keys() == state.keys() and own["word_emb.emb_layers.1.weight"] is state["word_emb.emb_layers.1.weight"]
    assert ptr(own["crit.out_layers.1.weight"]) != ptr(own["word_emb.emb_layers.1.weight"])
    save_tensors(state, tmp_path / "aliased.safetensors")
    save_tensors(own, tmp_path / "own.safetensors")
    assert "crit.out_layers.1.weight" not in load_file(str(tmp_path / "aliased.safetensors"))
    plain = load_file(str(tmp_path / "own.safetensors"))  # what a reader without txl gets
    assert plain.keys() == state.keys()
    for name, t in state.items():
        assert torch.equal(plain[name], t), name


def test_a_damaged_torch_file_is_one_checkpoint_error(tmp_path) -> None:
    """Found by the fuzz campaign: one flipped byte of a torch.save file made torch.load raise IndexError."""
    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    blob = bytearray((tmp_path / "state.pt").read_bytes())
    blob[0] ^= 1  # no longer a zip archive: torch.load reads it as a legacy pickle stream
    (tmp_path / "bad.pt").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError) as exc:
        read_state_dict(tmp_path / "bad.pt")
    assert "\n" not in str(exc.value) and str(tmp_path / "bad.pt") in str(exc.value)
