"""The Transformer-XL memory as a transformers ``Cache`` (paper Sec. 3.2: the cached hidden states of every layer).

Transformer-XL's state is not a key/value cache: each layer keeps the *hidden states* of the last ``mem_len``
positions (its input, from which every segment projects keys and values again through its own weights), so the
cache cannot grow, be cropped or be indexed by position as transformers' key/value caches are. The model class
builds its own :class:`TransfoXLMemory` (``_supports_default_dynamic_cache`` is False, as for transformers' other
stateful models) and ``generate`` carries it from step to step.

It holds, per row of the batch, which memory positions are real (``mask``): a row padded on the left (batched
``generate``) or on the right (a batch of sentences) keeps its real positions only, right-aligned, and padding is
never attended to (:meth:`transformer_xl.model.TransformerXLLM.forward`'s ``key_mask``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from transformer_xl.errors import ConfigError


class TransfoXLMemory(Cache):
    """``mems``: ``n_layer + 1`` tensors ``[B, M, d_model]`` (empty list before the first segment); ``mask``:
    ``[B, M]`` bool, True at real positions; ``seen``: how many tokens of the text this memory has read (what
    ``generate`` slices its ids by)."""

    is_compileable = False

    def __init__(self, mems: list[Tensor] | None = None, mask: Tensor | None = None, seen: int = 0) -> None:
        super().__init__(layers=[])
        self.mems: list[Tensor] = list(mems or [])
        self.mask = mask
        self.seen = seen

    def __repr__(self) -> str:
        return f"TransfoXLMemory(positions={self.memory_length}, seen={self.seen})"

    @property
    def is_linear(self) -> list[bool]:
        """Not a recurrent state: attention over cached positions, so ``generate`` tells the model how many of the
        ids it is given are new (``next_sequence_length``), from :meth:`get_seq_length`."""
        return [False]

    @property
    def memory_length(self) -> int:
        """Positions the memory holds (at most ``mem_len``)."""
        return self.mems[0].size(1) if self.mems else 0

    def key_mask(self, batch: int, device: torch.device) -> Tensor:
        """``[B, M]``: which memory positions are real."""
        if self.mask is None:
            return torch.ones(batch, self.memory_length, dtype=torch.bool, device=device)
        return self.mask.to(device)

    def update_memory(self, mems: list[Tensor], mask: Tensor | None, tokens: int) -> None:
        """The memory after a segment of ``tokens`` tokens."""
        self.mems, self.mask, self.seen = list(mems), mask, self.seen + tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens of the text read so far (what ``generate`` counts), not the positions kept."""
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        """-1: a text has no length limit (the memory keeps the last ``mem_len`` positions)."""
        return -1

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        """Whether anything has been read."""
        return self.seen > 0

    def reset(self) -> None:
        """Start the text over: nothing read, nothing kept."""
        self.mems, self.mask, self.seen = [], None, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows in the order of ``beam_idx`` (beam search)."""
        self._select(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep the rows ``indices``."""
        self._select(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (``num_return_sequences``, beams)."""
        self.mems = [m.repeat_interleave(repeats, dim=0) for m in self.mems]
        if self.mask is not None:
            self.mask = self.mask.repeat_interleave(repeats, dim=0)

    def crop(self, max_length: int) -> None:
        """Refused: the memory is hidden states, it cannot go back to an earlier length."""
        raise ConfigError("a Transformer-XL memory cannot be cropped (it holds hidden states, not keys per position): "
                         "assisted and speculative decoding are not supported")

    def _select(self, index: Tensor) -> None:
        self.mems = [m.index_select(0, index.to(m.device)) for m in self.mems]
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index.to(self.mask.device))
