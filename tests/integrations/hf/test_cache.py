"""The Transformer-XL memory as a transformers ``Cache``: rows selected, repeated and reordered together with their
padding mask, never cropped."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")

from transformer_xl.integrations.hf import TransfoXLMemory


def _memory() -> TransfoXLMemory:
    mems = [torch.arange(3.0)[:, None, None].expand(3, 2, 4).clone() for _ in range(2)]  # row i holds i
    return TransfoXLMemory(mems, torch.tensor([[True, True], [False, True], [True, True]]), seen=5)


def test_rows_move_with_their_mask() -> None:
    memory = _memory()
    memory.reorder_cache(torch.tensor([2, 2, 1]))
    assert memory.mems[0][:, 0, 0].tolist() == [2, 2, 1] and memory.mask[:, 0].tolist() == [True, True, False]
    memory.batch_select_indices(torch.tensor([2]))
    assert memory.mems[1][:, 0, 0].tolist() == [1] and memory.mask.tolist() == [[False, True]]
    memory.batch_repeat_interleave(2)
    assert memory.mems[0].shape == (2, 2, 4) and memory.mask.tolist() == [[False, True]] * 2
    assert memory.get_seq_length() == 5 and memory.has_previous_state() and memory.is_linear == [False]


def test_an_empty_memory_and_a_reset() -> None:
    memory = TransfoXLMemory()
    assert memory.memory_length == 0 and memory.key_mask(3, torch.device("cpu")).shape == (3, 0)
    full = _memory()
    full.mask = None
    assert full.key_mask(3, torch.device("cpu")).all()
    full.reset()
    assert full.get_seq_length() == 0 and full.mems == [] and not full.has_previous_state()
    with pytest.raises(ValueError, match="cannot be cropped"):
        full.crop(1)
