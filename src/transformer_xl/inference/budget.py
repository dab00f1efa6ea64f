"""The memory that scoring with a model's lengths takes, checked against the machine before it is allocated.

A model's ``config.json`` says which lengths it reads with (``tgt_len``, ``mem_len``), and a command may change
them (``--mem-len``); none of them is bounded by the weights. The inference cache of a stream
(:mod:`transformer_xl.model.cache`) allocates its buffers for the memory, the segment and a slack of
``mem_len // 2`` positions at the first segment, so a ``mem_len`` of 10**9 asks for hundreds of gigabytes
however short the text. :func:`check_scoring` estimates what one forward over ``rows`` streams needs and refuses
it in one line when the device does not have that much available.

Notation: ``B`` rows, ``Q = min(tgt_len, positions)`` queries, ``M = min(mem_len, positions - Q)`` memory
positions, ``K = M + Q`` keys, ``C`` the cache's capacity (:func:`transformer_xl.model.cache.capacity`), ``L``
layers, ``H`` heads of ``E``, ``D = d_model``, ``I = d_inner``, ``V = n_token``, ``P`` parameters; 4 bytes a
float. In floats:

* ``memory = B C (2 L H E + (L + 1) D)``: each layer's keys and values, and the ``L + 1`` hidden states the next
  memory keeps (none when ``mem_len`` is 0);
* ``attention = 3 B H Q K``: one layer's scores, their position term and probabilities;
* ``positions = K D + 2 L K H E``: the relative position table and each layer's projection of it (kept twice as
  long as needed);
* ``activations = B Q (8 D + I + 3 H E)``: one layer's inputs, projections and feed-forward;
* ``logits = 2 B Q V``: the output distribution and its log-softmax, ``V`` the shortlist plus each tail cluster
  weighted by its Zipfian share for an adaptive softmax (all of ``V`` when every log-probability is asked for);
* ``weights = 2 P`` when the model is still to be loaded: the model and the tensors read from its file.

An order of magnitude for refusing what cannot fit (the lengths of a wrong or hostile config), not an allocator
simulation; estimates under :data:`SMALL` bytes are taken without reading the machine's memory at all.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch

from transformer_xl.devices import available_bytes
from transformer_xl.errors import ConfigError
from transformer_xl.model import TXLConfig
from transformer_xl.model.cache import capacity

__all__ = ["SMALL", "available_bytes", "check_scoring", "scoring_bytes"]

#: Estimates below this many bytes are never checked (every machine that runs torch has that much).
SMALL = 256 * 2**20
_FLOAT = 4
_GB = 1e9


def scoring_bytes(config: TXLConfig, *, rows: int, positions: int, tgt_len: int | None = None,
                  mem_len: int | None = None, full_distribution: bool = False,
                  weights: bool = False) -> dict[str, int]:
    """The bytes one forward of ``rows`` streams of up to ``positions`` tokens takes with ``tgt_len`` and
    ``mem_len`` (default: the config's), by part (see the module docstring), with their ``total``.
    ``full_distribution``: every log-probability is computed (greedy checks); ``weights``: the model is still to
    be loaded."""
    tgt = config.tgt_len if tgt_len is None else tgt_len
    mem = config.mem_len if mem_len is None else mem_len
    q = max(1, min(tgt, positions))
    m = min(mem, max(positions - q, 0))
    k, he, n_layer, d = m + q, config.n_head * config.d_head, config.n_layer, config.d_model
    cap = capacity(mlen=m, qlen=q, mem_len=mem) if mem > 0 else 0
    floats = {
        "memory": rows * cap * (2 * n_layer * he + (n_layer + 1) * d),
        "attention": 3 * rows * config.n_head * q * k,
        "positions": k * d + 2 * n_layer * k * he,
        "activations": rows * q * (8 * d + config.d_inner + 3 * he),
        "logits": 2 * rows * q * (config.n_token if full_distribution else _columns(config)),
        "weights": 2 * config.parameter_count() if weights else 0,
    }
    parts = {name: n * _FLOAT for name, n in floats.items()}
    parts["total"] = sum(parts.values())
    return parts


def _columns(config: TXLConfig) -> int:
    """The logits a target position costs: ``V`` for a full softmax; the head and each tail cluster by its share of
    a Zipfian text (``ln(hi / lo) / ln V``) for the adaptive softmax, whose tails are computed only for their rows."""
    if not config.cutoffs:
        return config.n_token
    bounds = [*config.cutoffs, config.n_token]
    share = sum(math.log(hi / lo) / math.log(config.n_token) * (hi - lo) for lo, hi in pairwise(bounds))
    return config.cutoffs[0] + len(config.cutoffs) + math.ceil(share)


def check_scoring(config: TXLConfig, *, rows: int, positions: int, device: str | torch.device,
                  tgt_len: int | None = None, mem_len: int | None = None, full_distribution: bool = False,
                  weights: bool = False) -> None:
    """A one-line :class:`ConfigError` when :func:`scoring_bytes` is more than ``device`` has available
    (:func:`available_bytes`); nothing when the estimate is under :data:`SMALL` or the memory is unknown."""
    parts = scoring_bytes(config, rows=rows, positions=positions, tgt_len=tgt_len, mem_len=mem_len,
                          full_distribution=full_distribution, weights=weights)
    total = parts.pop("total")
    if total < SMALL:
        return
    avail = available_bytes(device)
    if avail is None or total <= avail:
        return
    largest = max(parts, key=parts.__getitem__)
    tgt = config.tgt_len if tgt_len is None else tgt_len
    mem = config.mem_len if mem_len is None else mem_len
    raise ConfigError(f"scoring with tgt_len={tgt:,} and mem_len={mem:,} ({rows} stream{'s' * (rows != 1)} of up "
                      f"to {positions:,} tokens, {config.n_layer} layers of d_model {config.d_model}) needs about "
                      f"{total / _GB:,.1f} GB ({largest} {parts[largest] / _GB:,.1f} GB) but {device} has "
                      f"{avail / _GB:,.1f} GB available: lower mem_len, tgt_len or the batch size, or fix the "
                      "lengths of the model's config.json")
