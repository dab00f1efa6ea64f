"""TorchRL's recurrent-module interface over :class:`~transformer_xl.model.TransformerXLSequence` (GTrXL).

Installed with the ``rl`` extra (``pip install -e '.[rl]'`` in the checkout: ``torchrl``, ``tensordict``, ``gymnasium``,
``popgym``). The module follows TorchRL's own recurrent modules (``torchrl.modules.LSTMModule``): a
``TensorDictModuleBase`` whose memory travels in the tensordict under ``recurrent_state_*`` keys, read from the root and
written under ``"next"``, with ``is_init`` (from ``torchrl.envs.InitTracker``) marking the first step of an episode, and
a :meth:`TransformerXLModule.make_tensordict_primer` for the environment so that the collector carries the state::

    env = TransformedEnv(env, Compose(InitTracker(), ...))
    memory = TransformerXLModule(SequenceConfig(d_in=32, mem_len=16), in_key="embed", out_key="features")
    env.append_transform(memory.make_tensordict_primer())

Two modes, as TorchRL's (``torchrl.modules.set_recurrent_mode``):

* **sequential** (acting, the default): every entry of the tensordict is one step; the state is read at the root
  (zeros from the primer: a fresh, all-invalid memory) and the next state written under ``"next"``;
* **recurrent** (learning): the tensordict is ``[*batch, time]``; the state stored at the first step of each row
  starts the segment and ``is_init`` resets it where episodes begin inside it. With ``window`` (the default) every
  step sees the same ``mem_len`` steps back as when acting, so the learning pass recomputes the acting-time outputs
  from the stored memories. Only the output is written (the stored per-step states are left as they were).

Keys: ``in_key`` ``[*, d_in]`` -> ``out_key`` ``[*, d_model]``; ``recurrent_state_mems`` ``[*, n_layer, mem_len,
d_model]``, ``recurrent_state_valid`` ``[*, mem_len]`` (bool), ``is_init`` ``[*, 1]`` (bool).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn
from torchrl.data import Binary, Unbounded
from torchrl.envs import TensorDictPrimer
from torchrl.modules import recurrent_mode

from transformer_xl.errors import ConfigError
from transformer_xl.model.sequence import SequenceConfig, SequenceState, TransformerXLSequence

MEMS, VALID, IS_INIT = "recurrent_state_mems", "recurrent_state_valid", "is_init"


class TransformerXLModule(TensorDictModuleBase):
    """A :class:`~transformer_xl.model.TransformerXLSequence` reading and writing tensordicts (see the module
    docstring). ``default_recurrent_mode`` is used outside a ``set_recurrent_mode`` context (False: acting)."""

    def __init__(self, config: SequenceConfig, *, in_key: str = "embed", out_key: str = "features",
                 default_recurrent_mode: bool = False) -> None:
        super().__init__()
        self.in_keys = [in_key, MEMS, VALID, IS_INIT]
        self.out_keys = [out_key, ("next", MEMS), ("next", VALID)]
        self.memory: nn.Module = TransformerXLSequence(config)
        self.config = config
        self._default_recurrent_mode = default_recurrent_mode

    @property
    def recurrent_mode(self) -> bool:
        """Whether the tensordict is read as ``[*batch, time]`` (learning) or as independent steps (acting)."""
        mode = recurrent_mode()
        return self._default_recurrent_mode if mode is None else bool(mode)

    def make_tensordict_primer(self) -> TensorDictPrimer:
        """The environment transform that puts a zero state (a memory none of whose positions is valid) in every
        reset tensordict and declares the state keys in the specs, so that collectors carry them from step to step."""
        cfg = self.config
        return TensorDictPrimer({
            MEMS: Unbounded(shape=(cfg.n_layer, cfg.mem_len, cfg.d_model)),
            VALID: Binary(n=cfg.mem_len, dtype=torch.bool),
        }, expand_specs=True)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``out_key`` (and, acting, the next state under ``"next"``) into ``tensordict``; returns it."""
        x = tensordict.get(self.in_keys[0])
        if self.recurrent_mode:
            return self._segment(tensordict, x)
        shape = tensordict.shape
        flat = tensordict.reshape(-1)  # [N] steps
        n = flat.shape[0]
        state = self._state(flat, n)
        is_init = flat.get(IS_INIT, None)
        reset = None if is_init is None else is_init.reshape(n)
        y, nxt = self.memory.step(x.reshape(n, -1), state, reset)
        flat.set(self.out_keys[0], y)
        flat.set(("next", MEMS), nxt.mems)
        flat.set(("next", VALID), nxt.valid)
        tensordict.update(flat.reshape(shape))
        return tensordict

    def _segment(self, tensordict: TensorDictBase, x: Tensor) -> TensorDictBase:
        """Recurrent mode: ``[*batch, T]`` rows, each one segment from the state stored at its first step."""
        if tensordict.ndim < 1:
            raise ConfigError("recurrent mode needs a tensordict with a time dimension, got a 0-d one")
        shape = tensordict.shape
        rows = tensordict.reshape(-1, shape[-1])  # [B, T]
        bsz, qlen = rows.shape
        state = self._state(rows[:, 0], bsz)
        is_init = rows.get(IS_INIT, None)
        reset = None if is_init is None else is_init.reshape(bsz, qlen)
        out = self.memory(x.reshape(bsz, qlen, -1), state, reset)
        rows.set(self.out_keys[0], out.output)
        tensordict.update(rows.reshape(shape).select(self.out_keys[0]))
        return tensordict

    def _state(self, first: TensorDictBase, n: int) -> SequenceState | None:
        """The state in ``first`` (``[N]`` entries), or None (fresh) when the tensordict carries none; one of the two
        without the other is a one-line :class:`ConfigError` (a memory whose valid flags were dropped is not a fresh
        one)."""
        mems, valid = first.get(MEMS, None), first.get(VALID, None)
        if mems is None and valid is None:
            return None
        if mems is None or valid is None:
            have, missing = (VALID, MEMS) if mems is None else (MEMS, VALID)
            raise ConfigError(f"the tensordict has {have!r} but no {missing!r}: a recurrent state needs both (the "
                              "primer of make_tensordict_primer writes them together)")
        cfg = self.config
        return SequenceState(mems.reshape(n, cfg.n_layer, -1, cfg.d_model), valid.reshape(n, -1).bool())

