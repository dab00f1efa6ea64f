"""The inference cache of a stream of segments: :class:`InferenceCache`, owned by the caller.

Reading a long text segment by segment without a gradient (evaluation, generation) would otherwise redo work
the previous segment already did, and copy what it already has:

* **the memory's keys and values.** Every memory position was a segment token once, when its keys/values
  ``[W_k; W_v] LN?(h)`` were projected; the plain formula projects it again at every segment it spends in
  memory. The cache keeps them. Relative encodings only (attn_type 0, 1): the absolute ones add position
  embeddings to the memory, so a position's keys depend on where it sits.
* **the copies.** The plain formula builds the keys ``[SG(m); h]`` and the next memory (paper Sec. 3.2) with
  a concatenation, which copies all ``mem_len`` positions of every layer at every segment: at one token per
  step (generation) that copy was about half the time of a step. The cache writes each position once, in
  place, into preallocated per-layer buffers (keys and values ``[B, H, C, E]`` head-major, hidden states
  ``[B, C, D]``, capacity ``C`` = memory + segment + slack) and reads keys, values and the new memories as
  **views** of them. The buffers are append-only: a position, once handed out as part of a memory, is never
  written again; when the slack is used up the live window moves to *new* buffers (one copy every
  ``slack / Q`` segments). So the memories returned by ``forward`` stay what they were when returned (the
  functional contract of :class:`~transformer_xl.model.lm.TransformerXLLM`) although later segments keep writing.
* **``W_kR R``** (attn_type 0): rows are ordered by decreasing distance, so the projected table of any
  ``K`` is the suffix of a longer one; the cache keeps one per layer, twice as long when ``K`` outgrows it,
  so the sinusoid of a generation is computed and projected a handful of times, not at every token (a one-query
  step needs no shift: row ``j`` of the table is key ``j``'s distance).
  Not used in training mode (dropout on ``R``) or under autocast.

A forward appends to the buffers only when its ``mems`` are exactly the tensors the previous forward with
this cache returned (the same objects, not modified since); any other memories (a branch from an older
state, memories edited in place, a new text) start new buffers from them: their keys/values are projected
once, and the values are the plain formula's either way (``tests/model/test_cache.py``; up to float rounding
for the table's suffix). The weights are checked cheaply: the cache remembers the ``(storage, version
counter)`` of every parameter and starts over when one differs (an optimizer step, ``load_state_dict``, an
in-place update, a move to another device or dtype). Writes that bypass the version counter, through
``param.data`` or to tensors made under ``torch.inference_mode`` (which have none), and replacing a
parameter by a new ``Parameter`` object, need :meth:`InferenceCache.clear` afterwards.

Usage::

    cache, mems = InferenceCache(), None
    with torch.no_grad():
        for x, y in segments:
            out = model(x, y, mems, cache=cache)
            mems = out.mems

(:class:`transformer_xl.model.recurrence.Recurrence` does this.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from transformer_xl.errors import ConfigError

if TYPE_CHECKING:
    from transformer_xl.model.segment import Segment

#: Positions of slack at least, beyond the memory and the segment, when buffers are (re)allocated.
MIN_SLACK = 64


def _stamps(tensors: Sequence[Tensor]) -> tuple[list[int], list[int] | None]:
    """Where the tensors live and how often each was modified in place (None: inference tensors keep no count).
    Two list comprehensions: this runs at every generated token."""
    ptrs = [t.data_ptr() for t in tensors]
    try:
        return ptrs, [t._version for t in tensors]
    except RuntimeError:  # "Inference tensors do not track version counter"
        return ptrs, None


def capacity(*, mlen: int, qlen: int, mem_len: int) -> int:
    """Buffer positions for a window of ``mlen`` memory positions and a segment of ``qlen``, with a slack of
    ``max(mem_len // 2, 4 * qlen, MIN_SLACK)``: the live window is copied to new buffers about once per
    ``slack / qlen`` segments (at one token per step and ``mem_len`` 640, once every 320 tokens)."""
    return mlen + qlen + max(mem_len // 2, 4 * qlen, MIN_SLACK)


class InferenceCache:
    """Keys/values and memories in append-only buffers, and ``W_kR R``, carried from one forward to the next
    (module docstring)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget everything (the next forward projects the memory and the position table again)."""
        self._model: nn.Module | None = None
        self._params: list[Tensor] | None = None  # the model's parameters, listed once
        self._form: str | None = None  # the model's quantization when they were listed
        self._weights: tuple | None = None  # stamps of the parameters the kept projections were made with
        self._tables: dict[int, tuple[tuple, Tensor]] = {}  # layer -> (key, W_kR R [S, H*E])
        self._drop_buffers()

    def _drop_buffers(self) -> None:
        self._k: list[Tensor | None] = []  # per layer [B, H, C, E]
        self._v: list[Tensor | None] = []
        self._hid: list[Tensor] = []  # per memory tensor (n_layer + 1) [B, C, D]
        self._cap = 0
        self._lo = self._hi = 0  # the window of the last returned memories in buffer positions
        self._mems: list[Tensor] | None = None  # the memories last returned (views of _hid)
        self._mem_stamps: tuple | None = None
        self._base = 0  # buffer position of key 0 of the running forward
        self._qlen = self._mlen = 0
        self.kv_active = False  # whether the running forward takes its keys/values from the buffers

    # ---------------------------------------------------------------------------------------------- a forward
    def begin(self, model: nn.Module, mems: Sequence[Tensor], *, qlen: int, mem_len: int) -> None:
        """Start a forward of ``model`` over ``mems`` with ``qlen`` new positions (called by the model)."""
        if torch.is_grad_enabled():
            raise ConfigError("an InferenceCache is for inference: use it under torch.no_grad() (with a gradient "
                              "the memory must be projected by the current weights)")
        # Listing a model's parameters walks its modules: done again for another model, or one quantized since.
        form = getattr(model, "quantized", None)
        if self._params is None or self._model is not model or self._form != form:
            self._model, self._form, self._params = model, form, list(model.parameters())
            self._weights = None
        weights = _stamps(self._params)
        if weights != self._weights:  # projections made with other weights: none of them is kept
            self._weights, self._tables = weights, {}
            self._drop_buffers()
        self.kv_active = len(mems) > 0
        if not self.kv_active:
            return
        mlen = mems[0].size(1)
        if not self._continues(mems):  # a memory of its own: new buffers, filled from it by the first writes
            self._drop_buffers()
            self._cap = capacity(mlen=mlen, qlen=qlen, mem_len=mem_len)
            self._lo, self._hi = 0, mlen
        self.kv_active, self._qlen, self._mlen = True, qlen, mlen
        if self._hi + qlen > self._cap:  # the slack is used up (never for new buffers)
            self._move_window(mem_len)
        self._base = self._lo

    def _continues(self, mems: Sequence[Tensor]) -> bool:
        """Whether ``mems`` are the memories this cache returned last, unmodified (then the forward appends)."""
        last = self._mems
        if last is None or len(mems) != len(last) or not all(a is b for a, b in zip(mems, last)):
            return False
        if self._hid[0].is_inference() != torch.is_inference_mode_enabled():
            return False  # inference tensors cannot be written outside inference mode (and vice versa)
        return _stamps(mems) == self._mem_stamps

    def _move_window(self, mem_len: int) -> None:
        """Copy the live window ``[lo, hi)`` to the front of new buffers (the old ones, which returned memories
        may still view, are left as they are)."""
        lo, hi = self._lo, self._hi
        self._cap = capacity(mlen=hi - lo, qlen=self._qlen, mem_len=mem_len)

        def moved(buf: Tensor, dim: int) -> Tensor:
            shape = list(buf.shape)
            shape[dim] = self._cap
            new = buf.new_empty(shape)
            new.narrow(dim, 0, hi - lo).copy_(buf.narrow(dim, lo, hi - lo))
            return new

        self._k = [None if b is None else moved(b, 2) for b in self._k]
        self._v = [None if b is None else moved(b, 2) for b in self._v]
        self._hid = [moved(b, 1) for b in self._hid]
        self._lo, self._hi = 0, hi - lo

    def keys_values(self, layer: int, mem: Tensor, kv: Tensor, n_head: int,
                    project: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        """Keys and values of ``[memory; segment]`` of ``layer``, ``[B, H, K, E]`` each (views of the buffers),
        after writing this segment's ``kv [B, Q, 2*H*E]``; the memory's own are ``project(mem)`` the first time."""
        bsz, qlen, two_he = kv.shape
        d_head = two_he // (2 * n_head)
        while len(self._k) <= layer:
            self._k.append(None)
            self._v.append(None)
        if self._k[layer] is None:  # new buffers: the memory's keys/values projected once
            self._k[layer] = kv.new_empty(bsz, n_head, self._cap, d_head)
            self._v[layer] = kv.new_empty(bsz, n_head, self._cap, d_head)
            if self._mlen:
                self._write(layer, project(mem), 0)
        self._write(layer, kv, self._hi)
        end = self._hi + qlen
        k, v = self._k[layer], self._v[layer]
        assert k is not None and v is not None
        return k[:, :, self._base:end], v[:, :, self._base:end]

    def _write(self, layer: int, kv: Tensor, at: int) -> None:
        """``kv [B, T, 2*H*E]`` into positions ``[at, at + T)`` of the layer's key and value buffers."""
        k, v = self._k[layer], self._v[layer]
        assert k is not None and v is not None
        bsz, t, _ = kv.shape
        split = kv.view(bsz, t, 2, k.size(1), k.size(3))
        k[:, :, at:at + t].copy_(split[:, :, 0].transpose(1, 2))
        v[:, :, at:at + t].copy_(split[:, :, 1].transpose(1, 2))

    def commit(self, hids: Sequence[Tensor], mems: Sequence[Tensor], *, beg: int, end: int) -> list[Tensor]:
        """End of a forward: write its hidden states ``hids`` (``[B, Q, D]`` per memory tensor) after ``mems`` and
        return the next memories, positions ``[beg, end)`` of ``[memory; segment]``, as views of the buffers."""
        if not self._hid:  # new buffers, the memory first
            self._hid = [h.new_empty(h.size(0), self._cap, h.size(2)) for h in hids]
            if self._mlen:
                for buf, m in zip(self._hid, mems):
                    buf[:, :self._mlen].copy_(m)
        hi, qlen = self._hi, self._qlen
        for buf, h in zip(self._hid, hids):
            buf[:, hi:hi + qlen].copy_(h)
        self._lo, self._hi = self._base + beg, self._base + end
        new = [buf[:, self._lo:self._hi] for buf in self._hid]
        self._mems, self._mem_stamps = new, _stamps(new)
        return new

    # ---------------------------------------------------------------------------------------------- W_kR R
    def position_keys(self, layer: int, r_net: nn.Module, seg: Segment, rows: Callable[[int], Tensor]) -> Tensor:
        """``W_kR R`` for distances ``K-1..0`` of ``seg``, ``[K, H*E]``, as the suffix of a kept table."""
        if r_net.training or torch.is_autocast_enabled(seg.device.type):
            return r_net(seg.table)
        return self._suffix(layer, seg, lambda n: r_net(rows(n)))

    def _suffix(self, slot: int, seg: Segment, make: Callable[[int], Tensor]) -> Tensor:
        """The last ``K`` rows of the table kept in ``slot``, made by ``make(n)`` (at least doubled) when short."""
        klen = seg.klen
        key = (seg.dtype, seg.device, seg.lengths.clamp_len)
        hit = self._tables.get(slot)
        if hit is not None and hit[0] == key and hit[1].size(0) >= klen:
            return hit[1][hit[1].size(0) - klen:]
        size = max(klen, 2 * hit[1].size(0)) if hit is not None and hit[0] == key else klen
        table = make(size)  # [size, ...]
        self._tables[slot] = (key, table)
        return table[size - klen:]
