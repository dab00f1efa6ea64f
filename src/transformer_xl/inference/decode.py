"""The one-token decode step as one static-shape function over packed weights and a ring of keys/values.

What :class:`transformer_xl.inference.captured.CapturedDecoder` compiles (``torch.compile``; on CUDA with CUDA
graphs). The math is that of a ``[B, 1]`` segment through :class:`~transformer_xl.model.TransformerXLLM`
(paper Sec. 3.2-3.3, attn_type 0) with the relative-position encoding; only the data layout differs, so that
one graph serves every step:

Every product is a multiply and a sum that inductor compiles into a loop streaming its operand once, laid out so
that the loop's vector lanes are 16 independent outputs (no horizontal sum per output, no masked tail, aligned
loads): measured against the machine's read rate in ``benchmarks/decode_kernels.py`` (``docs/generation-speed.md``).

* **keys/values in a ring.** Layer ``l`` keeps keys in slot blocks ``[B, H, C / 16, E, 16]`` (16 consecutive
  slots in the lanes of a vector: :func:`block_slots`) and values by dimension ``[B, H, E, C]``, with ``C`` =
  :func:`ring_slots` ``(mem_len)``: the ``mem_len + 1`` slots a step attends to (the memory and the new token)
  rounded up to a multiple of 16, the rest always empty. Position ``t`` lives in slot ``t mod (mem_len + 1)``; the
  step writes its keys/values there (overwriting the position that just left the memory) with a tensor index, and
  reads all ``C`` slots with an additive mask for the empty ones (and, under ``same_length``, the farthest one).
  ``slot_pos [C]`` holds the position in every slot (-1: empty), ``cur`` the position of the new token: tensors,
  not Python ints, so no step recompiles.
* **terms (b)+(d) from a table of position keys.** The distances a step needs are ``0 .. mem_len`` at every step,
  so ``W_kR R_d`` is a constant: :func:`position_keys` computes it once per decoder, in slot blocks ``[H, C / 16,
  E, 16]`` per layer in the ring's type (row ``d`` = distance ``min(d, clamp_len)``). A step dots ``q + v`` with
  every row, in distance order (``E`` multiply-adds per head and distance), and takes each slot's score by the
  slot's distance (a gather of ``[B, H, C]`` scores).
* **attention as reductions.** ``q . k`` (over ``E``) and ``p . v`` (over ``C``) are multiplies and sums that
  the compiler turns into one pass over the ring, widening a narrower ring (bf16) as it reads it; the softmax is
  normalized after the values' sum (one division per output, not per slot).
* **packed weights** (:func:`~transformer_xl.inference.packing.pack`): every matrix in row blocks
  ``[ceil(out / 16), in, 16]`` (:func:`~transformer_xl.inference.packing.block_rows`, :func:`blocked_linear`),
  float32 or, with ``int8=True``, int8 with one bf16 scale per output row (the plain model's scheme,
  :func:`~transformer_xl.model.int8.quantize_rows`; the step widens the int8 numbers as it reads them, or takes them
  out of 32-bit words on AVX2: :func:`~transformer_xl.inference.packing.int8_words`); the adaptive softmax's
  clusters without projections (the WT103 shape) are one matrix ``[head words; cluster rows; tail words]``, read once
  per step. Off the CPU the float matrices stay ``[out, in]`` (BLAS).
* **inputs held in memory** (:func:`stored`): the compiler would otherwise recompute an elementwise input of a
  product (a ReLU, ``q + u``) in the product's loop for every block it reads.

Shapes: ``B`` batch, ``H`` heads, ``E`` d_head, ``D`` d_model, ``C`` ring slots, ``L`` layers, ``V`` words.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_xl.errors import ConfigError
from transformer_xl.inference.packing import INT8_UNROLL, ROW_BLOCK, Linear, unpack
from transformer_xl.model import TransformerXLLM, native

#: Rows of ``x`` up to which :func:`blocked_linear` is one multiply-and-sum per row (beyond: one matrix product).
SUM_ROWS = 16
@dataclass(frozen=True)
class StepSpec:
    """The constants of a step (hashable: the compiled graph is specialized on them)."""

    n_layer: int
    n_head: int
    d_head: int
    pre_lnorm: bool
    eps: float
    scale: float  # 1 / sqrt(d_head)
    emb_scale: float  # sqrt(d_model)
    emb_bounds: tuple[tuple[int, int], ...]  # the input clusters (one: div_val 1)
    head_sizes: tuple[int, ...]  # sizes of the output pieces of one fused softmax matrix (empty: per cluster)
    shortlist: int  # words of the head cluster
    n_clusters: int  # tail clusters
    same_length: bool
    mem_len: int
    native_attention: bool = False  # the attention over the ring by txl's kernel (transformer_xl.model.native)


def supported(model: TransformerXLLM) -> str | None:
    """Why the captured step cannot run ``model`` (None: it can)."""
    cfg = model.config
    if cfg.attn_type != 0:
        return f"attn_type {cfg.attn_type} (the captured step implements the paper's relative encoding, type 0)"
    if cfg.sample_softmax > 0:
        return "a sampled-softmax model (sample_softmax > 0)"
    if model.quantized is not None:
        return "a quantized model (build the captured decoder from the float model with int8=True)"
    return None


def spec_of(model: TransformerXLLM, heads: tuple, *, mem_len: int, same_length: bool,
            native_attention: bool = False) -> StepSpec:
    """The constants of ``model``'s step with the packed softmax ``heads`` (fused: one matrix, else per cluster);
    ``native_attention``: the attention over the ring by txl's kernel."""
    cfg = model.config
    crit = model.crit
    emb_bounds = tuple(model.word_emb.bounds) if cfg.div_val > 1 else ((0, cfg.n_token),)  # one table: div_val 1
    fused = len(heads) == 1 and crit.n_clusters > 0
    sizes = tuple(hi - lo + (crit.n_clusters if i == 0 else 0) for i, (lo, hi) in enumerate(crit.bounds))
    return StepSpec(n_layer=cfg.n_layer, n_head=cfg.n_head, d_head=cfg.d_head, pre_lnorm=cfg.pre_lnorm,
                    eps=model.layers[0].pos_ff.layer_norm.eps, scale=model.layers[0].dec_attn.scale,
                    emb_scale=model.word_emb.emb_scale, emb_bounds=emb_bounds,
                    head_sizes=sizes if fused else (), shortlist=crit.shortlist, n_clusters=crit.n_clusters,
                    same_length=same_length, mem_len=mem_len, native_attention=native_attention)


