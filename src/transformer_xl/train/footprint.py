"""How much memory a training run needs, estimated from its configuration before anything is allocated, and a
one-line refusal when the device does not have it (the trainer calls :func:`check_fits`; ``--force`` skips it).

The estimate is an honest order of magnitude, not an allocator simulation: against the peak RSS of three CPU
training steps of eight small configurations (activation-, logit- and parameter-heavy, adaptive softmax,
dropout, batch_chunk 4, SGD with recompute, bf16) it gave 0.70 to 0.93 of what was measured.

Notation: ``B`` rows per process, ``R = ceil(B / batch_chunk)`` rows of one chunk, ``Q = tgt_len``,
``M = mem_len``, ``K = tgt_len + ext_len + mem_len`` keys, ``D = d_model``, ``H = n_head``, ``E = d_head``,
``I = d_inner``, ``L = n_layer``, ``V = n_token``, ``P`` parameters
(:meth:`transformer_xl.model.TXLConfig.parameter_count`);
``a`` bytes per activation (4 in fp32, 2 under bf16/fp16 autocast), ``f = 4`` bytes per float32. In bytes:

* ``parameters = f P`` (float32 master weights; under autocast ``+ 2 P`` for the half copies of one forward);
* ``gradients = f P``, plus ``f sum_i V_i d_i`` with ``tie_weight`` (the input and output embedding tables each
  produce a gradient before they are summed);
* ``optimizer = f P (s + 1)`` for ``s`` states (Adam 2: two moments; SGD with momentum 1; Adagrad 1: the sum of
  squares) and one parameter-sized temporary of the update (``foreach`` kernels);
* ``activations`` of one chunk, kept for backward:
  embeddings ``3 R Q D a``; per layer ``R Q (6 D + 5 H E + I) a + 3 R K H E a`` (inputs of the projections,
  queries, keys and values in head-major copies, the attention output, dropout masks, the residual sums and
  LayerNorms, the feed-forward hidden layer) plus the attention probabilities ``R H Q K`` (``a + 2`` bytes
  under autocast, where the softmax runs in float32; with ``dropatt`` also the dropped copy and a 1-byte
  mask; none with ``recompute``), and once the transient scores of one layer, ``3 R H Q K a``;
* ``memories = 2 (L + 1) B M D a``: the memories of all the process's rows, the old and the new ones;
* ``logits = R Q C (a + 3 f)``: the output layer's logits, their float32 log-softmax and two gradients, over
  ``C = V`` columns (full softmax), ``C = shortlist + clusters + sum_i share_i V_i`` (adaptive softmax: a
  tail cluster is computed only for the rows whose target falls in it; ``share_i = ln(hi_i / lo_i) / ln V``
  is its share of a Zipfian text) or ``C = 1 + S + D`` (sampled softmax with ``S`` samples).

Not counted: the process itself (Python, torch, the corpus), allocator slack and fragmentation, evaluation
(which needs far less: no gradient).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise

import torch

from transformer_xl.devices import available_bytes
from transformer_xl.errors import ConfigError, check_int
from transformer_xl.model import TXLConfig

#: Float32 optimizer states per parameter.
OPTIMIZER_STATES = {"adam": 2, "sgd": 1, "adagrad": 1}
#: Bytes of one activation element under each training precision (autocast keeps float32 weights).
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_F32 = 4
_GB = 1e9


def estimate_training_bytes(model_cfg: TXLConfig, batch_size_per_process: int, batch_chunk: int = 1,
                            optim: str = "adam", precision: str = "fp32", *,
                            recompute: bool = False) -> dict[str, int]:
    """The memory one training step needs, in bytes, by part (see the module docstring for every formula):
    ``parameters``, ``gradients``, ``optimizer``, ``activations``, ``memories``, ``logits`` and their
    ``total``."""
    check_int("batch_size_per_process", batch_size_per_process, 1)
    check_int("batch_chunk", batch_chunk, 1)
    if optim not in OPTIMIZER_STATES:
        raise ConfigError(f"optim must be one of {', '.join(OPTIMIZER_STATES)}, got {optim!r}")
    if precision not in ACTIVATION_BYTES:
        raise ConfigError(f"precision must be one of {', '.join(ACTIVATION_BYTES)}, got {precision!r}")
    cfg, a = model_cfg, ACTIVATION_BYTES[precision]
    half = precision != "fp32"
    n_params = cfg.parameter_count()
    tables = sum(v * d_i for v, d_i in cfg.cluster_shapes())
    rows = -(-batch_size_per_process // batch_chunk)
    q, k, d, he = cfg.tgt_len, cfg.max_klen, cfg.d_model, cfg.n_head * cfg.d_head
    scores = rows * cfg.n_head * q * k  # elements of one [R, H, Q, K] tensor
    prob_bytes = a + (2 if half else 0) + ((a + 1) if cfg.dropatt > 0 else 0)
    per_layer = rows * q * (6 * d + 5 * he + cfg.d_inner) * a + 3 * rows * k * he * a
    per_layer += 0 if recompute else scores * prob_bytes
    parts = {
        "parameters": n_params * (_F32 + (2 if half else 0)),
        "gradients": (n_params + (tables if cfg.tie_weight else 0)) * _F32,
        "optimizer": n_params * _F32 * (OPTIMIZER_STATES[optim] + 1),
        "activations": 3 * rows * q * d * a + cfg.n_layer * per_layer + 3 * scores * a,
        "memories": 2 * (cfg.n_layer + 1) * batch_size_per_process * cfg.mem_len * d * a,
        "logits": rows * q * softmax_columns(cfg) * (a + 3 * _F32),
    }
    parts["total"] = sum(parts.values())
    return parts


def softmax_columns(cfg: TXLConfig) -> int:
    """The logits one target position costs in training: ``V`` for a full softmax, the head plus each tail
    cluster weighted by its Zipfian share for the adaptive softmax, ``1 + S + D`` for a sampled one."""
    if cfg.sample_softmax > 0:
        return 1 + cfg.sample_softmax + cfg.d_model
    if not cfg.cutoffs:
        return cfg.n_token
    bounds = [*cfg.cutoffs, cfg.n_token]
    tails = sum(math.log(hi / lo) / math.log(cfg.n_token) * (hi - lo) for lo, hi in pairwise(bounds))
    return cfg.cutoffs[0] + len(cfg.cutoffs) + math.ceil(tails)


def check_fits(estimate_bytes: int | Mapping[str, int], device: str | torch.device) -> None:
    """A one-line :class:`ConfigError` when ``estimate_bytes`` (a number, or the dict of
    :func:`estimate_training_bytes`, whose largest part is then named) is more than ``device`` has available
    (:func:`available_bytes`)."""
    parts = dict(estimate_bytes) if isinstance(estimate_bytes, Mapping) else {}
    total = int(parts.pop("total")) if parts else int(estimate_bytes)  # type: ignore[arg-type]
    avail = available_bytes(device)
    if avail is None or total <= avail:  # an unknown amount: nothing to compare with
        return
    largest = max(parts, key=parts.__getitem__) if parts else None
    detail = f", {largest} {parts[largest] / _GB:,.1f} GB" if largest else ""
    raise ConfigError(f"training needs about {total / _GB:,.1f} GB (estimated{detail}) but {device} has "
                      f"{avail / _GB:,.1f} GB available: lower batch_size, tgt_len or mem_len, raise batch_chunk "
                      "or use recompute (--force tries anyway)")
