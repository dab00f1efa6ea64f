"""Batch iterators, batch-first, resumable (``state_dict``) and distributed-aware (``rank``/``world_size``).

* :class:`LMOrderedIterator` — the official ``LMOrderedIterator``: the corpus cut into ``batch_size``
  contiguous streams, consecutive segments of ``tgt_len`` targets with ``ext_len`` extra context;
  ``varlen=True`` gives the official ``get_varlen_iter`` lengths from a seeded generator.
* :class:`LMShuffledIterator` / :class:`LMMultiFileIterator` — One Billion Word sentence streams.

With ``world_size`` ranks the global batch's rows are split into equal contiguous blocks: rank ``r``
reads rows ``[r*b, (r+1)*b)`` with ``b = batch_size // world_size``; together the ranks read exactly
the single-process batch. All state is a JSON-serializable dict.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from transformer_xl.errors import DataError


class Batch(NamedTuple):
    """``input_ids [B, ext+T]``, ``targets [B, T]`` (``targets[:, t]`` follows ``input_ids[:, ext+t]``)."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    seq_len: int


def _as_numpy(data: np.ndarray | torch.Tensor) -> np.ndarray:
    arr = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    if arr.ndim != 1:
        raise DataError(f"token data must be 1-D, got shape {arr.shape}")
    return arr