def check_supported(model: TransformerXLLM) -> None:
    """A one-line :class:`ConfigError` unless the captured step can run ``model``."""
    why = supported(model)
    if why is not None:
        raise ConfigError(f"the captured decode step does not support {why}; use the plain step")


# ---------------------------------------------------------------------------------------------- the math
def stored(x: Tensor) -> Tensor:
    """``x`` itself (a view of it), which the compiler must hold in memory: the input of a product over a blocked
    matrix is read once per block of output rows, and when it is an elementwise result (a ReLU, a dequantized
    product, ``q + u``) the compiler would otherwise compute it again inside the product's loop for every block."""
    return x.as_strided(x.shape, x.stride())


def linear(x: Tensor, lin: Linear) -> Tensor:
    """``x W^T + b`` for ``x [N, in]`` (:class:`~transformer_xl.inference.packing.Linear`): tiles by txl's kernels
    (:mod:`~transformer_xl.model.native`; called from the compiled graph), row blocks (float or int8) by
    :func:`blocked_linear`, a float ``[out, in]`` matrix (off the CPU) by BLAS. More than :data:`SUM_ROWS` rows
    run eagerly (a memory's projection): one matrix product over the matrix unpacked (int8: its numbers times their
    scales, the activation not quantized)."""
    if lin.form == "blas":
        return F.linear(x, lin.weight, lin.bias)
    if x.size(0) > SUM_ROWS and not torch.compiler.is_compiling():
        return F.linear(x, unpack(lin).to(x.dtype), lin.bias)
    if lin.form == "tiles":
        if lin.scale is None:
            return native.gemv(x, lin.weight, lin.shape[0], lin.bias)
        return native.gemv_q8(x, lin.weight, lin.scale, lin.shape[0], lin.bias)
    return blocked_linear(stored(x), lin)


