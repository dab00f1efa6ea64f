"""How a batch is read: targets from transformers' labels, rows padded in front turned into rows padded at the
end, and segments of tgt_len over the memory."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")

from tests.helpers import tiny_model
from transformer_xl import ConfigError
from transformer_xl.integrations.hf import TransfoXLMemory
from transformer_xl.integrations.hf.reading import IGNORE_INDEX, left_aligned, read, targets_of


def test_targets_are_the_next_labels_with_padding_and_ignored_labels_left_out() -> None:
    ids = torch.tensor([[1, 2, 3, 10]])
    targets = targets_of(torch.tensor([[1, IGNORE_INDEX, 3, 10]]), ids, n_token=10, pad_id=10)
    assert targets.tolist() == [[IGNORE_INDEX, 3, IGNORE_INDEX, IGNORE_INDEX]]
    with pytest.raises(ConfigError, match="label 11 is outside"):
        targets_of(torch.tensor([[1, 11, 3, 4]]), ids, n_token=10, pad_id=10)


def test_rows_padded_in_front_are_turned_to_rows_padded_at_the_end() -> None:
    real = torch.tensor([[False, False, True, True], [True, True, True, False], [True] * 4])
    order = left_aligned(real)
    assert real.gather(1, order).tolist() == [[True, True, False, False], [True, True, True, False], [True] * 4]
    assert left_aligned(real[1:]) is None and left_aligned(None) is None


def test_a_read_is_txls_segments_with_the_memory_and_leaves_the_memory_as_it_was() -> None:
    model = tiny_model(2)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    memory = TransfoXLMemory()
    with torch.no_grad():
        got = read(model, ids, None, ids.roll(-1, 1), memory, keep=7, form_log_probs=True)
        mems, ref = [], []
        for beg in range(0, 9, model.config.tgt_len):
            out = model(ids[:, beg:beg + 4], mems=mems, return_log_probs=True)
            mems, ref = out.mems, [*ref, out.log_probs]
    torch.testing.assert_close(got.log_probs, torch.cat(ref, 1)[:, 7:], rtol=0, atol=1e-6)
    assert got.count == 18 and memory.seen == 0 and memory.mems == []
    assert [m.shape for m in got.mems] == [m.shape for m in mems] and got.mem_mask is None
