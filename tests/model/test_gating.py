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


def _mixed_bias_gate(gating: str) -> Gate:
    """A gate whose ``b_g`` has mixed signs and sizes per feature (a wrong sign or a misplaced element shows)."""
    gate = _gate(gating, 0.0)
    if gate.bias is not None:
        with torch.no_grad():
            gate.bias.copy_(torch.linspace(-2.0, 3.0, D))
    return gate


def _paper_gate(gating: str, gate: Gate, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``g(x, y)`` of Parisotto et al. (2020), Sec. 3.2, written out from the gate's own ``W``, ``U`` and ``b_g``;
    ``x`` is the sublayer's input (the stream), ``y`` the sublayer's (ReLU'd) output."""
    sig, tanh = torch.sigmoid, torch.tanh
    if gating == "residual":  # the plain residual connection the gates replace
        return x + y
    b_g = gate.bias
    if gating == "output":  # x + sigma(W_g x - b_g) * y
        w_g = gate.w.weight
        return x + sig(x @ w_g.T - b_g) * y
    if gating == "highway":  # sigma(W_g x + b_g) * x + (1 - sigma(W_g x + b_g)) * y
        w_g = gate.w.weight
        return sig(x @ w_g.T + b_g) * x + (1 - sig(x @ w_g.T + b_g)) * y
    if gating == "sigmoid-tanh":  # x + sigma(W_g y - b) * tanh(U_g y)
        w_g, u_g = gate.w.weight.split(D)
        return x + sig(y @ w_g.T - b_g) * tanh(y @ u_g.T)
    # GRU: r = sigma(W_r y + U_r x), z = sigma(W_z y + U_z x - b_g), h^ = tanh(W_g y + U_g (r * x)),
    # g = (1 - z) * x + z * h^
    w_r, w_z, w_g = gate.w.weight.split(D)
    u_r, u_z = gate.u.weight.split(D)
    u_g = gate.u_g.weight
    r = sig(y @ w_r.T + x @ u_r.T)
    z = sig(y @ w_z.T + x @ u_z.T - b_g)
    h = tanh(y @ w_g.T + (r * x) @ u_g.T)
    return (1 - z) * x + z * h


@pytest.mark.parametrize("gating", GATINGS)
def test_each_gate_is_the_papers_equation(gating: str) -> None:
    """Each gate equals its equation of the paper (Sec. 3.2), written out above from the gate's own weights and a
    ``b_g`` of mixed signs, to fp32 rounding; and swapping ``x`` and ``y`` changes it (the test can tell them apart)."""
    x, y = _xy()
    gate = _mixed_bias_gate(gating)
    with torch.no_grad():
        want = _paper_gate(gating, gate, x, y)
        torch.testing.assert_close(gate(x, y), want, rtol=1e-6, atol=1e-6)
        if gating != "residual":  # x + y is symmetric
            assert not torch.allclose(gate(y, x), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("gating", [g for g in GATINGS if g != "residual"])
def test_a_positive_gate_bias_leans_towards_the_identity(gating: str) -> None:
    """The sign of ``b_g`` (paper Sec. 3.2): raising it moves every gate towards ``g(x, y) = x``, feature by feature
    (the gate starts near the identity for ``gate_bias`` > 0), lowering it away."""
    x, y = _xy()
    gate = _gate(gating, 0.0)

    def distance(bias: float) -> torch.Tensor:
        with torch.no_grad():
            gate.bias.fill_(bias)
            return (gate(x, y) - x).abs().sum()

    assert distance(4.0) < distance(1.0) < distance(0.0) < distance(-1.0)


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
