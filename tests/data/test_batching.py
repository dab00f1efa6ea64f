"""Iterator invariants: order, alignment, coverage, ranks, resume, varlen, sentence streams."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from transformer_xl.data import LMMultiFileIterator, LMOrderedIterator, LMShuffledIterator, LMVarLenIterator
from transformer_xl.errors import DataError


def official_ordered(data: np.ndarray, bsz: int, bptt: int, ext: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The official time-first iterator, transposed to batch-first."""
    n_step = len(data) // bsz
    d = data[: n_step * bsz].reshape(bsz, -1).T
    out = []
    for i in range(0, n_step - 1, bptt):
        seq_len = min(bptt, n_step - 1 - i)
        out.append((d[max(0, i - ext) : i + seq_len].T, d[i + 1 : i + 1 + seq_len].T))
    return out


@pytest.mark.parametrize(("n", "bsz", "bptt", "ext"), [(1003, 4, 7, 0), (1000, 5, 10, 3), (64, 8, 100, 2)])
def test_ordered_matches_official_and_covers_every_token(n: int, bsz: int, bptt: int, ext: int) -> None:
    data = np.arange(n, dtype=np.uint16) % 50_000
    it = LMOrderedIterator(data, bsz, bptt, ext)
    batches = list(it)
    ref = official_ordered(data.astype(np.int64), bsz, bptt, ext)
    assert len(batches) == len(ref) == len(it)
    for b, (x, y) in zip(batches, ref):
        assert b.input_ids.dtype == torch.long and b.input_ids.shape[0] == bsz
        np.testing.assert_array_equal(b.input_ids.numpy(), x)
        np.testing.assert_array_equal(b.targets.numpy(), y)
        # targets[:, t] is the token following input_ids[:, ext+t]
        np.testing.assert_array_equal(b.targets.numpy()[:, :-1], b.input_ids.numpy()[:, -b.seq_len + 1 :])
    streams = data[: (n // bsz) * bsz].reshape(bsz, -1)
    targets = np.concatenate([b.targets.numpy() for b in batches], axis=1)
    np.testing.assert_array_equal(targets, streams[:, 1:])  # every token once per epoch, in order


def test_ranks_disjoint_and_union_is_single_process_batch() -> None:
    data = np.random.default_rng(0).integers(0, 1000, size=5000)
    full = list(LMOrderedIterator(data, 8, 16, 4))
    per_rank = [list(LMOrderedIterator(data, 8, 16, 4, rank=r, world_size=4)) for r in range(4)]
    for k, batch in enumerate(full):
        parts = [per_rank[r][k] for r in range(4)]
        assert all(p.input_ids.shape[0] == 2 for p in parts)
        torch.testing.assert_close(torch.cat([p.input_ids for p in parts]), batch.input_ids)
        torch.testing.assert_close(torch.cat([p.targets for p in parts]), batch.targets)
    rows = [set(map(tuple, LMOrderedIterator(data, 8, 16, rank=r, world_size=4).streams.tolist())) for r in range(4)]
    assert all(not (rows[a] & rows[b]) for a in range(4) for b in range(a + 1, 4))
    with pytest.raises(DataError, match="multiple of world_size"):
        LMOrderedIterator(data, 6, 16, world_size=4)


@pytest.mark.parametrize("varlen", [False, True])
def test_resume_gives_identical_batches(varlen: bool) -> None:
    data = np.arange(20_000) % 777
    it = LMOrderedIterator(data, 4, 20, 5, varlen=varlen, seed=3)
    stream = iter(it)
    for _ in range(37):
        next(stream)
    state = json.loads(json.dumps(it.state_dict()))
    expected = [next(stream) for _ in range(30)]
    other = LMOrderedIterator(data, 4, 20, 5, varlen=varlen, seed=99)
    other.load_state_dict(state)
    got = list(zip(range(30), other))
    for (_, b), e in zip(got, expected):
        assert b.seq_len == e.seq_len
        torch.testing.assert_close(b.input_ids, e.input_ids)
    with pytest.raises(DataError, match="iterator state has n_step=5000"):
        LMOrderedIterator(data, 8, 20, varlen=varlen).load_state_dict(state)


def test_epochs_continue_and_varlen_lengths() -> None:
    data = np.arange(10_000)
    it = LMVarLenIterator(data, 2, 50, seed=0)
    lens = [b.seq_len for b in it]
    assert it.epoch == 1 and it.position == 0
    assert max(lens) <= 50 + 15 and min(lens[:-1]) >= 5 and 25 <= np.median(lens) <= 60
    assert sum(lens) >= it.n_step - 2
    targets = np.concatenate([b.targets.numpy()[0] for b in LMVarLenIterator(data, 2, 50, seed=1)])
    np.testing.assert_array_equal(targets, np.arange(1, 1 + targets.size))  # contiguous, no gaps
    second = [b.seq_len for b in it]
    assert second != lens and it.epoch == 2  # the generator continues across epochs


def sentences(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 15, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    data = np.arange(offsets[-1]) + 1
    data[offsets[:-1]] = 0  # <S>
    data[offsets[1:] - 1] = 0
    return data, offsets


def test_shuffled_iterator_stream_semantics() -> None:
    data, off = sentences(200)
    batches = list(LMShuffledIterator(data, off, 4, 9))
    pairs = {(int(x), int(y)) for b in batches for x, y in zip(b.input_ids.flatten(), b.targets.flatten())}
    # every pair is an in-sentence bigram (no pair crosses sentences)
    valid = {(int(data[i]), int(data[i + 1])) for s, e in itertools.pairwise(off) for i in range(s, e - 1)}
    assert pairs <= valid and len(pairs) > 0.8 * sum(off[1:] - off[:-1] - 1)
    # the first row reads the first sentence from its start, with no shuffle
    np.testing.assert_array_equal(batches[0].input_ids[0].numpy(), data[:9])


@pytest.mark.parametrize("ext", [0, 3])
def test_multifile_resume_and_ranks(ext: int) -> None:
    data, off = sentences(300, seed=1)
    files = np.array([0, 100, 180, 300])
    it = LMMultiFileIterator(data, off, files, 4, 6, ext, seed=5)
    all_batches = list(it)
    assert it.epoch == 1
    it2 = LMMultiFileIterator(data, off, files, 4, 6, ext, seed=5)
    s = iter(it2)
    for _ in range(11):
        next(s)
    state = json.loads(json.dumps(it2.state_dict()))
    it3 = LMMultiFileIterator(data, off, files, 4, 6, ext, seed=5)
    it3.load_state_dict(state)
    rest = list(it3)
    assert len(rest) == len(all_batches) - 11
    for a, b in zip(rest, all_batches[11:]):
        torch.testing.assert_close(a.input_ids, b.input_ids)
        torch.testing.assert_close(a.targets, b.targets)
    halves = [list(LMMultiFileIterator(data, off, files, 4, 6, ext, seed=5, rank=r, world_size=2)) for r in (0, 1)]
    for k, b in enumerate(all_batches):
        torch.testing.assert_close(torch.cat([halves[0][k].targets, halves[1][k].targets]), b.targets)
