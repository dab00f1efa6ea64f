"""The training batches of a run: the process's rows of ordered streams (official ``LMOrderedIterator``,
optionally ``varlen``), or of sentence streams over shards for One Billion Word. Both are resumable
(``state_dict`` holds the position as JSON)."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer_xl.data import LMMultiFileIterator, LMOrderedIterator
from transformer_xl.devices import is_cuda
from transformer_xl.model import TXLConfig
from transformer_xl.train.config import TrainConfig


def train_iterator(corpus: Any, cfg: TrainConfig, model_cfg: TXLConfig, *, rank: int, world_size: int,
                   device: str) -> Any:
    """The iterator over ``corpus``'s train split for process ``rank`` of ``world_size``."""
    dev = device if is_cuda(device) else None
    data = corpus.splits["train"]
    common = dict(rank=rank, world_size=world_size, device=dev)
    offsets = corpus.sentence_offsets("train")
    if offsets is not None:
        files = corpus.extras.get("train.file_offsets", np.asarray([0, len(offsets) - 1]))
        return LMMultiFileIterator(data, offsets, files, cfg.batch_size, model_cfg.tgt_len, model_cfg.ext_len,
                                   seed=cfg.seed, **common)
    return LMOrderedIterator(data, cfg.batch_size, model_cfg.tgt_len, model_cfg.ext_len, varlen=cfg.varlen,
                             seed=cfg.seed, **common)
