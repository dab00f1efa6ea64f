"""The inference cache of a stream of segments: :class:`InferenceCache`, owned by the caller.

Reading a long text segment by segment without a gradient (evaluation, generation) recomputes two things
the previous segment already had:

* **the memory's keys and values.** Every memory position was a segment token once, when its keys/values
  ``[W_k; W_v] LN?(h)`` were projected; the plain formula projects it again at every segment it spends in
  memory. The cache keeps, per layer, the keys/values of the positions that became the memory
  (:func:`txl.model.memory.kept_range`) and hands them to the next forward whose ``mems`` are exactly the
  tensors that forward returned. Relative encodings only (attn_type 0, 1): the absolute ones add position
  embeddings to the memory, so a position's keys depend on where it sits.
* **``W_kR R``** (attn_type 0): rows are ordered by decreasing distance, so the projected table of any
  ``K`` is the suffix of a longer one; the cache keeps one per layer, twice as long when ``K`` outgrows it.
  Not used in training mode (dropout on ``R``) or under autocast.

Both are the same values as the plain formulas (``tests/model/test_cache.py``; up to float rounding for the
table's suffix). Validity is checked cheaply: the cache remembers the ``(storage, version counter)`` of every
parameter and of the memories it kept keys/values for, and starts over when one differs (an optimizer step,
``load_state_dict``, an in-place update of a weight or of a memory, a move to another device or dtype). Writes
that bypass the version counter, through ``param.data`` or to tensors made under ``torch.inference_mode``
(which have none), and replacing a parameter by a new ``Parameter`` object, need :meth:`InferenceCache.clear`
afterwards.

Usage::

    cache, mems = InferenceCache(), None
    with torch.no_grad():
        for x, y in segments:
            out = model(x, y, mems, cache=cache)
            mems = out.mems

(:class:`txl.model.recurrence.Recurrence` does this.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from txl.errors import ConfigError

if TYPE_CHECKING:
    from txl.model.segment import Segment


def _stamps(tensors: Sequence[Tensor]) -> tuple[list[int], list[int] | None]:
    """Where the tensors live and how often each was modified in place (None: inference tensors keep no count).
    Two list comprehensions: this runs at every generated token."""
    ptrs = [t.data_ptr() for t in tensors]
    try:
        return ptrs, [t._version for t in tensors]
    except RuntimeError:  # "Inference tensors do not track version counter"
        return ptrs, None


class InferenceCache:
    """Keys/values of the memory and ``W_kR R`` carried from one forward to the next (module docstring)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget everything (the next forward projects the memory and the position table again)."""
        self._model: nn.Module | None = None
        self._params: list[Tensor] | None = None  # the model's parameters, listed once
        self._weights: tuple | None = None  # stamps of the parameters the kept projections were made with
        self._mems: list[Tensor] | None = None  # the memories the kept keys/values belong to
        self._mem_stamps: tuple | None = None
        self._kv: list[Tensor] = []  # per layer [B, M, 2*H*E]
        self._pending: dict[int, Tensor] = {}  # this forward's keys/values [B, K, 2*H*E] per layer
        self._tables: dict[int, tuple[tuple, Tensor]] = {}  # layer -> (key, W_kR R [S, H*E])

    # ---------------------------------------------------------------------------------------------- a forward
    def begin(self, model: nn.Module, mems: Sequence[Tensor]) -> None:
        """Start a forward of ``model`` over ``mems`` (called by the model)."""
        if torch.is_grad_enabled():
            raise ConfigError("an InferenceCache is for inference: use it under torch.no_grad() (with a gradient "
                              "the memory must be projected by the current weights)")
        if self._params is None or self._model is not model:  # listing a model's parameters walks its modules
            self._model, self._params = model, list(model.parameters())
        weights = _stamps(self._params)
        if weights != self._weights:
            self.clear()
            self._weights = weights
        same = self._mems is not None and len(mems) == len(self._mems) and all(
            a is b for a, b in zip(mems, self._mems)) and _stamps(mems) == self._mem_stamps
        if not same:
            self._kv = []
        self._pending = {}

    def memory_kv(self, layer: int, mem: Tensor, project: Callable[[Tensor], Tensor]) -> Tensor:
        """The keys/values of ``mem`` ``[B, M, 2*H*E]``: kept from the previous forward, else ``project(mem)``."""
        return self._kv[layer] if self._kv else project(mem)

    def keep_kv(self, layer: int, kv: Tensor) -> None:
        """This forward's keys/values of all ``K`` positions of ``layer``."""
        self._pending[layer] = kv

    def commit(self, mems: list[Tensor], *, beg: int, end: int) -> None:
        """End of a forward: keep the keys/values of positions ``[beg, end)``, those that became ``mems``."""
        self._kv = [self._pending[i][:, beg:end] for i in sorted(self._pending)]
        self._mems, self._mem_stamps = mems, _stamps(mems)
        self._pending = {}

    # ---------------------------------------------------------------------------------------------- W_kR R
    def position_keys(self, layer: int, r_net: nn.Module, seg: Segment, rows: Callable[[int], Tensor]) -> Tensor:
        """``W_kR R`` for distances ``K-1..0`` of ``seg``, ``[K, H*E]``, as the suffix of a kept table."""
        table = seg.table
        assert table is not None
        if r_net.training or torch.is_autocast_enabled(table.device.type):
            return r_net(table)
        klen = seg.klen
        key = (table.dtype, table.device, seg.lengths.clamp_len)
        hit = self._tables.get(layer)
        if hit is not None and hit[0] == key and hit[1].size(0) >= klen:
            return hit[1][hit[1].size(0) - klen:]
        size = max(klen, 2 * hit[1].size(0)) if hit is not None and hit[0] == key else klen
        projected = r_net(rows(size))  # [size, H*E]
        self._tables[layer] = (key, projected)
        return projected[size - klen:]
