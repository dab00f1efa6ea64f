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
* **recurrent** (learning): the tensordict is ``[*batch, time]``; a row starts from the state stored at its first
  step, and every ``is_init`` step restarts from the state stored at it, as TorchRL's ``LSTMModule``/``GRUModule`` do
  (TorchRL's ``SliceSampler`` marks every slice start with ``is_init`` for this, and GAE marks the ``"next"`` row with
  the root's ``is_init``: both mid-episode, where the stored state is the acting-time memory). At a real episode
  start the stored state is the primer's zeros, a memory with no valid position: a fresh one. Without stored state
  (no primer) ``is_init`` starts a fresh memory. With ``window`` (the default) every step sees the same ``mem_len``
  steps back as when acting, so the learning pass recomputes the acting-time outputs from the stored memories. Only
  the output is written (the stored per-step states are left as they were).

Keys: ``in_key`` ``[*, d_in]`` -> ``out_key`` ``[*, d_model]``; ``recurrent_state_mems`` ``[*, n_layer, mem_len,
d_model]``, ``recurrent_state_valid`` ``[*, mem_len]`` (bool), ``is_init`` ``[*, 1]`` (bool). ``state_keys`` renames
the two state keys, as ``LSTMModule``'s ``in_keys`` do, so that two memories (an actor's and a critic's) share a
tensordict.
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
                 default_recurrent_mode: bool | None = False,
                 state_keys: tuple[str, str] = (MEMS, VALID)) -> None:
        super().__init__()
        if len(state_keys) != 2 or len(set(state_keys)) != 2 or not all(isinstance(k, str) for k in state_keys):
            raise ConfigError(f"state_keys must be two different names (memory, valid flags), got {state_keys!r}")
        self.mems_key, self.valid_key = state_keys  # rename them for two memories in one tensordict (actor, critic)
        self.in_keys = [in_key, self.mems_key, self.valid_key, IS_INIT]
        self.out_keys = [out_key, ("next", self.mems_key), ("next", self.valid_key)]
        self.memory: nn.Module = TransformerXLSequence(config)
        self.config = config
        self._default_recurrent_mode = bool(default_recurrent_mode)  # None (TorchRL's default) reads as False

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
            self.mems_key: Unbounded(shape=(cfg.n_layer, cfg.mem_len, cfg.d_model)),
            self.valid_key: Binary(n=cfg.mem_len, dtype=torch.bool),
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
        flat.set(self.out_keys[1], nxt.mems)
        flat.set(self.out_keys[2], nxt.valid)
        tensordict.update(flat.reshape(shape))
        return tensordict

    def _segment(self, tensordict: TensorDictBase, x: Tensor) -> TensorDictBase:
        """Recurrent mode: ``[*batch, T]`` rows; every ``is_init`` step restarts from the state stored at it (see the
        module docstring). A stored state none of whose positions is valid is a fresh memory, which the sequence
        module's ``reset`` gives without cutting the row; only the other ``is_init`` steps (slice starts of a sampler,
        the ``"next"`` row of GAE) cut it into pieces."""
        if tensordict.ndim < 1:
            raise ConfigError("recurrent mode needs a tensordict with a time dimension, got a 0-d one")
        shape = tensordict.shape
        rows = tensordict.reshape(-1, shape[-1])  # [B, T]
        bsz, qlen = rows.shape
        is_init = rows.get(IS_INIT, None)
        reset = None if is_init is None else is_init.reshape(bsz, qlen)
        state = self._state(rows[:, 0], bsz)
        restart = None
        if state is not None and reset is not None:
            # is_init onto a stored, non-fresh memory
            restart = reset & rows.get(self.valid_key).reshape(bsz, qlen, -1).any(-1)
            reset = reset & ~restart
            restart[:, 0] = False  # a row's first step reads its stored state anyway
        if restart is None or not restart.any():
            out = self.memory(x.reshape(bsz, qlen, -1), state, reset).output
        else:
            out = self._pieces(rows, x.reshape(bsz * qlen, -1), restart, reset).reshape(bsz, qlen, -1)
        rows.set(self.out_keys[0], out)
        tensordict.update(rows.reshape(shape).select(self.out_keys[0]))
        return tensordict

    def _pieces(self, rows: TensorDictBase, x: Tensor, cuts: Tensor, reset: Tensor) -> Tensor:
        """``x [B*T, d_in]`` cut before every ``cuts [B, T]`` step (and at every row start) into pieces, padded at
        their ends to one length and run as one batch, each from the state stored at its first step (``reset`` kept
        inside them); the features ``[B*T, D]``. The padding follows the real steps, which attend only backwards, so
        it changes none of their outputs."""
        first = cuts.clone()
        first[:, 0] = True
        first = first.reshape(-1)
        piece = first.long().cumsum(0) - 1  # [B*T] the piece of every step
        begin = first.nonzero().squeeze(-1)  # [P] the flat index of every piece's first step
        pos = torch.arange(first.numel(), device=x.device) - begin[piece]  # [B*T] the step within its piece
        n, length = begin.numel(), int(pos.max()) + 1
        padded = x.new_zeros(n, length, x.shape[-1]).index_put((piece, pos), x)
        fresh = reset.new_zeros(n, length).index_put((piece, pos), reset.reshape(-1))
        stored = rows.select(self.mems_key, self.valid_key).reshape(-1)[begin]
        return self.memory(padded, self._state(stored, n), fresh).output[piece, pos]

    def _state(self, first: TensorDictBase, n: int) -> SequenceState | None:
        """The state in ``first`` (``[N]`` entries), or None (fresh) when the tensordict carries none; one of the two
        without the other is a one-line :class:`ConfigError` (a memory whose valid flags were dropped is not a fresh
        one)."""
        mems, valid = first.get(self.mems_key, None), first.get(self.valid_key, None)
        if mems is None and valid is None:
            return None
        if mems is None or valid is None:
            have, missing = ((self.valid_key, self.mems_key) if mems is None
                             else (self.mems_key, self.valid_key))
            raise ConfigError(f"the tensordict has {have!r} but no {missing!r}: a recurrent state needs both (the "
                              "primer of make_tensordict_primer writes them together)")
        cfg = self.config
        return SequenceState(mems.reshape(n, cfg.n_layer, -1, cfg.d_model), valid.reshape(n, -1).bool())

