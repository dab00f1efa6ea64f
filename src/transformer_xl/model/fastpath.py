"""Fast paths of the model: each computes exactly what a plain formula of the paper computes, faster or in
less memory, and is tested equal to it in ``tests/model/test_fastpath.py``. The math modules do not call them:
:mod:`transformer_xl.model.dispatch` chooses which runs.

==========================  ====================================================  ===============================
fast path                   replaces (the plain formula)                          gain
==========================  ====================================================  ===============================
:func:`attend_explicit`,    ``Dropout(softmax(scale (q k^T + p) + mask)) v``      with a gradient one ``baddbmm``
:func:`attend_fused`,                                                             and only the probabilities
:func:`attend_one_query`                                                          kept; the fused
                                                                                  ``scaled_dot_product_attention``
                                                                                  (with a gradient on CUDA) or,
                                                                                  for one query, two products
:func:`shift_padded`        the shift of Appendix B (:func:`positional.rel_shift`:  a view instead of a pad and two
                            pad a zero column, read ``[K+1, Q]``, drop a row)      ``[B, H, Q, K]`` copies
:class:`CompactDropout`     ``nn.Dropout``                                        a 1-byte mask kept (CPU)
:class:`ReLUDropout`        ``Dropout(ReLU(h))`` of the feed-forward              only the output kept (4 bytes
                                                                                  per element instead of 9)
:func:`recomputed`          the attention scores kept for backward                recomputed in backward
                                                                                  (``TransformerXLLM.recompute``)
:func:`mask_bias`           ``additive_mask(causal_mask(...))`` each forward      built once per set of lengths,
                                                                                  cache bounded in bytes
:func:`compiled`            the eager forward                                     one ``torch.compile`` graph per
                                                                                  segment shape (``--compile``)
:func:`cluster_nll`,        the adaptive softmax and input, cluster by cluster    each cluster only for its rows;
:func:`cluster_embed`                                                             compiled, an unbacked row count
==========================  ====================================================  ===============================

Every fast path above traces into one graph: ``torch.compile(model, fullgraph=True)`` succeeds for training with
dropout, recompute and memories and for evaluation, every ``attn_type``, and with the adaptive softmax and input
(:func:`cluster_nll`, :func:`cluster_embed`: each cluster's rows gathered, their count an unbacked size in the graph);
tested in ``tests/model/test_fastpath.py``. Under compilation inductor fuses the elementwise work around the
matmuls; the causal mask is then made in the graph rather than taken from the cache.

The inference cache of the memory's keys/values and of ``W_kR R`` is :mod:`transformer_xl.model.cache`.
Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``K`` key length, ``E`` d_head.
"""

from __future__ import annotations

import contextlib
import functools
import math
import shutil
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from transformer_xl.model.memory import additive_mask, causal_mask


# ---------------------------------------------------------------------------------------------- attention
def attend_explicit(q: Tensor, k: Tensor, v: Tensor, p: Tensor | None, mask_bias: Tensor, *, scale: float,
                    dropatt: float) -> Tensor:
    """``Dropout(softmax(scale * (q k^T + p) + mask_bias)) v`` for a recorded gradient: ``[B, H, Q, E]`` from
    ``q [B, H, Q, E]``, ``k, v [B, H, K, E]``, position scores ``p [B, H, Q, K]`` (or None) and ``mask_bias [Q, K]``
    (or ``[B, 1, Q, K]``, a mask per batch row).

    The scores are one ``baddbmm`` (``scale * p`` in, ``scale * q k^T`` added, the mask added in place) and an
    explicit softmax, so that autograd keeps only the probabilities of the ``[Q, K]`` tensors (the fused CPU kernel
    takes no gradient for an additive bias that needs one, and its fallback keeps three ``[Q, K]`` tensors).
    """
    bsz, n_head, qlen, d_head = q.shape
    klen = k.size(2)
    # Head-major batches [H*B, ...]: the position scores of the relative strategies come that way (a view).
    q3 = q.transpose(0, 1).reshape(n_head * bsz, qlen, d_head)  # [HB, Q, E]
    kt = k.transpose(0, 1).reshape(n_head * bsz, klen, d_head).transpose(1, 2)  # [HB, E, K]
    v3 = v.transpose(0, 1).reshape(n_head * bsz, klen, d_head)  # [HB, K, E]
    mask_bias = mask_bias.to(q.dtype)
    if mask_bias.dim() == 4:  # a mask per row [B, 1, Q, K] -> head-major [HB, Q, K]
        mask_bias = mask_bias.transpose(0, 1).expand(n_head, bsz, qlen, klen).reshape(n_head * bsz, qlen, klen)
    if p is None:
        scores = torch.baddbmm(mask_bias, q3, kt, alpha=scale)  # [HB, Q, K]
    else:
        p3 = p.transpose(0, 1).reshape(n_head * bsz, qlen, klen).to(q.dtype)  # [HB, Q, K]
        scores = torch.baddbmm(p3, q3, kt, beta=scale, alpha=scale).add_(mask_bias)  # [HB, Q, K]
    prob = _drop(scores.softmax(-1), dropatt)  # [HB, Q, K]
    return torch.bmm(prob, v3).view(n_head, bsz, qlen, d_head).transpose(0, 1)  # [B, H, Q, E]


