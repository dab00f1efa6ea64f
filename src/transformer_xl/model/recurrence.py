"""Segment-level recurrence over one long text: :class:`Recurrence` carries the memories (paper Sec. 3.2).

Evaluation, generation, the evaluation-speed experiment and the benchmark all read a text in order, each
segment attending to the memories the previous one left. ``Recurrence`` is that loop's state: the memories,
the lengths, and (without a gradient) the inference cache of :mod:`transformer_xl.model.cache`::

    rec = Recurrence(model, model.config.lengths(mem_len=1600, same_length=True))
    with torch.no_grad(), eval_mode(model):
        for x, y in segments:
            nll = rec(x, y).nll
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from transformer_xl.model.cache import InferenceCache
from transformer_xl.model.config import Lengths
from transformer_xl.model.lm import LMOutput, TransformerXLLM


class Recurrence:
    """Memories (and the inference cache) of one text read in order by ``model`` (see the module docstring).

    Calling it runs the next segment: ``rec(input_ids, targets=None, return_log_probs=False)`` returns the
    model's :class:`~transformer_xl.model.lm.LMOutput` and keeps its memories for the next call.
    ``inference_cache=False``
    projects every memory again at every segment (the plain formula); the cache is only used without a
    gradient.
    """

    def __init__(self, model: TransformerXLLM | Any, lengths: Lengths | None = None, *, inference_cache: bool = True,
                 mems: list[Tensor] | None = None) -> None:
        self.model = model  # a TransformerXLLM, or a wrapper of one that takes the same arguments (compiled)
        self.lengths = lengths
        self.mems: list[Tensor] = list(mems or [])
        self.cache = InferenceCache() if inference_cache else None

    def __call__(self, input_ids: Tensor, targets: Tensor | None = None, **kwargs: Any) -> LMOutput:
        cache = self.cache if self.cache is not None and not torch.is_grad_enabled() else None
        out = self.model(input_ids, targets, self.mems, lengths=self.lengths, cache=cache, **kwargs)
        self.mems = out.mems
        return out

    def reset(self) -> None:
        """Start the text over: no memory."""
        self.mems = []
        if self.cache is not None:
            self.cache.clear()


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model.eval()`` for the block, then its previous train/eval mode again (nothing to do, and no module
    walked, when the model is in eval mode already: generation enters this once per token)."""
    was_training = model.training
    if not was_training:
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
