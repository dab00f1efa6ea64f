"""Transformer-XL as a sequence module over vectors, for agents and streams (GTrXL; Parisotto et al., ICML 2020).

``TransformerXLSequence(config)(x, state, reset)`` maps observations already embedded as vectors, ``x [B, T, d_in]``,
to features ``[B, T, d_model]`` with the language model's memory: each layer attends over ``[SG(m); h]`` (paper
Sec. 3.2) with relative positions (Sec. 3.3, ``clamp_len``), and the next memory keeps the last ``mem_len`` layer
inputs without gradient. The layers are the language model's own (:class:`~transformer_xl.model.attention.DecoderLayer`
and its one attention); what agents add:

* **episode boundaries.** ``reset[b, t]`` is True when step ``t`` of row ``b`` starts a new episode. A query attends
  only to keys of its own episode, inside the segment and in the memory: the keys' episode ids ``[B, K]`` against the
  queries' ``[B, Q]`` give a mask per row ``[B, 1, Q, K]`` (:func:`~transformer_xl.model.memory.episode_mask`), and
  the state carries which memory positions still belong to the row's running episode (``valid [B, M]``);
* **state as plain tensors** (:class:`SequenceState`): ``mems [B, n_layer, M, d_model]`` and ``valid [B, M]``, of
  fixed shapes (``init_state`` gives ``M = mem_len`` positions, all invalid), for a rollout buffer to store;
* **one-step acting** (:meth:`TransformerXLSequence.step`), the same computation for ``T = 1``; with ``window``
  (the default) a step of a segment sees at most the ``mem_len`` steps before it, as a step does when acting, so
  that the learning pass over a rollout's segment recomputes the acting-time outputs;
* **GTrXL** (``reorder``, ``gating``): identity-map reordering (the layer norm inside the residual branch, the
  language model's ``pre_lnorm``, and a ReLU on the branch's output), and a gate in place of each residual addition
  (:mod:`~transformer_xl.model.gating`; the gate bias starts the network near the identity, a Markov policy).

With ``reorder=False``, ``gating="residual"`` and ``window=False`` this is exactly the language model's (post-LN)
layers.

Shapes: ``B`` batch, ``T = Q`` segment length, ``M`` memory length, ``K = M + Q``, ``L`` n_layer, ``D`` d_model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_xl.errors import ConfigError, check_int, did_you_mean
from transformer_xl.model.attention import DecoderLayer
from transformer_xl.model.config import TXLConfig
from transformer_xl.model.fastpath import CompactDropout
from transformer_xl.model.gating import GATINGS, Gate
from transformer_xl.model.memory import additive_mask, episode_mask, kept_range, update_mems
from transformer_xl.model.positional import RelativeSinusoid
from transformer_xl.model.segment import Segment


@dataclass(frozen=True)
class SequenceConfig:
    """Hyper-parameters of a :class:`TransformerXLSequence` (the language model's names where they exist); frozen.

    ``window``: every step sees at most the ``mem_len`` steps before it, in a segment as when acting one step at a
    time (so that a learning pass over a segment recomputes the acting-time outputs); without it a step also sees
    every earlier step of its segment, as in the language model. ``gate_bias`` is the gates' initial ``b_g``
    (Parisotto et al. use 2 for a near-identity start); ``reorder`` is the identity-map reordering; every ``gating``
    but ``residual`` needs it."""

    d_in: int
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    d_head: int = 16
    d_inner: int = 256
    dropout: float = 0.0
    dropatt: float = 0.0
    mem_len: int = 16
    clamp_len: int = -1
    window: bool = True
    untie_r: bool = False
    reorder: bool = True
    gating: str = "gru"
    gate_bias: float = 2.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_int("d_in", self.d_in, 1)
        for name in ("reorder", "window"):  # before the layers' config, which would name reorder pre_lnorm
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        self.layers_config()  # the layers' fields, validated as the language model's
        if self.gating not in GATINGS:
            raise ConfigError(f"gating must be one of {', '.join(GATINGS)}, got {self.gating!r}")
        if self.gating != "residual" and not self.reorder:
            raise ConfigError(f"gating {self.gating!r} needs reorder=True (the gated layers of GTrXL take the "
                              "layer norm inside the residual branch)")
        if isinstance(self.gate_bias, bool) or not isinstance(self.gate_bias, (int, float)):
            raise ConfigError(f"gate_bias must be a number, got {self.gate_bias!r}")

    def layers_config(self, n_token: int = 1) -> TXLConfig:
        """The language model's config with these layers (relative positions, attn_type 0): ``n_token`` words."""
        return TXLConfig(n_token=n_token, n_layer=self.n_layer, n_head=self.n_head, d_model=self.d_model,
                         d_head=self.d_head, d_inner=self.d_inner, dropout=self.dropout, dropatt=self.dropatt,
                         pre_lnorm=self.reorder, mem_len=self.mem_len, clamp_len=self.clamp_len,
                         untie_r=self.untie_r, init_std=self.init_std)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SequenceConfig:
        """The config of :meth:`to_dict`'s output; an unknown field is a one-line :class:`ConfigError`."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in data:
            if name not in known:
                raise ConfigError(f"unknown SequenceConfig field {name!r}{did_you_mean(name, known)}")
        return cls(**data)


@dataclass
class SequenceState:
    """The memory a segment leaves for the next: ``mems [B, L, M, D]`` (every layer's input at the last ``M``
    steps, without gradient) and ``valid [B, M]`` (True where that step belongs to the row's running episode)."""

    mems: Tensor
    valid: Tensor


@dataclass
class SequenceOutput:
    """``output [B, T, D]``, the last layer's features, and the ``state`` for the next segment."""

    output: Tensor
    state: SequenceState


class TransformerXLSequence(nn.Module):
    """Transformer-XL (or GTrXL) over vector sequences with episode resets; see the module docstring."""

    def __init__(self, config: SequenceConfig) -> None:
        super().__init__()
        self.config = cfg = config
        txl = cfg.layers_config()
        self.lengths = txl.lengths()  # pragma: no mutate (read by the inference cache and attn_type 1 only, not here)
        self.in_proj = nn.Linear(cfg.d_in, cfg.d_model)
        self.drop = CompactDropout(cfg.dropout)  # the language model's dropout: the same draws
        self.pos_enc = RelativeSinusoid(txl)
        self.layers = nn.ModuleList(
            DecoderLayer(i, cfg.n_head, cfg.d_model, cfg.d_head, cfg.d_inner, cfg.dropout, cfg.dropatt,
                         cfg.reorder, pos_proj=True)
            for i in range(cfg.n_layer)
        )
        # two gates per layer (after the attention, after the feed-forward); none for the LM's post-LN layers
        self.gates = nn.ModuleList(
            nn.ModuleList(Gate(cfg.gating, cfg.d_model, cfg.gate_bias) for _ in range(2))
            for _ in range(cfg.n_layer if cfg.reorder else 0)
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The language model's initialisation for the layers (N(0, init_std) weights, zero biases, ``u``, ``v``
        N(0, init_std)); the input projection and the gates keep PyTorch's default, the gate biases ``gate_bias``."""
        std = self.config.init_std
        for layer in self.layers:
            for module in layer.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, std)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
        nn.init.normal_(self.pos_enc.r_w_bias, 0.0, std)
        nn.init.normal_(self.pos_enc.r_r_bias, 0.0, std)

    def init_state(self, batch_size: int) -> SequenceState:
        """A fresh state: ``mem_len`` zero positions per layer, none of them valid (fixed shapes for a buffer)."""
        p = self.in_proj.weight
        cfg = self.config
        return SequenceState(mems=p.new_zeros(batch_size, cfg.n_layer, cfg.mem_len, cfg.d_model),
                             valid=torch.zeros(batch_size, cfg.mem_len, dtype=torch.bool, device=p.device))

    def forward(self, x: Tensor, state: SequenceState | None = None, reset: Tensor | None = None) -> SequenceOutput:
        """One segment: ``x [B, T, d_in]``, ``state`` from the previous segment (None: fresh), ``reset [B, T]``
        (bool; True where a step starts a new episode; None: no boundary). The inputs are not modified."""
        bsz, qlen = self._check(x, state, reset)
        state = self.init_state(bsz) if state is None else state
        reset = torch.zeros(bsz, qlen, dtype=torch.bool, device=x.device) if reset is None else reset
        cfg = self.config
        mems = list(state.mems.detach().unbind(1))  # L x [B, M, D]: SG(m)
        mlen = state.mems.size(2)
        h = self.in_proj(x)  # [B, Q, D]
        blocked, key_episode = episode_mask(reset=reset, valid=state.valid, mem_len=cfg.mem_len,
                                           window=cfg.window)  # [B, Q, K], [B, K]
        dtype, device = h.dtype, h.device
        seg = Segment(qlen=qlen, mlen=mlen, lengths=self.lengths, pos=self.pos_enc,
                      mask_bias=additive_mask(blocked[:, None], dtype),  # [B, 1, Q, K]
                      make_table=lambda: self.pos_enc.table(qlen + mlen, cfg.clamp_len, dtype, device))
        _ = seg.table  # made now: in training R's dropout draws come before those of h, as in the LM
        if self.training:
            h = self.drop(h)
        hids: list[Tensor] = []  # every layer's input: what the next memory keeps
        for i, layer in enumerate(self.layers):
            hids.append(h)
            h = self._layer(i, layer, h, mems[i], seg)
        new_mems = update_mems(hids, mems, mlen=mlen, qlen=qlen, mem_len=cfg.mem_len, ext_len=0)  # SG, last mem_len
        beg, end = kept_range(mlen=mlen, qlen=qlen, mem_len=cfg.mem_len, ext_len=0)
        # a kept step stays valid if it belongs to the episode the row is in at the segment's last step
        valid = (key_episode == key_episode[:, -1:])[:, beg:end]  # [B, M']
        return SequenceOutput(output=h, state=SequenceState(torch.stack(new_mems, dim=1), valid))

    def step(self, x: Tensor, state: SequenceState | None = None,
             reset: Tensor | None = None) -> tuple[Tensor, SequenceState]:
        """One step for acting: ``x [B, d_in]``, ``reset [B]`` -> features ``[B, D]`` and the next state; the same
        computation as :meth:`forward` on a segment of one step."""
        out = self(x[:, None], state, None if reset is None else reset[:, None])
        return out.output[:, 0], out.state

    def _layer(self, i: int, layer: DecoderLayer, h: Tensor, mem: Tensor, seg: Segment) -> Tensor:
        """Layer ``i``: the language model's layer, or (reordered) each branch ReLU'd and gated into ``h``."""
        if not self.config.reorder:
            return layer(h, mem, seg)
        attn_gate, ff_gate = self.gates[i]
        h = attn_gate(h, F.relu(layer.dec_attn.branch(h, mem, seg)))  # g(h, ReLU(MHA(LN([SG(m); h]))))
        return ff_gate(h, F.relu(layer.pos_ff.branch(h)))  # g(h, ReLU(FF(LN(h))))

    def _check(self, x: Tensor, state: SequenceState | None, reset: Tensor | None) -> tuple[int, int]:
        """``(B, T)``, or a one-line :class:`ConfigError` for inputs of the wrong shape."""
        cfg = self.config
        if x.dim() != 3 or x.size(-1) != cfg.d_in:
            raise ConfigError(f"x must be [batch, time, d_in={cfg.d_in}], got shape {tuple(x.shape)}")
        bsz, qlen, _ = x.shape
        if reset is not None and (reset.shape != (bsz, qlen) or reset.dtype != torch.bool):
            raise ConfigError(f"reset must be a bool tensor [batch={bsz}, time={qlen}], got {reset.dtype} "
                              f"{tuple(reset.shape)}")
        if state is not None:
            m = state.mems
            if m.dim() != 4 or m.shape[:2] != (bsz, cfg.n_layer) or m.size(3) != cfg.d_model:
                raise ConfigError(f"state.mems must be [batch={bsz}, n_layer={cfg.n_layer}, M, d_model="
                                  f"{cfg.d_model}], got shape {tuple(m.shape)}")
            if state.valid.shape != (bsz, m.size(2)) or state.valid.dtype != torch.bool:
                raise ConfigError(f"state.valid must be a bool tensor [batch={bsz}, M={m.size(2)}], got "
                                  f"{state.valid.dtype} {tuple(state.valid.shape)}")
        return bsz, qlen