def _drop(prob: Tensor, p: float) -> Tensor:
    """Attention dropout with :func:`keep_mask` on the CPU (the draws of the shifted path,
    :mod:`transformer_xl.model.shifted`, so that eager and compiled training drop the same), ``F.dropout`` elsewhere."""
    if p == 0.0:
        return prob
    if prob.device.type != "cpu" or p >= 1.0:
        return F.dropout(prob, p, training=True)
    return prob * keep_mask(prob.shape, p, prob.device) * (1.0 / (1.0 - p))


def score_bias(p: Tensor | None, mask_bias: Tensor, scale: float) -> Tensor:
    """The additive bias ``scale * p + mask_bias`` (``[B, H, Q, K]``, or the mask alone) of the fused kernels."""
    return mask_bias if p is None else torch.add(mask_bias, p, alpha=scale)


#: ``scaled_dot_product_attention``'s kernels for a bias that needs a gradient: memory-efficient (CUDA: it returns
#: it) and math; not cuDNN's (torch 2.11's first on H100/H200: no bias gradient), nor flash (no bias).
BIAS_GRAD_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend_fused(q: Tensor, k: Tensor, v: Tensor, p: Tensor | None, mask_bias: Tensor, *, scale: float,
                 dropatt: float) -> Tensor:
    """The same by ``scaled_dot_product_attention`` with the bias ``scale * p + mask``: without a gradient its fused
    kernel (on the CPU it goes over the keys in tiles with an online softmax); with one, on CUDA, the
    memory-efficient kernel, which returns the bias's gradient (so ``p``'s) and keeps no ``[Q, K]`` probabilities
    (on the CPU its math fallback: the same gradients, tested equal to the formula's)."""
    bias = score_bias(p, mask_bias, scale).to(q.dtype)  # [B, H, Q, K]
    with sdpa_kernel(BIAS_GRAD_BACKENDS) if bias.requires_grad else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropatt, scale=scale)


def attend_one_query(q: Tensor, k: Tensor, v: Tensor, p: Tensor | None, mask_bias: Tensor, *, scale: float) -> Tensor:
    """``softmax(scale (q k^T + p) + mask_bias) v`` for one query per head (``q [B, H, 1, E]``) as two batched
    products over ``[B*H]``: the fused kernel's tiling is for many queries; with one, this reads the keys and values
    once and was measured 15-25 % faster (B 8, H 10, K 1601, E 41, CPU). ``k``, ``v`` are usually views of
    the inference cache's ``[B, H, C, E]`` buffers, whose ``B`` and ``H`` merge without a copy."""
    bias = score_bias(p, mask_bias, scale).to(q.dtype)
    bsz, n_head, _, d_head = q.shape
    klen = k.size(2)
    scores = torch.baddbmm(bias.expand(bsz, n_head, 1, klen).reshape(bsz * n_head, 1, klen),
                           q.reshape(bsz * n_head, 1, d_head), k.reshape(bsz * n_head, klen, d_head).transpose(1, 2),
                           alpha=scale)  # [BH, 1, K]
    return torch.bmm(scores.softmax(-1), v.reshape(bsz * n_head, klen, d_head)).view(bsz, n_head, 1, d_head)


