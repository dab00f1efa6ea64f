"""The training batches of a run: ordered or sentence streams, this process's rows, resumable."""

from __future__ import annotations

import json
from itertools import islice, pairwise

import numpy as np
import pytest
import torch

from tests.helpers import tiny_config, tiny_train_config
from transformer_xl.data import Corpus, LMMultiFileIterator, LMOrderedIterator
from transformer_xl.train.batches import train_iterator


def _plain_corpus(n: int = 203) -> Corpus:
    """``train`` is ``0, 1, ..., n-1``: each stream counts up, so a target is its input plus one."""
    return Corpus.from_arrays("plain", {"train": np.arange(n)})


def _sentence_corpus(n_sent: int = 40, files: list[int] | None = None) -> Corpus:
    """Sentences of 3..9 tokens counting up from ``100 * i``: within a sentence a target is its input plus one,
    and no two sentences share a token."""
    rng = np.random.default_rng(0)
    sentences = [100 * i + np.arange(int(rng.integers(3, 10))) for i in range(n_sent)]
    offsets = np.cumsum([0] + [len(s) for s in sentences])
    corpus = Corpus.from_arrays("sentences", {"train": np.concatenate(sentences)})
    corpus.extras = {"train.sent_offsets": offsets}
    if files is not None:
        corpus.extras["train.file_offsets"] = np.asarray(files)
    return corpus


def _iterator(corpus: Corpus, tmp_path, *, rank: int = 0, world_size: int = 1, tgt_len: int = 5, ext_len: int = 0,
              **train: object):
    cfg = tiny_train_config(tmp_path / "run", **train)
    return train_iterator(corpus, cfg, tiny_config(tgt_len=tgt_len, ext_len=ext_len), rank=rank,
                          world_size=world_size, device="cpu")


def _take(it, n: int) -> list:
    return list(islice(iter(it), n))


def test_plain_corpus_gives_ordered_streams(tmp_path) -> None:
    it = _iterator(_plain_corpus(203), tmp_path, batch_size=4, tgt_len=5)
    assert isinstance(it, LMOrderedIterator) and not it.varlen
    batches = list(it)
    n_step = 203 // 4
    assert len(batches) == -(-(n_step - 1) // 5)
    first = batches[0]
    assert first.input_ids.shape == (4, 5) and first.targets.shape == (4, 5) and first.seq_len == 5
    assert first.input_ids.dtype == torch.int64 and first.input_ids.device.type == "cpu"
    # stream b holds tokens [b * n_step, (b + 1) * n_step): the rows start there and read on in order
    assert first.input_ids[:, 0].tolist() == [b * n_step for b in range(4)]
    for batch in batches:
        assert torch.equal(batch.targets, batch.input_ids + 1)
    assert torch.equal(batches[1].input_ids[:, 0], first.input_ids[:, 0] + 5)
    # every position but the first of each stream is a target exactly once
    targets = torch.cat([b.targets for b in batches], dim=1)
    assert torch.equal(targets, torch.arange(4 * n_step).view(4, n_step)[:, 1:])


def test_ext_len_and_varlen_come_from_the_configs(tmp_path) -> None:
    it = _iterator(_plain_corpus(203), tmp_path, batch_size=4, tgt_len=5, ext_len=2)
    second = _take(it, 2)[1]
    assert second.input_ids.shape == (4, 7) and second.targets.shape == (4, 5)  # 2 extra context tokens
    assert torch.equal(second.targets, second.input_ids[:, 2:] + 1)
    varlen = _iterator(_plain_corpus(2003), tmp_path, batch_size=4, tgt_len=8, varlen=True)
    assert varlen.varlen
    lengths = {b.seq_len for b in varlen}
    assert len(lengths) > 1  # Gaussian segment lengths around tgt_len


@pytest.mark.parametrize("sentences", [False, True], ids=["ordered", "sentences"])
def test_the_ranks_rows_together_are_the_single_process_batch(tmp_path, sentences: bool) -> None:
    corpus = _sentence_corpus() if sentences else _plain_corpus()
    single = _take(_iterator(corpus, tmp_path, batch_size=4), 4)
    ranks = [_take(_iterator(corpus, tmp_path, batch_size=4, rank=r, world_size=2), 4) for r in (0, 1)]
    for whole, half0, half1 in zip(single, *ranks):
        assert half0.input_ids.shape == (2, 5) and half1.targets.shape == (2, 5)
        assert torch.equal(torch.cat([half0.input_ids, half1.input_ids]), whole.input_ids)
        assert torch.equal(torch.cat([half0.targets, half1.targets]), whole.targets)


def test_sentence_offsets_give_sentence_streams(tmp_path) -> None:
    corpus = _sentence_corpus()
    it = _iterator(corpus, tmp_path, batch_size=2, tgt_len=4, seed=3)
    assert isinstance(it, LMMultiFileIterator) and it.seed == 3 and it.shuffle
    assert it.file_offsets.tolist() == [0, 40]  # no shard boundaries: one file of every sentence
    batches = list(it)
    assert batches and all(b.input_ids.shape == (2, 4) and b.targets.shape == (2, 4) for b in batches)
    for b in batches:  # an input and its target always lie in the same sentence (the last token never is an input)
        assert torch.equal(b.targets, b.input_ids + 1)
    inputs = torch.cat([b.input_ids.flatten() for b in batches]).tolist()
    assert len(set(inputs)) == len(inputs)  # no token is read twice
    # the sentence order is shuffled with the run's seed: the same seed gives the same batches, another does not
    same = list(_iterator(corpus, tmp_path, batch_size=2, tgt_len=4, seed=3))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, same))
    other = list(_iterator(corpus, tmp_path, batch_size=2, tgt_len=4, seed=4))
    assert not all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, other))


def test_sentence_streams_follow_the_shards(tmp_path) -> None:
    it = _iterator(_sentence_corpus(files=[0, 20, 40]), tmp_path, batch_size=2, tgt_len=4)
    assert it.file_offsets.tolist() == [0, 20, 40]
    shard_of_batch = []
    for b in it:
        shards = {int(t) // 100 // 20 for t in b.input_ids.flatten()}
        assert len(shards) == 1  # a batch never mixes shards (fresh streams per file)
        shard_of_batch.append(shards.pop())
    # each shard's batches come as one run: the shard changes exactly once
    assert set(shard_of_batch) == {0, 1}
    assert sum(a != b for a, b in pairwise(shard_of_batch)) == 1


@pytest.mark.parametrize("sentences", [False, True], ids=["ordered-varlen", "sentences"])
def test_state_dict_resumes_the_same_batches(tmp_path, sentences: bool) -> None:
    corpus = _sentence_corpus() if sentences else _plain_corpus(2003)
    kw = dict(batch_size=4, tgt_len=5, varlen=not sentences, seed=11)
    reference = _take(_iterator(corpus, tmp_path, **kw), 7)

    first = _iterator(corpus, tmp_path, **kw)
    gen = iter(first)
    for _ in range(3):
        next(gen)
    state = json.loads(json.dumps(first.state_dict()))  # it is saved as JSON in a checkpoint

    resumed = _iterator(corpus, tmp_path, **kw)
    resumed.load_state_dict(state)
    continued = _take(resumed, 4)
    assert len(continued) == len(reference[3:]) == 4
    for want, got in zip(reference[3:], continued):
        assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.targets, want.targets)
        assert got.seq_len == want.seq_len