def blocked_linear(x: Tensor, lin: Linear) -> Tensor:
    """``x W^T + b`` over row blocks (:func:`~transformer_xl.inference.packing.block_rows`), float32 or int8 with
    row scales: one multiply and sum per row of ``x``, which the compiler turns into one pass over the blocks with 16
    output rows in the lanes of a vector, at about the machine's read rate (BLAS's matrix-vector kernel reads these
    small matrices at about half of it, the int8 kernel ``aten._weight_int8pack_mm`` slower than this:
    ``docs/generation-speed.md``).

    int8, each output row then multiplied by its scale: in lanes (:func:`~transformer_xl.inference.packing.block_rows`),
    the int8 numbers widened to ``x``'s type as they are read,
    :data:`~transformer_xl.inference.packing.INT8_UNROLL` inputs per loop step; in words
    (:func:`~transformer_xl.inference.packing.block_words`, on AVX2:
    :func:`~transformer_xl.inference.packing.int8_words`), the words of 16 rows read as 32-bit integers (whole
    vectors on every instruction set), each weight taken out of its word by two shifts that keep its sign
    (``(w << 24 - 8 j) >> 24``) and widened.

    The sums of several rows (a batch) fuse into one loop that reads each block once, one accumulator per row; a
    compiled step with more than :data:`SUM_ROWS` rows makes one such pass per :data:`SUM_ROWS` rows (eagerly,
    :func:`linear` takes more rows to one matrix product before they reach this)."""
    n, out = x.size(0), lin.shape[0]
    if lin.scale is None:
        weight = lin.weight.to(x.dtype)
        y = torch.cat([torch.stack([(weight * row[None, :, None]).sum(1) for row in x[i:i + SUM_ROWS]])
                       for i in range(0, n, SUM_ROWS)])  # [N, K, 16]
    elif lin.weight.dim() == 3:  # int8 in lanes, INT8_UNROLL inputs per loop step: 64 bytes, one accumulation
        k, width = lin.weight.shape[:2]
        weight = lin.weight.view(k, width // INT8_UNROLL, INT8_UNROLL, ROW_BLOCK).to(x.dtype)
        x = stored(F.pad(x, (0, width - x.size(1)))).view(n, -1, INT8_UNROLL)
        y = torch.cat([torch.stack([(weight * row[None, :, :, None]).sum(2).sum(1) for row in x[i:i + SUM_ROWS]])
                       for i in range(0, n, SUM_ROWS)])  # [N, K, 16]
    else:  # int8 in words: one 32-bit word per row and 4 inputs, its weights taken out by shifts, widened, summed
        words = lin.weight.view(torch.int32).squeeze(-1)  # [K, in / 4, 16]
        parts = [((words << (24 - 8 * j)) >> 24).to(x.dtype) for j in range(INT8_UNROLL - 1)]
        parts.append((words >> 24).to(x.dtype))  # the weights of inputs 4 g + j, j = 0 .. 3
        x = stored(F.pad(x, (0, INT8_UNROLL * words.size(1) - x.size(1)))).view(n, -1, INT8_UNROLL)  # [N, in / 4, 4]

        def dot(row: Tensor) -> Tensor:  # [K, 16]
            terms = [part * row[None, :, j, None] for j, part in enumerate(parts)]
            return (terms[0] + terms[1] + terms[2] + terms[3]).sum(1)

        y = torch.cat([torch.stack([dot(row) for row in x[i:i + SUM_ROWS]]) for i in range(0, n, SUM_ROWS)])
    if lin.scale is not None:
        y = y * lin.scale.to(x.dtype)
    y = y.reshape(n, -1)[:, :out]
    return y if lin.bias is None else y + lin.bias


def embed(spec: StepSpec, embs: tuple, tok: Tensor) -> Tensor:
    """``sqrt(D) E[w] P``, ``[B, D]``; every input cluster computed with a clamped index and kept where it holds
    the word (static shapes)."""
    out = None
    for (lo, hi), (table, proj) in zip(spec.emb_bounds, embs):
        e = table[(tok - lo).clamp(0, hi - lo - 1)]  # [B, d_i]
        if proj is not None:
            e = linear(e, proj)  # [B, D]
        if len(spec.emb_bounds) > 1:
            e = torch.where(((tok >= lo) & (tok < hi))[:, None], e, 0.0)
        out = e if out is None else out + e
    assert out is not None
    return out * spec.emb_scale


def head_log_probs(spec: StepSpec, heads: tuple, h: Tensor) -> Tensor:
    """The adaptive softmax's full log-distribution ``[B, V]`` (as ``ProjectedAdaptiveLogSoftmax.log_prob``)."""
    return log_probs_of(spec, head_logits(spec, heads, h))


def head_logits(spec: StepSpec, heads: tuple, h: Tensor) -> list[Tensor]:
    """The logits of the softmax's head and of every tail cluster (the matrix products of :func:`head_log_probs`)."""
    if spec.head_sizes:
        return list(linear(h, heads[0][1]).split(spec.head_sizes, dim=-1))
    return [linear(h if proj is None else linear(h, proj), lin) for proj, lin in heads]


def log_probs_of(spec: StepSpec, logits: list[Tensor]) -> Tensor:
    """``[B, V]`` from :func:`head_logits`: the head's log-softmax, and each tail's added to its cluster's."""
    head = F.log_softmax(logits[0], dim=-1)  # [B, shortlist + n_clusters]
    if not spec.n_clusters:
        return head
    parts = [head[:, :spec.shortlist]]
    parts += [head[:, -i, None] + F.log_softmax(logits[i], dim=-1) for i in range(1, spec.n_clusters + 1)]
    return torch.cat(parts, dim=1)


def ring_slots(mem_len: int) -> int:
    """Slots a ring holds for a memory of ``mem_len``: the ``mem_len + 1`` a step attends to (the memory and the new
    token), rounded up to whole blocks of :data:`~transformer_xl.inference.packing.ROW_BLOCK` (the slots beyond stay
    empty: masked, never written)."""
    return -(-(mem_len + 1) // ROW_BLOCK) * ROW_BLOCK


def block_slots(t: Tensor) -> Tensor:
    """Keys ``[..., C, E]`` (``C`` a multiple of :data:`~transformer_xl.inference.packing.ROW_BLOCK`) as the ring
    keeps them, ``[..., C / 16, E, 16]``: 16 consecutive slots in the lanes of one vector (:func:`_dot_keys`)."""
    return t.unflatten(-2, (-1, ROW_BLOCK)).transpose(-1, -2).contiguous()


def _dot_keys(q: Tensor, k: Tensor) -> Tensor:
    """``q . k`` per slot: ``q [B, H, E]``, keys in slot blocks ``k [B, H, C / 16, E, 16]`` -> ``[B, H, C]``: a
    multiply and a sum over ``E`` that the compiler turns into one pass over the ring, 16 slots per vector (it widens
    a narrower ring as it reads it)."""
    return (q[:, :, None, :, None] * k).sum(3).flatten(2)


def position_keys(model: TransformerXLLM, r_dist: Tensor, dtype: torch.dtype) -> list[Tensor]:
    """``W_kR R_d`` for every distance row of ``r_dist [C, D]`` (sinusoids; ``C`` a multiple of
    :data:`~transformer_xl.inference.packing.ROW_BLOCK`), per layer in slot blocks ``[H, C / 16, E, 16]``
    (:func:`block_slots`) in ``dtype`` (module docstring)."""
    cfg = model.config
    with torch.no_grad():
        return [block_slots(F.linear(r_dist, layer.dec_attn.r_net.weight).view(-1, cfg.n_head, cfg.d_head)
                            .transpose(0, 1).to(dtype)) for layer in model.layers]


def _dot_positions(qv: Tensor, pos: Tensor) -> Tensor:
    """``qv . pos_d`` per distance: ``qv [B, H, E]``, ``pos [H, C / 16, E, 16]`` (shared by the batch) ->
    ``[B, H, C]`` (as :func:`_dot_keys`)."""
    return (qv[:, :, None, :, None] * pos).sum(3).flatten(2)


def _mix_values(prob: Tensor, v: Tensor) -> Tensor:
    """``sum_c prob_c v_c``: ``prob [B, H, C]``, values by dimension ``v [B, H, E, C]`` -> ``[B, H, E]``: one
    contiguous multiply-and-sum over the slots per dimension."""
    return (prob[:, :, None, :] * v).sum(-1)


def step(spec: StepSpec, weights: dict, tok: Tensor, ks: list[Tensor], vs: list[Tensor], slot_pos: Tensor,
         cur: Tensor, pos_keys: list[Tensor]) -> tuple[Tensor, Tensor]:
    """One token per row: ``tok [B]`` -> next-token log-probabilities ``[B, V]`` and the memory rows of this
    position ``[L + 1, B, D]`` (every layer's input and the output). Writes the keys/values into the rings
    ``ks`` (in slot blocks, ``[B, H, C / 16, E, 16]`` per layer) and ``vs`` (by dimension, ``[B, H, E, C]``),
    ``cur`` into ``slot_pos [C]`` and advances ``cur`` (in place); ``C`` = :func:`ring_slots` of ``mem_len``.
    ``pos_keys``: :func:`position_keys` of the model for ``C`` distances."""
    where = ring_position(spec, slot_pos, cur)
    bsz = tok.size(0)
    h = embed(spec, weights["emb"], tok)  # [B, D]
    hids = [h]
    for i, w in enumerate(weights["layers"]):
        x = F.layer_norm(h, h.shape[-1:], *w["ln1"], spec.eps) if spec.pre_lnorm else h
        q, k, v = linear(x, w["qkv"]).view(bsz, 3, spec.n_head, spec.d_head).unbind(1)  # [B, H, E] each
        a = attend_ring(spec, w, q, k, v, ks[i], vs[i], pos_keys[i], where)
        out = linear(a, w["o"])  # [B, D]
        h = h + out if spec.pre_lnorm else F.layer_norm(h + out, h.shape[-1:], *w["ln1"], spec.eps)
        x = F.layer_norm(h, h.shape[-1:], *w["ln2"], spec.eps) if spec.pre_lnorm else h
        core = linear(torch.relu(linear(x, w["ff1"])), w["ff2"])  # [B, D]
        h = h + core if spec.pre_lnorm else F.layer_norm(h + core, h.shape[-1:], *w["ln2"], spec.eps)
        hids.append(h)
    cur.add_(1)
    return head_log_probs(spec, weights["head"], h), torch.stack(hids)


def ring_position(spec: StepSpec, slot_pos: Tensor, cur: Tensor) -> tuple[Tensor, ...]:
    """Where the new token goes in the ring and what every slot holds for it (writes ``cur`` into ``slot_pos``):
    its slot ``[1]``, that slot's block and lane ``[1]`` each, the additive mask ``[C]`` (empty slots, and the
    farthest under ``same_length``) and every slot's row of distances ``[C]``."""
    n_slot = spec.mem_len + 1  # the slots in use (slot_pos may hold more: ring_slots)
    slot = torch.remainder(cur, n_slot).view(1)  # [1]
    blk, lane = torch.div(slot, ROW_BLOCK, rounding_mode="floor"), torch.remainder(slot, ROW_BLOCK)  # [1] each
    slot_pos.index_copy_(0, slot, cur.view(1))
    dist = cur - slot_pos  # [C] distance of every slot's position (garbage where empty)
    visible = slot_pos >= 0
    if spec.same_length:  # every query sees mem_len keys, itself included
        visible = visible & (dist < spec.mem_len)
    bias = torch.where(visible, 0.0, float("-inf"))  # [C]
    return slot, blk, lane, bias, dist.clamp(0, n_slot - 1)


def attend_ring(spec: StepSpec, w: dict, q: Tensor, k: Tensor, v: Tensor, ks: Tensor, vs: Tensor, pos_keys: Tensor,
                where: tuple[Tensor, ...]) -> Tensor:
    """One layer's attention of the new token over its ring: writes ``k, v [B, H, E]`` into the ring at
    :func:`ring_position` ``where``, scores every slot (terms (a)+(c) by the keys, (b)+(d) by the position keys at
    the slot's distance), the softmax normalized after the values' sum; ``[B, H * E]``."""
    slot, blk, lane, bias, by_slot = where
    ks[:, :, blk, :, lane] = k[None].to(ks.dtype)  # [1, B, H, E]: slot blk * 16 + lane
    vs.index_copy_(3, slot, v[..., None].to(vs.dtype))
    if spec.native_attention:
        a = native.ring_attend(q + w["u"], q + w["v"], ks, pos_keys, vs, by_slot, bias, spec.scale)
        return a.to(q.dtype).reshape(q.size(0), -1)
    ac = _dot_keys(stored(q + w["u"]), ks)  # terms (a)+(c): [B, H, C]
    bd = _dot_positions(stored(q + w["v"]), pos_keys)[:, :, by_slot]  # terms (b)+(d): [B, H, C]
    score = (ac + bd) * spec.scale + bias  # [B, H, C]
    e = torch.exp(score - score.amax(-1, keepdim=True))  # the softmax, normalized after the values' sum
    a = _mix_values(e, vs) / e.sum(-1, keepdim=True)  # [B, H, E]
    return a.reshape(q.size(0), -1)