def recomputed(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """``fn(*args)`` with its intermediates recomputed in backward instead of kept (``torch.utils.checkpoint``):
    the same values and gradients for less memory."""
    return checkpoint(fn, *args, use_reentrant=False)


# ---------------------------------------------------------------------------------------------- the shift
def shift_padded(x: Tensor) -> Tensor:
    """The shift of Appendix B for scores that already carry the zero column in front:
    ``[..., Q, K+1] -> [..., Q, K]`` with ``out[..., i, j]`` the score of distance ``M + i - j``.

    Dropping the first row of the ``[K+1, Q]`` reading and reading the rest as ``[Q, K]`` is the same as
    skipping the first ``Q`` elements of each ``[Q, K+1]`` block, so the result is a view (no copy). The
    zero column comes free when the position keys get a zero row in front (:func:`zero_row_in_front`):
    their matmul writes it, which saves the pad and the reshape copies of two ``[B, H, Q, K]`` tensors.
    """
    *lead, q, k1 = x.shape
    return x.flatten(-2)[..., q:].view(*lead, q, k1 - 1)


def zero_row_in_front(t: Tensor) -> Tensor:
    """``[R, ...] -> [R+1, ...]`` with a zero first row (position keys whose scores suit :func:`shift_padded`)."""
    return torch.cat([t.new_zeros(1, *t.shape[1:]), t], dim=0)


# ---------------------------------------------------------------------------------------------- dropout
#: Random bits per dropout decision of :func:`keep_mask`: the drop probability is ``p`` rounded to a multiple of
#: ``2**-KEEP_BITS`` (within ``2**-17`` of ``p``).
KEEP_BITS = 16


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device) -> Tensor:
    """A boolean mask of ``shape``, each element ``True`` (kept) with probability ``1 - p``, independently.

    The CPU's generator (mt19937, one thread) is the slowest part of dropout there: ``rand_like(x) >= p`` draws 32
    random bits and converts them to a float per element (about 3.4 ms per million elements, measured on an AMD
    EPYC), and it does not use a second thread. Here 64-bit draws are cut into four 16-bit integers, each compared
    with ``p`` scaled to 16 bits: a quarter of the draws and no float conversion (about 1.2 ms per million). The drop
    probability is ``round(p * 2**16) / 2**16``, within ``2**-17`` of ``p`` (a float ``rand`` resolves ``2**-24``).
    Draws from the global generator, so its state (saved with a checkpoint) fixes the masks."""
    n = math.prod(shape)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)  # [n/4] draws
    lanes = words.view(torch.int16)[:n].view(shape)  # each uniform over [-2**15, 2**15)
    threshold = min(round(p * 2**KEEP_BITS), 2**KEEP_BITS - 1) - 2**15  # P(lane < threshold) = p, rounded
    return lanes >= threshold


class CompactDropout(nn.Dropout):
    """``nn.Dropout`` (same scaling; the drop probability to within ``2**-17``, :func:`keep_mask`) that draws its
    mask faster and keeps it in 1 byte per element for backward on the CPU.

    PyTorch's CPU dropout draws a float noise tensor with ``bernoulli_`` and keeps it (4 bytes per
    element); :func:`keep_mask` draws a quarter of the random bits and the boolean mask is a quarter of the
    size. Other devices use ``F.dropout`` (their fused kernel already keeps a boolean mask).
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or self.p >= 1.0 or x.device.type != "cpu":
            return F.dropout(x, self.p, self.training, self.inplace)
        return x * keep_mask(x.shape, self.p, x.device) * (1.0 / (1.0 - self.p))


class _ReLUDropoutFn(torch.autograd.Function):
    """``Dropout(ReLU(h))`` that keeps only its output for backward (see :class:`ReLUDropout`)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: Tensor, p: float) -> Tensor:
        keep = keep_mask(h.shape, p, h.device)  # Bernoulli(1 - p) keep mask, as nn.Dropout's
        ctx.scale = 1.0 / (1.0 - p)
        out = h.clamp_min(0.0).mul_(keep).mul_(ctx.scale)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        (out,) = ctx.saved_tensors
        # d out / d h = keep * scale * [h > 0], and out > 0 exactly where keep and h > 0.
        return torch.ops.aten.threshold_backward(grad, out, 0.0).mul_(ctx.scale), None