def _rows(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is not in 0..{world_size - 1}")
    if batch_size < 1 or batch_size % world_size:
        raise DataError(f"batch_size {batch_size} must be a positive multiple of world_size {world_size}")
    per = batch_size // world_size
    return slice(rank * per, (rank + 1) * per)


def _to_tensor(a: np.ndarray, device: Any) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    return t if device is None else t.to(device)


class LMOrderedIterator:
    """Ordered LM batches over a 1-D token array, as the official ``LMOrderedIterator`` (batch-first).

    Segment ``i`` (stepping by ``tgt_len`` from 0, in stream time) has ``seq_len = min(tgt_len,
    n_step - 1 - i)`` targets ``streams[:, i+1 : i+1+seq_len]`` and inputs
    ``streams[:, max(0, i-ext_len) : i+seq_len]``. Over an epoch every stream position ``1..n_step-1``
    is a target exactly once, in order. Position and generator state survive
    :meth:`state_dict`/:meth:`load_state_dict`; a new ``for`` loop continues where the last stopped.
    """

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        batch_size: int,
        tgt_len: int,
        ext_len: int = 0,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: Any = None,
        varlen: bool = False,
        seed: int = 0,
        std: float = 5.0,
        min_len: int = 5,
        max_deviation: int = 3,
    ) -> None:
        arr = _as_numpy(data)
        if tgt_len < 1 or ext_len < 0:
            raise DataError(f"tgt_len must be >= 1 and ext_len >= 0 (got {tgt_len}, {ext_len})")
        rows = _rows(batch_size, rank, world_size)
        self.batch_size, self.tgt_len, self.ext_len = batch_size, tgt_len, ext_len
        self.rank, self.world_size, self.device = rank, world_size, device
        self.n_step = arr.shape[0] // batch_size
        if self.n_step < 2:
            raise DataError(f"{arr.shape[0]} tokens are too few for batch_size {batch_size}")
        self.streams = arr[: self.n_step * batch_size].reshape(batch_size, self.n_step)[rows]
        self.varlen, self.std, self.min_len, self.max_deviation = varlen, std, min_len, max_deviation
        self._rng = np.random.default_rng(seed)
        self.position = 0
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch (exact for fixed length; the fixed-length count for ``varlen``)."""
        return -(-(self.n_step - 1) // self.tgt_len)

    def get_batch(self, i: int, bptt: int | None = None) -> Batch:
        """The segment starting at stream position ``i`` with up to ``bptt`` targets."""
        bptt = self.tgt_len if bptt is None else bptt
        seq_len = min(bptt, self.n_step - 1 - i)
        beg = max(0, i - self.ext_len)
        x = self.streams[:, beg : i + seq_len]
        y = self.streams[:, i + 1 : i + 1 + seq_len]
        return Batch(_to_tensor(x, self.device), _to_tensor(y, self.device), int(seq_len))

    def _next_len(self) -> int:
        """The official varlen draw: 95% ``tgt_len``, 5% half of it, plus Gaussian noise, clipped."""
        bptt = self.tgt_len if self._rng.random() < 0.95 else self.tgt_len / 2.0
        max_len = self.tgt_len + self.max_deviation * self.std
        return int(min(max_len, max(self.min_len, int(self._rng.normal(bptt, self.std)))))

    def _epoch_over(self) -> bool:
        return self.position >= (self.n_step - 2 if self.varlen else self.n_step - 1)

    def __iter__(self) -> Iterator[Batch]:
        if self.position and self._epoch_over():  # the previous epoch was consumed to its end
            self.position, self.epoch = 0, self.epoch + 1
        while True:
            bptt = self._next_len() if self.varlen else self.tgt_len
            batch = self.get_batch(self.position, bptt)
            self.position += batch.seq_len
            yield batch
            if self._epoch_over():
                break
        self.position, self.epoch = 0, self.epoch + 1

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable position (and generator state for ``varlen``)."""
        fields = ("position", "epoch", "n_step", "batch_size", "tgt_len", "varlen")
        return {"kind": "ordered", **{k: getattr(self, k) for k in fields},
                "rng": self._rng.bit_generator.state if self.varlen else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (the data and batch geometry must be the same)."""
        for key in ("n_step", "batch_size", "tgt_len", "varlen"):
            if state.get(key) != getattr(self, key):
                raise DataError(f"iterator state has {key}={state.get(key)}, this iterator {getattr(self, key)}")
        self.position, self.epoch = int(state["position"]), int(state["epoch"])
        if state.get("rng") is not None:
            self._rng.bit_generator.state = state["rng"]


def LMVarLenIterator(
    data: np.ndarray | torch.Tensor, batch_size: int, tgt_len: int, ext_len: int = 0, **kwargs: Any
) -> LMOrderedIterator:
    """The official variable-length training iterator (``--varlen``): ``LMOrderedIterator(varlen=True)``."""
    return LMOrderedIterator(data, batch_size, tgt_len, ext_len, varlen=True, **kwargs)


class LMShuffledIterator:
    """Sentence-stream batches as the official ``LMShuffledIterator`` (One Billion Word valid/test).

    ``data`` is the concatenation of all sentences and ``offsets`` their ``n+1`` boundaries. Each batch
    row is a stream: it takes ``tgt_len`` tokens from its current sentence and continues with the next
    sentence of the (optionally shuffled) order; the last token of a sentence is only a target, never
    an input. The epoch ends, dropping the incomplete batch, when the sentences run out.
    """

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        offsets: np.ndarray,
        batch_size: int,
        tgt_len: int,
        ext_len: int = 0,
        *,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: Any = None,
    ) -> None:
        self.data = _as_numpy(data)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.rows = _rows(batch_size, rank, world_size)
        self.batch_size, self.tgt_len, self.ext_len = batch_size, tgt_len, ext_len
        self.shuffle, self.seed, self.device = shuffle, seed, device
        self.epoch = 0
        self.done = 0  # batches yielded in the current epoch (or file)

    def _order(self, first: int, last: int, *key: int) -> np.ndarray:
        idx = np.arange(first, last, dtype=np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, self.epoch, *key]).shuffle(idx)
        return idx

    def _batches(self, sentences: np.ndarray, skip: int) -> Iterator[Batch]:
        """Fill ``[batch_size, tgt_len]`` from the sentence order; skipped batches are not yielded."""
        B, T, data, off = self.batch_size, self.tgt_len, self.data, self.offsets
        cursor = iter(sentences.tolist())
        streams: list[list[int]] = [[0, 0] for _ in range(B)]  # [start, end) of the rest of each row's sentence
        prev: np.ndarray | None = None
        n = 0
        while True:
            build = n >= skip or self.ext_len > 0  # with extra context, skipped batches feed the next one
            x = np.empty((B, T), dtype=np.int64)
            y = np.empty((B, T), dtype=np.int64)
            for r in range(B):
                filled, s = 0, streams[r]
                while filled < T:
                    if s[1] - s[0] <= 1:
                        nxt = next(cursor, None)
                        if nxt is None:
                            return
                        s[0], s[1] = int(off[nxt]), int(off[nxt + 1])
                        continue
                    k = min(s[1] - s[0] - 1, T - filled)
                    if build:
                        x[r, filled : filled + k] = data[s[0] : s[0] + k]
                        y[r, filled : filled + k] = data[s[0] + 1 : s[0] + 1 + k]
                    s[0] += k
                    filled += k
            if build:
                inputs = x if prev is None or not self.ext_len else np.concatenate([prev[:, -self.ext_len :], x], 1)
                prev = inputs
                if n >= skip:
                    yield Batch(_to_tensor(inputs[self.rows], self.device), _to_tensor(y[self.rows], self.device), T)
            n += 1

    def __iter__(self) -> Iterator[Batch]:
        n_sent = self.offsets.shape[0] - 1
        for batch in self._batches(self._order(0, n_sent), self.done):
            self.done += 1
            yield batch
        self.epoch, self.done = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable position: epoch, batches done, seed (orders are re-derived from them)."""
        return {"kind": "shuffled", **{k: getattr(self, k) for k in ("epoch", "done", "seed", "batch_size", "tgt_len")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (replays the sentence fill without building skipped batches)."""
        for key in ("batch_size", "tgt_len", "seed"):
            if state.get(key) != getattr(self, key):
                raise DataError(f"iterator state has {key}={state.get(key)}, this iterator {getattr(self, key)}")
        self.epoch, self.done = int(state["epoch"]), int(state["done"])


class LMMultiFileIterator(LMShuffledIterator):
    """One Billion Word training batches as the official ``LMMultiFileIterator``.

    Each epoch visits the training shards in a (shuffled) order; each shard's sentences are shuffled
    and streamed as :class:`LMShuffledIterator` does, with fresh streams per shard (the official code
    starts a new stream iterator per file, dropping the last incomplete batch of each file).
    ``file_offsets`` are the sentence indices where shards start (``n_files+1``).
    """

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        offsets: np.ndarray,
        file_offsets: np.ndarray,
        batch_size: int,
        tgt_len: int,
        ext_len: int = 0,
        *,
        shuffle: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(data, offsets, batch_size, tgt_len, ext_len, shuffle=shuffle, **kwargs)
        self.file_offsets = np.asarray(file_offsets, dtype=np.int64)
        self.file_pos = 0  # index into this epoch's file order

    def __iter__(self) -> Iterator[Batch]:
        n_files = self.file_offsets.shape[0] - 1
        files = self._order(0, n_files)
        while self.file_pos < n_files:
            f = int(files[self.file_pos])
            sentences = self._order(int(self.file_offsets[f]), int(self.file_offsets[f + 1]), f + 1)
            for batch in self._batches(sentences, self.done):
                self.done += 1
                yield batch
            self.file_pos, self.done = self.file_pos + 1, 0
        self.epoch, self.file_pos = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`LMShuffledIterator.state_dict`, plus the file position."""
        return {**super().state_dict(), "kind": "multifile", "file_pos": self.file_pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        super().load_state_dict(state)
        self.file_pos = int(state.get("file_pos", 0))
