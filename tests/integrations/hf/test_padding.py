"""Which tokens of a padded batch are real, and the padding a Transformer-XL memory cannot honour."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")

from transformer_xl.integrations.hf import TransfoXLMemory
from transformer_xl.integrations.hf.padding import real_tokens

EMPTY = TransfoXLMemory()


def test_padding_ids_are_read_as_zero_and_masked() -> None:
    ids = torch.tensor([[5, 6, 10], [10, 7, 8]])
    read, real = real_tokens(ids, torch.tensor([[1, 1, 0], [0, 1, 1]]), EMPTY, n_token=10, pad_id=10)
    assert read.tolist() == [[5, 6, 0], [0, 7, 8]] and real.tolist() == [[True, True, False], [False, True, True]]
    read, real = real_tokens(ids[:1], None, EMPTY, n_token=10, pad_id=10)  # a finished row generate pads
    assert read.tolist() == [[5, 6, 0]] and real is None
    # a mask as long as the whole text so far (generate's): its last columns are this call's
    _, real = real_tokens(ids[:, :1], torch.tensor([[1, 1, 1], [0, 1, 1]]), EMPTY, n_token=10, pad_id=10)
    assert real is None


def test_what_cannot_be_honoured_is_refused() -> None:
    with pytest.raises(ValueError, match="token id 12 is outside the model's vocabulary of 10"):
        real_tokens(torch.tensor([[1, 12]]), None, EMPTY, n_token=10, pad_id=10)
    with pytest.raises(ValueError, match="token id -1 is outside"):
        real_tokens(torch.tensor([[1, -1]]), None, EMPTY, n_token=10, pad_id=None)
    # an id out of range under padding is only padding
    read, _ = real_tokens(torch.tensor([[1, 99]]), torch.tensor([[1, 0]]), EMPTY, n_token=10, pad_id=10)
    assert read.tolist() == [[1, 0]]
    with pytest.raises(ValueError, match=r"attention_mask must be \[batch=1, length>=2\]"):
        real_tokens(torch.tensor([[1, 2]]), torch.tensor([[1]]), EMPTY, n_token=10, pad_id=10)
    with pytest.raises(ValueError, match="row 0 of attention_mask has padding between real tokens"):
        real_tokens(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 0, 1]]), EMPTY, n_token=10, pad_id=10)
    remembering = TransfoXLMemory([torch.zeros(1, 2, 4)], None, seen=2)
    with pytest.raises(ValueError, match="row 0 is padded on the left after text in its memory"):
        real_tokens(torch.tensor([[1, 2]]), torch.tensor([[1, 1, 0, 1]]), remembering, n_token=10, pad_id=10)
    # right padding after a memory is fine
    _, real = real_tokens(torch.tensor([[1, 2]]), torch.tensor([[1, 1, 1, 0]]), remembering, n_token=10, pad_id=10)
    assert real.tolist() == [[True, False]]