def relu_dropout(h: Tensor, p: float, training: bool) -> Tensor:
    """``Dropout(ReLU(h), p)`` with what autograd keeps cut from 9 to 4 bytes per element: ``nn.ReLU`` keeps
    its output, ``Dropout`` its mask and the next ``Linear`` the dropped output; here the dropped output
    alone is kept (and shared with the ``Linear``), since its sign gives the gradient mask of both. Same
    distribution and scaling as ``nn.Dropout``; evaluation or ``p = 0`` is a plain ReLU."""
    if not training or p == 0.0:
        return F.relu(h)
    if p >= 1.0:
        return h * 0.0
    return _ReLUDropoutFn.apply(h, p)


class ReLUDropout(nn.Module):
    """``nn.Sequential(nn.ReLU(), nn.Dropout(p))`` as one module (:func:`relu_dropout`)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, h: Tensor) -> Tensor:
        return relu_dropout(h, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ---------------------------------------------------------------------------------------------- masks
class MaskCache:
    """Additive causal masks ``[Q, K]`` by lengths, least recently used first out, within ``max_bytes``."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._masks: OrderedDict[tuple, Tensor] = OrderedDict()

    def get(self, *, qlen: int, mlen: int, mem_len: int, same_length: bool, device: torch.device,
            dtype: torch.dtype) -> Tensor:
        key = (qlen, mlen, mem_len if same_length else -1, same_length, device, dtype)
        mask = self._masks.get(key)
        if mask is not None:
            self._masks.move_to_end(key)
            return mask
        mask = additive_mask(causal_mask(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=same_length,
                                         device=device), dtype)
        size = mask.numel() * mask.element_size()
        if size <= self.max_bytes:
            while self.nbytes + size > self.max_bytes:
                _, old = self._masks.popitem(last=False)
                self.nbytes -= old.numel() * old.element_size()
            self._masks[key] = mask
            self.nbytes += size
        return mask

    def clear(self) -> None:
        self._masks.clear()
        self.nbytes = 0


_MASKS = MaskCache()


def mask_bias(*, qlen: int, mlen: int, mem_len: int, same_length: bool, device: torch.device,
              dtype: torch.dtype) -> Tensor:
    """``additive_mask(causal_mask(...))`` (``[Q, K]``, 0 / -inf) from a process-wide cache of at most
    64 MiB (callers must not modify it)."""
    return _MASKS.get(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=same_length, device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------- compilation
def cpu_caches(sysfs: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, int]:
    """The CPU's data or unified caches as sysfs lists them for ``sysfs`` (default: the first core): level -> bytes,
    the largest where a level lists several (instruction caches and unreadable entries left out; none: empty)."""
    sizes: dict[int, int] = {}
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            text = (index / "size").read_text().strip().upper()
            kind = (index / "type").read_text().strip() if (index / "type").exists() else "Unified"
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        value = int(text.rstrip("KMGB") or 0) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes[level] = max(sizes.get(level, 0), value)
    return sizes


@functools.cache
def l2_bytes_of_core() -> int:
    """The level-2 cache of the CPU's first core in bytes (:func:`cpu_caches`; 0 where sysfs does not say): what
    sizes the blocks of :func:`~transformer_xl.model.blocked.attend_blocked` with one thread."""
    return cpu_caches().get(2, 0)


def compile_unavailable(device: str = "cpu") -> str | None:
    """Why ``torch.compile`` cannot run here (one line), or None when it can: inductor generates C++ on the CPU,
    so it needs a C++ compiler; on CUDA it needs Triton."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if device.startswith("cuda"):
        try:
            import triton  # noqa: F401
        except ImportError:
            return "inductor needs triton on CUDA and it is not installed"
        return None
    if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        return "inductor needs a C++ compiler (c++, g++ or clang++) on the PATH and none was found"
    return None


def compiled(model: nn.Module) -> Callable[..., Any]:
    """``model`` compiled whole (``fullgraph=True``: a graph break is an error, not a silent fallback to Python
    between fragments) with static shapes: one graph per segment shape (the first segment, without memory, and the
    steady state with a full one), no dynamic-shape graph, whose symbolic sizes cost speed. The adaptive softmax and
    input gather the rows of each cluster (:func:`cluster_nll`), a count known only at run time: dynamo captures
    that ``nonzero`` with an unbacked size (``capture_dynamic_output_shape_ops``, set here for the process). Dropout
    draws its masks with ATen's generator (inductor's ``fallback_random``), in eager's order: the compiled forward
    draws the masks eager would (training compiled tracks eager to float rounding; a checkpoint's RNG state means the
    same in both), and on the CPU it was measured faster than inductor's own per-element generator."""
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    allow_graphs()
    return torch.compile(model, fullgraph=True, dynamic=False, options={"fallback_random": True})


