"""The gating layers of the gated Transformer-XL (GTrXL; Parisotto et al., ICML 2020, Sec. 3.2).

A gate ``g(x, y)`` replaces the residual addition ``x + y`` of a sublayer, with ``x`` the sublayer's input and ``y``
its (ReLU'd) output. ``b_g`` is the gate bias, initialised to ``gate_bias`` (> 0: every gate starts near the
identity ``g(x, y) ~ x``, so that an untrained agent is close to a memory-less, Markov one; paper Sec. 3.2):

==================  =====================================================================================
gating              ``g(x, y)``
==================  =====================================================================================
``residual``        ``x + y``
``output``          ``x + sigmoid(W_g x - b_g) * y``
``highway``         ``sigmoid(W_g x + b_g) * x + (1 - sigmoid(W_g x + b_g)) * y``
``sigmoid-tanh``    ``x + sigmoid(W_g y - b_g) * tanh(U_g y)``
``gru``             ``r = sigmoid(W_r y + U_r x)``, ``z = sigmoid(W_z y + U_z x - b_g)``,
                    ``h^ = tanh(W_g y + U_g (r * x))``, ``(1 - z) * x + z * h^``
==================  =====================================================================================

Shapes: ``[..., D]`` in and out, ``D`` d_model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_xl.errors import ConfigError

GATINGS = ("residual", "output", "highway", "sigmoid-tanh", "gru")


class Gate(nn.Module):
    """One gate ``g(x, y)`` of the table above; ``b_g`` (``bias``) is a learned ``[D]`` vector."""

    def __init__(self, gating: str, d_model: int, gate_bias: float) -> None:
        super().__init__()
        if gating not in GATINGS:
            raise ConfigError(f"gating must be one of {', '.join(GATINGS)}, got {gating!r}")
        self.gating = gating
        n_w = {"residual": 0, "output": 1, "highway": 1, "sigmoid-tanh": 2, "gru": 3}[gating]
        # W (of y; of x for output and highway) and, for the GRU, U (of x): no biases but b_g, as in the paper
        self.w = nn.Linear(d_model, n_w * d_model, bias=False) if n_w else None
        self.u = nn.Linear(d_model, 2 * d_model, bias=False) if gating == "gru" else None  # [U_r; U_z]
        self.u_g = nn.Linear(d_model, d_model, bias=False) if gating == "gru" else None
        self.bias = nn.Parameter(torch.full((d_model,), float(gate_bias))) if n_w else None

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """``g(x, y)``: ``x`` the sublayer's input, ``y`` its output, ``[..., D]`` both."""
        if self.gating == "residual":
            return x + y
        assert self.w is not None and self.bias is not None  # pragma: no mutate (type narrowing: set unless residual)
        if self.gating == "output":
            return x + torch.sigmoid(self.w(x) - self.bias) * y
        if self.gating == "highway":
            carry = torch.sigmoid(self.w(x) + self.bias)
            return carry * x + (1.0 - carry) * y
        if self.gating == "sigmoid-tanh":
            gate_in, cand = self.w(y).chunk(2, dim=-1)  # W_g y, U_g y
            return x + torch.sigmoid(gate_in - self.bias) * torch.tanh(cand)
        assert self.u is not None and self.u_g is not None  # pragma: no mutate (type narrowing: both set for the GRU)
        wr, wz, wg = self.w(y).chunk(3, dim=-1)  # W_r y, W_z y, W_g y
        ur, uz = self.u(x).chunk(2, dim=-1)  # U_r x, U_z x
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.bias)
        cand = torch.tanh(wg + self.u_g(r * x))
        return (1.0 - z) * x + z * cand
