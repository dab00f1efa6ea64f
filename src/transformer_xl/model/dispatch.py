"""Which implementation runs: the one place that chooses between the paper's formulas and their fast paths.

The model's files (:mod:`~transformer_xl.model.attention`, :mod:`~transformer_xl.model.positional`,
:mod:`~transformer_xl.model.segment`, :mod:`~transformer_xl.model.lm`) state the computation of paper Sec. 3 once
and call the functions below by what they compute; :func:`choose` picks the attention's implementation (its
docstring is the decision table), the other functions here apply one rule each. The implementations live in
:mod:`~transformer_xl.model.fastpath`, :mod:`~transformer_xl.model.shifted`, :mod:`~transformer_xl.model.blocked`
and :mod:`~transformer_xl.model.flex`, each tested equal to the formula it replaces (``tests/model/test_fastpath.py``,
``tests/model/test_blocked.py``, ``tests/model/test_flex.py``, ``tests/model/test_dispatch.py``). :func:`attend`
also runs a path named by its caller (``path=``), to check that path against :data:`PLAIN` where it runs.

=========================  =====================================================  ===================================
computation                implementations                                        chosen by
=========================  =====================================================  ===================================
masked softmax attention   :data:`PLAIN`, :data:`SHIFTED`, :data:`EXPLICIT`,      :func:`choose` (:func:`attend`;
with the position term     :data:`ONE_QUERY`, :data:`BLOCKED`, :data:`FUSED`,     :data:`FLEX` only when switched
                           :data:`FLEX`                                           on: ``flex``, set by
                                                                                  ``TransformerXLLM.flex_attention``)
``q = h W_q`` and          a slice of ``[W_q; W_k; W_v]``, float or int8 (the     :func:`project_rows`: the layer's
``[k; v] = h~ [W_k; W_v]`` int8 layer's rows and their scales)                    type (``TransformerXLLM.quantize``)
feed-forward ``CoreNet``   its modules one by one (dropout fused with the ReLU,   :func:`feed_forward`: training or
                           :class:`~.fastpath.ReLUDropout`), or in evaluation     not
                           two linear layers and a ReLU (fewer module calls)
causal mask ``[Q, K]``     made, or taken from a cache bounded in bytes           :func:`mask_bias`: compiling or not
attention scores kept      kept, or recomputed in backward                        :func:`recompute`:
for backward                                                                      ``TransformerXLLM.recompute`` and
                                                                                  a recorded gradient
dropout                    ``F.dropout``, or a 1-byte mask on the CPU             :class:`~.fastpath.CompactDropout`:
                                                                                  the device
a linear layer at a few    ``F.linear`` (BLAS), or txl's matrix-vector kernel     :func:`linear`: the rows, no
rows (a generation step)   (:mod:`~transformer_xl.model.native`)                  gradient, :func:`decode_products`
the captured decode step's BLAS (CUDA), inductor's compiled reductions, or        :func:`decode_products`: the device,
matrix products            txl's kernels, float32 and int8                        the CPU's vendor and vector width
=========================  =====================================================  ===================================

Shapes: ``B`` batch, ``H`` heads, ``Q`` query length, ``K`` key length, ``E`` d_head.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_xl.model import blocked, fastpath, native
from transformer_xl.model.blocked import ShiftedScores
from transformer_xl.model.fastpath import attend_explicit, attend_fused, attend_one_query, recomputed
from transformer_xl.model.flex import attend_flex, supports_head_dim
from transformer_xl.model.int8 import is_quantized
from transformer_xl.model.memory import additive_mask, causal_mask
from transformer_xl.model.positional import PositionScores
from transformer_xl.model.shifted import attend_shifted


class Path(str, Enum):
    """The implementations of ``Dropout(softmax(scale (q k^T + P) + mask)) v``."""

    PLAIN = "plain"  # the formula as written: P whole by rel_shift, [B, H, Q, K] scores, softmax
    EXPLICIT = "explicit"  # P whole (shift as a view), one baddbmm, autograd keeps only the probabilities
    ONE_QUERY = "one-query"  # P unshifted (one query: the shift is the identity), two batched products over B*H
    SHIFTED = "shifted"  # with a gradient: P's factors, mask and scale in two baddbmm, the shift's own backward
    BLOCKED = "blocked"  # P made a few MB at a time beside the mask, each block into scaled_dot_product_attention
    FUSED = "fused"  # P whole, scaled_dot_product_attention with the bias scale P + mask (its gradient on CUDA)
    FLEX = "flex"  # P unshifted, read at the shifted index by FlexAttention's score_mod; the mask a block mask


PLAIN, EXPLICIT, ONE_QUERY, BLOCKED, FUSED = Path.PLAIN, Path.EXPLICIT, Path.ONE_QUERY, Path.BLOCKED, Path.FUSED
SHIFTED, FLEX = Path.SHIFTED, Path.FLEX


class Choice(NamedTuple):
    """What :func:`choose` decided: the path, and for :data:`BLOCKED` the bytes of ``P`` formed at once."""

    path: Path
    block_bytes: int = 0


def choose(*, grad: bool, qlen: int, device: torch.device, compiling: bool, dropatt: float, factored: bool,
           threads: int = 1, plain: bool = False, flex: bool = False) -> Choice:
    """The attention's implementation, from the facts of one call (first matching row wins):

    ====  ==================================================  ==============  =====================================
    row   when                                                path            why
    ====  ==================================================  ==============  =====================================
    1     ``plain`` (``TransformerXLLM.reference()``)         ``PLAIN``       the paper's formulas, for checking
    2     a gradient is recorded, ``P`` as its factors        ``SHIFTED``     mask, scale and shift folded into
          (relative encodings) and one mask for all rows,     (dropatt in)    the products: three passes over
          CPU, not compiling                                                  ``[Q, K]`` fewer each way
    3     a gradient is recorded, CUDA, ``flex``              ``FLEX``        one generated kernel: neither the
          (``TransformerXLLM.flex_attention()``) and          (no dropout)    shifted ``P``, ``q k^T`` nor the
          ``dropatt == 0``, compiled or not                                   probabilities formed
    4     a gradient is recorded, CUDA, compiled or not       ``FUSED``       the memory-efficient kernel returns
                                                              (dropatt in)    the bias's gradient: the ``[Q, K]``
                                                                              probabilities are not kept
    5     a gradient is recorded (training, or a forward      ``EXPLICIT``    autograd keeps only the ``[Q, K]``
          with grad enabled on trainable weights) elsewhere:  (dropatt in)    probabilities; the fused CPU kernel
          CPU compiled or with ``P`` whole or a mask per row                  falls back to its math for a bias
                                                                              that needs a gradient
    6     no gradient, attention dropout on (``dropatt > 0``  ``FUSED``       the fused kernel draws the dropout
          outside training mode)
    7     no gradient, one query (``qlen == 1``: a            ``ONE_QUERY``   bound by reading keys/values once;
          generation step), any device, compiled or not                       the fused kernel tiles for many
    8     no gradient, ``qlen > 1``, ``P`` as its factors     ``BLOCKED``     ``P`` whole is tens of MB at long
          (relative encodings) and one mask for all rows,                     memories: fresh pages, a DRAM trip
          CPU, not compiling
    9     anything else (GPU, compiling, absolute             ``FUSED``       one fused kernel; a GPU's wants
          encodings without ``P``)                                            ``P`` whole, inductor fuses its own
    ====  ==================================================  ==============  =====================================

    Row 2 is the CPU's (``tests/model/test_shifted.py`` tests it equal to the formula; compiled CPU training keeps
    row 5). Rows 3 and 4 are CUDA's training: row 4's gradients are those of the same kernel call on the CPU (its
    math fallback; ``tests/model/test_fastpath.py`` tests them equal to the formula's); row 3 is taken only when
    switched on (and :func:`attend` leaves it off for heads FlexAttention does not take,
    :func:`~transformer_xl.model.flex.supports_head_dim`), since FlexAttention's backward does not run on a CPU
    (its forward is tested there, ``tests/model/test_flex.py``; its gradients by the tests marked ``gpu``). Under
    ``torch.compile`` both trace into the graph (FlexAttention is meant to be compiled: outside a compiled model it
    runs compiled on its own).
    ``threads`` (torch's intra-op threads) sets the block size of row 8: one core's L2 with one thread
    (:func:`~transformer_xl.model.blocked.one_thread_block_bytes`), larger with several, whose every block ends in a
    barrier (:data:`~transformer_xl.model.blocked.BLOCK_BYTES_THREADS`). The memory length and the dtype do not
    change the path: with ``Q`` and the heads they set how many batch rows a block holds
    (:func:`~transformer_xl.model.blocked.attend_blocked`), and the dtype is that of the kernels' inputs (bf16 under
    autocast as well). Every path computes the same values (``tests/model/test_dispatch.py``).
    """
    if plain:
        return Choice(PLAIN)
    if grad:
        if factored and device.type == "cpu" and not compiling:
            return Choice(SHIFTED)
        if device.type == "cuda":
            return Choice(FLEX if flex and dropatt == 0.0 else FUSED)
        return Choice(EXPLICIT)
    if dropatt > 0.0:
        return Choice(FUSED)
    if qlen == 1:
        return Choice(ONE_QUERY)
    if factored and device.type == "cpu" and not compiling:
        one = threads == 1
        return Choice(BLOCKED, blocked.one_thread_block_bytes() if one else blocked.BLOCK_BYTES_THREADS)
    return Choice(FUSED)


Scores = Tensor | PositionScores | ShiftedScores | None


def attend(q: Tensor, k: Tensor, v: Tensor, p: Scores, mask_bias: Tensor, *, scale: float, dropatt: float,
           plain: bool = False, flex: bool = False, path: Path | str | None = None) -> Tensor:
    """``Dropout(softmax(scale * (q k^T + P) + mask_bias)) v``, ``[B, H, Q, E]``, from ``q [B, H, Q, E]`` (with the
    content bias added), ``k, v [B, H, K, E]``, the position term ``P`` whole ``[B, H, Q, K]``, as its factors, or
    None, and ``mask_bias [Q, K]`` (0 / -inf; or ``[B, 1, Q, K]``, a mask per row, which the blocked and shifted
    paths do not take: ``P`` is then formed whole), by the implementation :func:`choose` picks (``flex``: row 3 may
    be taken), or by the one ``path`` names (a :class:`Path` or its value, e.g. ``"flex"``): for checking a path
    against :data:`PLAIN` on a device where :func:`choose` would not take it (ValueError where it cannot run)."""
    factors = [t for t in p if isinstance(t, Tensor)] if isinstance(p, tuple) else [p]
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, *factors))
    if path is not None:
        choice = _named(Path(path), grad=grad, qlen=q.size(2), p=p, mask_bias=mask_bias, dropatt=dropatt)
    else:
        compiling = torch.compiler.is_compiling()
        threads = 0 if compiling else torch.get_num_threads()  # dynamo cannot trace it; row 8 excludes compiling
        # P as factors: with a gradient those of PositionScores (the shifted path's), without either kind (blocked's)
        factored = isinstance(p, PositionScores if grad else tuple) and mask_bias.dim() == 2
        choice = choose(grad=grad, qlen=q.size(2), device=q.device, compiling=compiling, dropatt=dropatt,
                        factored=factored, threads=threads, plain=plain,
                        flex=flex and supports_head_dim(q.size(-1)))
    if choice.path is PLAIN:
        scores = q @ k.transpose(-1, -2)  # [B, H, Q, K]: terms (a) + (c)
        if p is not None:
            scores = scores + (p if isinstance(p, Tensor) else p.dense())  # + terms (b) + (d)
        prob = F.dropout(torch.softmax(scores * scale + mask_bias, -1), dropatt, training=dropatt > 0)
        return prob @ v
    if choice.path is SHIFTED:
        assert isinstance(p, PositionScores)
        return attend_shifted(q, k, v, p.x, p.y, p.d, mask_bias, scale=scale, dropatt=dropatt)
    if choice.path is BLOCKED:
        shifted = p if isinstance(p, ShiftedScores) else ShiftedScores.of(*p)
        return blocked.attend_blocked(q, k, v, shifted, mask_bias, scale=scale, block_bytes=choice.block_bytes)
    if choice.path is FLEX:  # P unshifted from its factors, or whole as given
        return attend_flex(q, k, v, p.dense() if isinstance(p, ShiftedScores) else p, mask_bias, scale=scale)
    p = _whole(p)
    if choice.path is EXPLICIT:
        return attend_explicit(q, k, v, p, mask_bias, scale=scale, dropatt=dropatt)
    if choice.path is ONE_QUERY:
        return attend_one_query(q, k, v, p, mask_bias, scale=scale)
    return attend_fused(q, k, v, p, mask_bias, scale=scale, dropatt=dropatt)


def _named(path: Path, *, grad: bool, qlen: int, p: Scores, mask_bias: Tensor, dropatt: float) -> Choice:
    """The choice of :func:`attend`'s ``path=``, or a ValueError naming what that path does not take."""
    if dropatt > 0.0 and path in (ONE_QUERY, BLOCKED, FLEX):
        raise ValueError(f"the {path.value} attention path has no dropout (dropatt {dropatt})")
    if path is SHIFTED and not (isinstance(p, PositionScores) and mask_bias.dim() == 2):
        raise ValueError("the shifted attention path takes P as PositionScores and one [Q, K] mask")
    if path is BLOCKED and (grad or p is None or isinstance(p, Tensor) or mask_bias.dim() != 2):
        raise ValueError("the blocked attention path takes no gradient, P as its factors and one [Q, K] mask")
    if path is ONE_QUERY and qlen != 1:
        raise ValueError(f"the one-query attention path takes one query, not {qlen}")
    return Choice(path, blocked.BLOCK_BYTES_THREADS if path is BLOCKED else 0)


def _whole(p: Scores) -> Tensor | None:
    """``P [B, H, Q, K]`` from its factors: for one query without a bias per distance the product alone (row ``j``
    of the position keys is key ``j``'s distance ``K-1-j``: the shift is the identity), else with the shift as a
    view (:meth:`ShiftedScores.dense`)."""
    if isinstance(p, PositionScores) and p.d is None and p.x.size(2) == 1:
        bsz, n_head, _, d_head = p.x.shape
        x = p.x.transpose(0, 1).reshape(n_head, bsz, d_head)  # [H, B, E]
        return torch.bmm(x, p.y.permute(1, 2, 0)).view(n_head, bsz, 1, -1).transpose(0, 1)  # [B, H, 1, K]
    if isinstance(p, PositionScores):
        return ShiftedScores.of(*p).dense()
    return p.dense() if isinstance(p, ShiftedScores) else p


def project_rows(layer: nn.Module, x: Tensor, rows: slice) -> Tensor:
    """Rows ``rows`` of ``linear(x)`` (no bias), multiplying by those rows of the weight only: of a float layer, or
    of an int8 layer (:class:`~transformer_xl.model.int8.Int8Linear`, with their scales; equal to its whole output
    sliced, ``tests/model/test_dispatch.py``)."""
    if is_quantized(layer):
        return layer.rows(x, rows)
    return linear(x, layer.weight[rows])


def feed_forward(core: nn.Sequential, x: Tensor, training: bool) -> Tensor:
    """``CoreNet(x)`` (``Linear -> ReLU -> Dropout -> Linear -> Dropout``); in evaluation its two linear layers and a
    ReLU only (the dropouts are no-ops there, and a generation step at batch 1 pays for every module call)."""
    if training:
        return core(x)
    return apply_linear(core[3], F.relu(apply_linear(core[0], x)))


def recompute(enabled: bool, fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """``fn(*args)``; when ``enabled`` (``TransformerXLLM.recompute``) and a gradient is recorded, its
    intermediates are recomputed in backward instead of kept (:func:`~transformer_xl.model.fastpath.recomputed`)."""
    if enabled and torch.is_grad_enabled():
        return recomputed(fn, *args)
    return fn(*args)


def mask_bias(*, qlen: int, mlen: int, mem_len: int, same_length: bool, device: torch.device,
              dtype: torch.dtype) -> Tensor:
    """The additive causal mask ``additive_mask(causal_mask(...))``, ``[Q, K]`` (0 / -inf; not to be modified):
    from the cache of :func:`~transformer_xl.model.fastpath.mask_bias`, or, compiling, made in the graph (a lookup in
    the cache would be traced with a guard on its contents, which the first call's own insertion fails: a second
    compilation of every segment shape)."""
    if torch.compiler.is_compiling():
        return additive_mask(causal_mask(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=same_length,
                                         device=device), dtype)
    return fastpath.mask_bias(qlen=qlen, mlen=mlen, mem_len=mem_len, same_length=same_length, device=device,
                              dtype=dtype)


# ---------------------------------------------------------------------------------------------- matrix products
def decode_products(device: torch.device | str = "cpu") -> str:
    """How a decode step multiplies by its weights (first matching row wins):

    ====  ==========================================  ============  ===========================================
    row   when                                        form          why
    ====  ==========================================  ============  ===========================================
    1     not the CPU                                 ``blas``      cuBLAS's kernels stream a GPU's memory
    2     ``TXL_DECODE_PRODUCTS`` is ``native`` or    that form     to measure both forms on one machine
          ``compiled`` (``native`` where it runs)                   (``txl bench decode``) and send the result
    3     txl's kernels do not build here             ``compiled``  (:func:`~.native.unavailable` says why)
    4     an AMD CPU, or a CPU whose vector width     ``native``    MKL's float matrix-vector kernel runs on one
          PyTorch uses is AVX2 (any vendor)                         core on AMD; inductor's reductions reached
                                                                    half the read rate on a Zen 3 and int8
                                                                    widened to float is bound by arithmetic on
                                                                    AVX2; txl's kernels stream every core and
                                                                    multiply int8 in integers (``vpmaddubsw``)
    5     anything else (an Intel CPU with AVX-512)   ``compiled``  inductor's AVX-512 reductions (float, and
                                                                    int8 read in lanes by masked loads);
                                                                    txl's kernels use AVX2 instructions only
    ====  ==========================================  ============  ===========================================

    ``native``: :mod:`~transformer_xl.model.native` (float32 tiles, int8 tiles with the activation quantized per
    row); ``compiled``: row blocks reduced by inductor's C++ (:func:`transformer_xl.inference.decode.blocked_linear`).
    Both compute ``x W^T`` over the same weights (the int8 forms differ by the activation's rounding,
    ``tests/inference/test_captured.py``). The figures: ``docs/generation-speed.md``."""
    return native.products(device)


#: ``F.linear``, or at a few rows txl's kernel (the table's row "a linear layer at a few rows").
linear = native.linear


def apply_linear(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` for an ``nn.Linear``, through :func:`linear`; an int8 layer as it is."""
    if is_quantized(layer):
        return layer(x)
    return linear(x, layer.weight, layer.bias)
