"""What the layers of one forward share: :class:`Segment` (paper Sec. 3.2-3.3).

A forward processes one segment of ``Q`` tokens over a memory of ``M`` positions (``K = M + Q`` keys).
Every layer needs the same lengths, causal mask and position table; the position strategy reads them from
here. Two projections can come from the caller's inference cache (:class:`txl.model.cache.InferenceCache`)
instead of being computed again: the keys/values of the memory and ``W_kR R``. Without a cache each is the
plain formula. (The model attaches the cache only for encodings whose memory carries no position, and the
cache itself computes ``W_kR R`` plainly in training mode or under autocast.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor, nn

from txl.model.config import Lengths

if TYPE_CHECKING:
    from txl.model.cache import InferenceCache
    from txl.model.positional import PositionalEncoding


@dataclass
class Segment:
    """Lengths, mask and position table of one forward, the position strategy, and the inference cache."""

    qlen: int
    mlen: int
    lengths: Lengths
    pos: PositionalEncoding
    mask_bias: Tensor  # [Q, K]: 0 where query i may attend key j, -inf elsewhere
    table: Tensor | None = None  # [K, D] sinusoid rows for distances K-1..0 (attn_type 0 and 2)
    cache: InferenceCache | None = None

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    def memory_kv(self, layer: int, mem: Tensor, project: Callable[[Tensor], Tensor]) -> Tensor:
        """``[W_k; W_v]`` of the memory, ``[B, M, 2*H*E]``: ``project(mem)``, or the cache's copy of what the
        previous segment projected for these positions."""
        return project(mem) if self.cache is None else self.cache.memory_kv(layer, mem, project)

    def keep_kv(self, layer: int, kv: Tensor) -> None:
        """Offer the keys/values of all ``K`` positions ``[B, K, 2*H*E]`` to the cache (a no-op without one)."""
        if self.cache is not None:
            self.cache.keep_kv(layer, kv)

    def position_keys(self, layer: int, r_net: nn.Module,
                      rows: Callable[[int], Tensor]) -> Tensor:
        """``W_kR R`` for distances ``K-1..0``, ``[K, H*E]``: ``r_net(table)``, or the cache's projected table
        (``rows(n)``: the unprojected rows of ``n`` distances, for the cache to extend its table)."""
        assert self.table is not None
        if self.cache is None:
            return r_net(self.table)
        return self.cache.position_keys(layer, r_net, self, rows)
