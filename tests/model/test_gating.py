"""The gates of GTrXL: each equals its formula of Parisotto et al. (2020, Sec. 3.2), and a large gate bias makes it
the identity ``g(x, y) = x``."""

from __future__ import annotations

import pytest
import torch

from transformer_xl import ConfigError
from transformer_xl.model.gating import GATINGS, Gate

D = 6


def _xy() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, D, generator=gen), torch.randn(2, 3, D, generator=gen)


def _gate(gating: str, bias: float) -> Gate:
    torch.manual_seed(0)
    return Gate(gating, D, bias)


def test_each_gate_is_its_formula() -> None:
    x, y = _xy()
    sig, tanh = torch.sigmoid, torch.tanh
    g = _gate("output", 0.5)
    torch.testing.assert_close(g(x, y), x + sig(x @ g.w.weight.T - 0.5) * y)
    g = _gate("highway", 0.5)
    c = sig(x @ g.w.weight.T + 0.5)
    torch.testing.assert_close(g(x, y), c * x + (1 - c) * y)
    g = _gate("sigmoid-tanh", 0.5)
    wg, ug = g.w.weight[:D], g.w.weight[D:]
    torch.testing.assert_close(g(x, y), x + sig(y @ wg.T - 0.5) * tanh(y @ ug.T))
    g = _gate("gru", 0.5)
    w_r, w_z, w_g = g.w.weight.split(D)
    u_r, u_z = g.u.weight.split(D)
    r = sig(y @ w_r.T + x @ u_r.T)
    z = sig(y @ w_z.T + x @ u_z.T - 0.5)
    h = tanh(y @ w_g.T + (r * x) @ g.u_g.weight.T)
    torch.testing.assert_close(g(x, y), (1 - z) * x + z * h)
    torch.testing.assert_close(_gate("residual", 0.5)(x, y), x + y)


@pytest.mark.parametrize("gating", [g for g in GATINGS if g != "residual"])
def test_a_large_gate_bias_passes_the_input_on(gating: str) -> None:
    x, y = _xy()
    torch.testing.assert_close(_gate(gating, 30.0)(x, y), x)
    assert not torch.allclose(_gate(gating, 0.0)(x, y), x, atol=1e-2)


def test_the_gate_bias_is_learned_and_starts_at_gate_bias() -> None:
    g = _gate("gru", 2.0)
    assert g.bias.requires_grad and torch.equal(g.bias, torch.full((D,), 2.0))
    assert _gate("residual", 2.0).bias is None


@pytest.mark.parametrize("gating,shapes", [
    ("residual", {}),
    ("output", {"w.weight": (D, D), "bias": (D,)}),
    ("highway", {"w.weight": (D, D), "bias": (D,)}),
    ("sigmoid-tanh", {"w.weight": (2 * D, D), "bias": (D,)}),
    ("gru", {"w.weight": (3 * D, D), "u.weight": (2 * D, D), "u_g.weight": (D, D), "bias": (D,)}),
])
def test_each_gate_holds_its_formulas_matrices_and_no_other_tensor(gating: str, shapes: dict) -> None:
    """The paper's W and U without biases, and b_g: nothing else in the state dict (a residual gate holds nothing,
    not an empty matrix), so that saved models of every gating have the same keys."""
    state = _gate(gating, 2.0).state_dict()
    assert {name: tuple(t.shape) for name, t in state.items()} == shapes


def test_an_unknown_gating_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as info:
        Gate("lstm", D, 2.0)
    assert str(info.value) == "gating must be one of residual, output, highway, sigmoid-tanh, gru, got 'lstm'"