#: Graphs dynamo may keep for one function before a ``fullgraph`` compile fails (its default is 8).
GRAPHS_PER_FUNCTION = 64


def allow_graphs() -> None:
    """The settings every compile of this package runs under, for the process: dynamo keeps
    :data:`GRAPHS_PER_FUNCTION` graphs per function (every model of a process compiles the same ``forward``, or
    decode ``step``, one graph per shape, precision and constants, so a process that compiles several, the bench's
    cases or a decoder per shape, needs more than dynamo's default), and :func:`key_kernels_by_isa`."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, GRAPHS_PER_FUNCTION)
    key_kernels_by_isa()


def key_kernels_by_isa() -> None:
    """Set inductor's CPU vector width (``cpp.simdlen``) to that of the instruction set this process picks (the
    CPU's best, or the one ``ATEN_CPU_CAPABILITY`` names), unless the user set it: the width is then part of the key
    of inductor's on-disk graph cache. torch 2.13 keys a cached graph by the compile settings but not by the
    instruction set picked from the environment, so a graph generated for AVX-512 (16 float lanes) was taken from
    the cache by a process restricted to AVX2 (8 lanes), or the reverse, and run: NaN log-probabilities, or glibc
    aborting on a corrupted heap (an AMX Xeon switching between ``ATEN_CPU_CAPABILITY=avx2`` and its default); and
    a graph generated for AVX2 failed to compile without vector instructions (``ATEN_CPU_CAPABILITY=default``)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if inductor_config.cpp.simdlen is None:
        inductor_config.cpp.simdlen = pick_vec_isa().bit_width()  # 0: no vector instructions (scalar C++)


# ---------------------------------------------------------------------------------------------- adaptive clusters
def _cluster_rows(ids: Tensor, lo: int, hi: int) -> Tensor | None:
    """Positions of ``ids [N]`` in ``[lo, hi)``, or None for none. Compiled, always the positions (a size known only
    at run time: an unbacked size, :func:`compiled`), since a branch on the count would break the graph."""
    idx = ((ids >= lo) & (ids < hi)).nonzero().squeeze(1)
    return idx if torch.compiler.is_compiling() or idx.numel() else None


def cluster_nll(head_logprob: Tensor, target: Tensor, hidden: Tensor, bounds: list[tuple[int, int]],
                tail_logprob: Callable[[Tensor, int], Tensor]) -> Tensor:
    """The adaptive softmax's ``-log p(target | hidden)`` ``[N]`` in input order: ``-head_logprob[n, w]`` for a
    shortlist word, ``-(head_logprob[n, -i] + tail_logprob(hidden[n], i)[w - lo_i])`` for a word of tail cluster
    ``i`` (``bounds[i] = (lo_i, hi_i)``), each tail computed only for the rows whose target falls in it."""
    nll = torch.empty(target.shape, dtype=head_logprob.dtype, device=hidden.device)
    for i, (lo, hi) in enumerate(bounds):
        idx = _cluster_rows(target, lo, hi)
        if idx is None:
            continue
        tgt_i = target[idx, None] - lo  # [N_i, 1]
        if i == 0:
            logprob = head_logprob[idx].gather(1, tgt_i).squeeze(1)
        else:
            logprob = head_logprob[idx, -i] + tail_logprob(hidden[idx], i).gather(1, tgt_i).squeeze(1)
        nll.index_copy_(0, idx, -logprob)
    return nll


def cluster_embed(ids: Tensor, bounds: list[tuple[int, int]], embed: Callable[[Tensor, int], Tensor],
                  out: Tensor) -> Tensor:
    """``out [N, D]`` with row ``n`` set to ``embed(ids[n] - lo_i, i)`` for the cluster ``i`` of ``ids[n]`` (the
    adaptive input: each cluster's lookup and projection only for its own tokens; cast to ``out``'s dtype)."""
    for i, (lo, hi) in enumerate(bounds):
        idx = _cluster_rows(ids, lo, hi)
        if idx is not None:
            out.index_copy_(0, idx, embed(ids[idx] - lo, i).to(out.dtype))
    return out
