"""Segment-level recurrence (paper Sec. 3.2): the memory update and the causal masks."""

from __future__ import annotations

import pytest
import torch

from transformer_xl.model.memory import (
    additive_mask,
    causal_mask,
    episode_mask,
    kept_range,
    padded_mask_bias,
    update_mems,
    update_padded_mems,
)


@pytest.mark.parametrize("mlen,qlen,mem_len,ext_len", [(0, 4, 6, 0), (6, 4, 6, 0), (3, 4, 6, 0), (6, 4, 3, 0),
                                                       (2, 5, 4, 2), (0, 3, 8, 1)])
def test_update_mems_equals_cat_slice(mlen: int, qlen: int, mem_len: int, ext_len: int) -> None:
    mems = [torch.randn(2, mlen, 3)]
    hids = [torch.randn(2, qlen, 3, requires_grad=True)]
    end = mlen + max(0, qlen - ext_len)
    beg = max(0, end - mem_len)
    (new,) = update_mems(hids, mems, mlen=mlen, qlen=qlen, mem_len=mem_len, ext_len=ext_len)
    assert torch.equal(new, torch.cat([mems[0], hids[0]], 1)[:, beg:end])
    assert not new.requires_grad


@pytest.mark.parametrize("qlen,mlen,mem_len", [(4, 0, 4), (4, 4, 4), (3, 6, 6), (5, 2, 4), (1, 8, 8)])
def test_causal_mask_sees_the_past_only(qlen: int, mlen: int, mem_len: int) -> None:
    mask = causal_mask(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=False, device=torch.device("cpu"))
    for i in range(qlen):
        assert not mask[i, : mlen + i + 1].any() and mask[i, mlen + i + 1:].all()


@pytest.mark.parametrize("qlen,mlen,mem_len", [(4, 4, 4), (3, 6, 6), (5, 2, 4), (2, 8, 8), (4, 0, 6)])
def test_same_length_gives_every_query_the_same_number_of_keys(qlen: int, mlen: int, mem_len: int) -> None:
    """Query i sees min(mem_len, mlen + i + 1) keys (itself included): mem_len once that much context exists."""
    mask = causal_mask(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=True, device=torch.device("cpu"))
    assert (~mask).sum(1).tolist() == [min(mem_len, mlen + i + 1) for i in range(qlen)]
    for i in range(qlen):  # what each query sees is a contiguous run ending at its own position
        seen = (~mask[i]).nonzero().flatten()
        assert seen.max() == mlen + i and (seen.diff() == 1).all()


def test_additive_mask_is_zero_or_minus_infinity() -> None:
    mask = causal_mask(qlen=3, mlen=2, mem_len=2, same_length=False, device=torch.device("cpu"))
    bias = additive_mask(mask, torch.float32)
    assert torch.equal(bias == 0, ~mask) and (bias[mask] == float("-inf")).all() and mask.any()


def test_kept_range_leaves_the_extended_context_out() -> None:
    assert kept_range(mlen=6, qlen=4, mem_len=6, ext_len=0) == (4, 10)
    assert kept_range(mlen=6, qlen=4, mem_len=6, ext_len=2) == (2, 8)
    assert kept_range(mlen=0, qlen=3, mem_len=8, ext_len=1) == (0, 2)
    assert kept_range(mlen=3, qlen=4, mem_len=0, ext_len=0) == (7, 7)


def test_episode_mask_keeps_each_step_inside_its_episode() -> None:
    """Row 0 starts a new episode at step 1, row 1 has one valid memory position: by hand, key by key."""
    reset = torch.tensor([[False, True, False], [False, False, False]])
    valid = torch.tensor([[True, True], [False, True]])
    masked, ids = episode_mask(reset=reset, valid=valid, mem_len=2, window=False)
    assert ids.tolist() == [[0, 0, 0, 1, 1], [-1, 0, 0, 0, 0]]
    sees = (~masked).int().tolist()
    assert sees[0] == [[1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]  # the memory is gone after the reset
    assert sees[1] == [[0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 1, 1, 1, 1]]  # the invalid position never seen


def test_episode_mask_window_limits_each_step_to_mem_len_steps_back() -> None:
    reset = torch.zeros(1, 3, dtype=torch.bool)
    masked, _ = episode_mask(reset=reset, valid=torch.ones(1, 2, dtype=torch.bool), mem_len=2, window=True)
    assert (~masked[0]).int().tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]


def test_padded_mask_bias_masks_padding_keys_but_never_a_query_itself() -> None:
    base = additive_mask(causal_mask(qlen=3, mlen=2, mem_len=4, same_length=False, device=torch.device("cpu")),
                         torch.float32)
    key_mask = torch.tensor([[True, True, True, True, True], [False, False, False, True, True]])
    bias = padded_mask_bias(base, key_mask, mlen=2)
    assert bias.shape == (2, 1, 3, 5)
    assert torch.equal(bias[0, 0], base)  # nothing padded: the causal mask as it was
    allowed = bias[1, 0] == 0
    # row 1: keys 0-2 are padding; query 0 (key 2, itself padding) sees only itself, queries 1-2 the real keys
    assert allowed.tolist() == [[False, False, True, False, False], [False, False, False, True, False],
                                [False, False, False, True, True]]


def test_update_padded_mems_keeps_each_rows_last_real_positions_right_aligned() -> None:
    mems = [torch.arange(2 * 2 * 1, dtype=torch.float32).view(2, 2, 1)]  # rows: [0, 1], [2, 3]
    hids = [torch.arange(10, 16, dtype=torch.float32).view(2, 3, 1)]  # rows: [10, 11, 12], [13, 14, 15]
    key_mask = torch.tensor([[True, True, True, False, False],  # row 0: memory, then one token and padding
                             [False, True, True, True, True]])
    new, mask = update_padded_mems(hids, mems, key_mask, mem_len=3)
    assert new[0].squeeze(-1).tolist() == [[0, 1, 10], [13, 14, 15]]
    assert mask.tolist() == [[True, True, True], [True, True, True]]
    new, mask = update_padded_mems(hids, mems, key_mask, mem_len=5)  # more room than real positions
    assert new[0].squeeze(-1).tolist() == [[11, 12, 0, 1, 10], [2, 3, 13, 14, 15]]
    assert mask.tolist() == [[False, False, True, True, True], [False, True, True, True, True]]


def test_the_tf_codes_same_length_window_is_one_key_longer() -> None:
    """TF's _create_mask: query i of a segment after a memory of M sees keys i .. M + i (M + 1 of them); the
    PyTorch code's mask with a window of mem_len: M keys, itself included. Lengths.window is what the model passes."""
    from transformer_xl.model.config import Lengths

    q, m = 4, 6
    tf = ~causal_mask(qlen=q, mlen=m, mem_len=Lengths(mem_len=m, same_length=True, tf_memory=True).window,
                      same_length=True, device=torch.device("cpu"))
    pt = ~causal_mask(qlen=q, mlen=m, mem_len=Lengths(mem_len=m, same_length=True).window, same_length=True,
                      device=torch.device("cpu"))
    for i in range(q):
        assert tf[i].nonzero().flatten().tolist() == list(range(i, m + i + 1))
        assert pt[i].nonzero().flatten().tolist() == list(range(i + 1, m + i + 1))
