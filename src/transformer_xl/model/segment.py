"""What the layers of one forward share: :class:`Segment` (paper Sec. 3.2-3.3).

A forward processes one segment of ``Q`` tokens over a memory of ``M`` positions (``K = M + Q`` keys).
Every layer needs the same lengths, causal mask and position table; the position strategy reads them from
here. The position table is made on first use (``make_table``): a forward whose ``W_kR R`` comes from the
inference cache never computes the sinusoid. Two things can come from the caller's inference cache
(:class:`transformer_xl.model.cache.InferenceCache`) instead of being computed again: the keys/values of
``[memory; segment]`` (the memory's projected once, each position written once into the cache's buffers)
and ``W_kR R``. Without a cache each is the plain formula. (The model attaches the cache only for encodings
whose memory carries no position, and the cache itself computes ``W_kR R`` plainly in training mode or under
autocast.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from transformer_xl.model.config import Lengths

if TYPE_CHECKING:
    from transformer_xl.model.cache import InferenceCache
    from transformer_xl.model.positional import PositionalEncoding


@dataclass
class Segment:
    """Lengths, mask and position table of one forward, the position strategy, and the inference cache."""

    qlen: int
    mlen: int
    lengths: Lengths
    pos: PositionalEncoding
    mask_bias: Tensor  # [Q, K] (or [B, 1, Q, K], a mask per row): 0 where query i may attend key j, -inf elsewhere
    make_table: Callable[[], Tensor | None] | None = None  # the [K, D] position table, made on first use
    cache: InferenceCache | None = None
    _table: list[Tensor | None] = field(default_factory=list, repr=False)  # the table once made

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    @property
    def dtype(self) -> torch.dtype:
        return self.mask_bias.dtype

    @property
    def device(self) -> torch.device:
        return self.mask_bias.device

    @property
    def table(self) -> Tensor | None:
        """``[K, D]`` sinusoid rows for distances ``K-1..0`` (attn_type 0 and 2), or None; made once. (A list
        rather than ``functools.cached_property``, whose lock ``torch.compile`` cannot trace.)"""
        if not self._table:
            self._table.append(None if self.make_table is None else self.make_table())
        return self._table[0]

    def keys_values(self, layer: int, mem: Tensor | None, kv: Tensor, n_head: int,
                    project: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        """Keys and values ``[B, H, K, E]`` of ``[SG(m); h]`` from this segment's ``kv [B, Q, 2*H*E]``: the
        memory's are ``project(mem)`` (plain formula: concatenated), or the cache's buffers (views)."""
        if self.cache is not None and self.cache.kv_active:
            assert mem is not None
            return self.cache.keys_values(layer, mem, kv, n_head, project)
        if mem is not None and mem.size(1) > 0:  # h~ = [SG(m); h]
            kv = torch.cat([project(mem), kv], dim=1)  # [B, K, 2*H*E]
        bsz, klen, two_he = kv.shape
        k, v = kv.view(bsz, klen, 2, n_head, two_he // (2 * n_head)).permute(2, 0, 3, 1, 4)  # [B, H, K, E] each
        return k, v

    def position_keys(self, layer: int, r_net: nn.Module,
                      rows: Callable[[int], Tensor]) -> Tensor:
        """``W_kR R`` for distances ``K-1..0``, ``[K, H*E]``: ``r_net(table)``, or the cache's projected table
        (``rows(n)``: the unprojected rows of ``n`` distances, for the cache to extend its table)."""
        if self.cache is None:
            return r_net(self.table)
        return self.cache.position_keys(layer, r_net, self, rows)
