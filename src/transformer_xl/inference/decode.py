"""The one-token decode step as one static-shape function over packed weights and a ring of keys/values.

What :class:`transformer_xl.inference.captured.CapturedDecoder` compiles (``torch.compile``; on CUDA with CUDA
graphs). The math is that of a ``[B, 1]`` segment through :class:`~transformer_xl.model.TransformerXLLM`
(paper Sec. 3.2-3.3, attn_type 0) with the relative-position encoding; only the data layout differs, so that
one graph serves every step:

* **keys/values in a ring.** Layer ``l`` keeps ``[B, H, C, E]`` keys and values with ``C = mem_len + 1`` slots
  (the memory and the new token). Position ``t`` lives in slot ``t mod C``; the step writes its keys/values
  there (overwriting position ``t - C``, the one that just left the memory) with a tensor index, and reads all
  ``C`` slots with an additive mask for the empty ones (and, under ``same_length``, the farthest one).
  ``slot_pos [C]`` holds the position in every slot (-1: empty), ``cur`` the position of the new token: tensors,
  not Python ints, so no step recompiles.
* **terms (b)+(d) from a table of position keys.** The distances a step needs are ``0 .. C - 1`` at every step,
  so ``W_kR R_d`` is a constant: :func:`position_keys` computes it once per decoder, ``[H, C, E]`` per layer in
  the ring's type (row ``d`` = distance ``min(d, clamp_len)``). A step dots ``q + v`` with every row, in distance
  order (one read of the table for all rows of the batch, ``E`` multiply-adds per head and distance), and takes
  each slot's score by the slot's distance (a gather of ``[B, H, C]`` scores).
* **attention as reductions.** ``q . k`` and ``p . v`` are written as a multiply and a sum over ``E`` and over
  ``C``, which the compiler fuses into one pass over the ring that converts a narrower ring (bf16) on the fly.
* **packed weights** (:func:`pack`): the weights are read as ``[out, in]`` matrices for batch-1 matrix-vector
  products; the adaptive softmax's clusters without projections (the WT103 shape) are one matrix
  ``[head words; cluster rows; tail words]``, read once per step; with ``int8=True`` every matrix of the blocks
  and of the softmax is int8 ``[out, in]`` with one bf16 scale per output row, run by the plain model's int8
  kernel (:mod:`transformer_xl.model.int8`: :func:`~transformer_xl.model.int8.quantize_rows` packs,
  :func:`~transformer_xl.model.int8.int8_matmul` multiplies, padding ``in`` to a multiple of
  :data:`INT8_BLOCK`; ``tests/inference/test_decode.py`` guards the padding).

Shapes: ``B`` batch, ``H`` heads, ``E`` d_head, ``D`` d_model, ``C`` ring slots, ``L`` layers, ``V`` words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_xl.errors import ConfigError
from transformer_xl.model import TransformerXLLM
from transformer_xl.model.int8 import BLOCK, int8_matmul, quantize_rows

#: The int8 kernel reads the input dimension in blocks of this many (:data:`transformer_xl.model.int8.BLOCK`).
INT8_BLOCK = BLOCK
#: Output rows of a float matrix on the CPU are interleaved in blocks of this many (one AVX-512 vector of float32):
#: :func:`block_rows`.
ROW_BLOCK = 16
#: Rows of ``x`` up to which :func:`float_linear` is one multiply-and-sum per row (beyond: one matrix product).
SUM_ROWS = 16


class Linear(NamedTuple):
    """A linear map ``x -> x W^T + b`` as a step reads it (:func:`pack_linear`)."""

    weight: Tensor  # float [out, in] (BLAS) or [ceil(out / 16), in, 16] (row blocks), or int8 [out, in_16]
    scale: Tensor | None  # int8: one bf16 scale per output row; float: None
    bias: Tensor | None  # [out]
    shape: tuple[int, int]  # (out, in) of the map; ``weight`` may hold zero rows or columns beyond them

    @property
    def padding_bytes(self) -> int:
        """Bytes of ``weight`` beyond the map's ``out x in`` (zero rows of the last block, zero columns)."""
        return self.weight.nbytes - self.shape[0] * self.shape[1] * self.weight.element_size()


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


# ---------------------------------------------------------------------------------------------- packing
def pack_linear(weight: Tensor, bias: Tensor | None, int8: bool) -> Linear:
    """``weight [out, in]`` and ``bias`` as a step reads them (:class:`Linear`): int8 with row scales, or float, in
    row blocks on the CPU (:func:`block_rows`) and as it is elsewhere."""
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    if int8:
        q, scale = quantize_rows(weight)
        return Linear(q, scale, bias, (weight.size(0), weight.size(1)))
    if weight.device.type == "cpu":
        return Linear(block_rows(weight), None, bias, (weight.size(0), weight.size(1)))
    return Linear(weight.contiguous(), None, bias, (weight.size(0), weight.size(1)))


def block_rows(weight: Tensor) -> Tensor:
    """``weight [out, in]`` as ``[ceil(out / 16), in, 16]``: output rows ``16 k .. 16 k + 15`` interleaved in block
    ``k`` (zero rows fill the last one), so that a product reads each block front to back with the 16 rows in the
    lanes of one vector (:func:`float_linear`)."""
    out, n_in = weight.shape
    padded = F.pad(weight, (0, 0, 0, -out % ROW_BLOCK))
    return padded.view(-1, ROW_BLOCK, n_in).transpose(1, 2).contiguous()


def unblock_rows(blocks: Tensor, out: int) -> Tensor:
    """The ``[out, in]`` matrix of :func:`block_rows`' ``blocks`` (a copy)."""
    return blocks.transpose(1, 2).reshape(-1, blocks.size(1))[:out]


def _layer_norm(ln: torch.nn.LayerNorm) -> tuple[Tensor, Tensor]:
    return ln.weight.detach(), ln.bias.detach()


def pack(model: TransformerXLLM, *, int8: bool = False) -> dict:
    """The weights a step reads, laid out for it (module docstring); tensors only, in nested dicts/tuples."""
    cfg = model.config
    crit, emb, pos = model.crit, model.word_emb, model.pos_enc
    layers = []
    for i, layer in enumerate(model.layers):
        att, ff = layer.dec_attn, layer.pos_ff
        layers.append({
            "qkv": pack_linear(att.qkv_net.weight, None, int8),
            "u": (pos.r_w_bias[i] if cfg.untie_r else pos.r_w_bias).detach(),  # [H, E]
            "v": (pos.r_r_bias[i] if cfg.untie_r else pos.r_r_bias).detach(),  # [H, E]
            "o": pack_linear(att.o_net.weight, None, int8),
            "ln1": _layer_norm(att.layer_norm),
            "ff1": pack_linear(ff.CoreNet[0].weight, ff.CoreNet[0].bias, int8),
            "ff2": pack_linear(ff.CoreNet[3].weight, ff.CoreNet[3].bias, int8),
            "ln2": _layer_norm(ff.layer_norm),
        })
    embs = tuple((layer.weight.detach(), pack_linear(emb.emb_projs[j], None, int8) if len(emb.emb_projs) else None)
                 for j, layer in enumerate(emb.emb_layers))
    return {"layers": tuple(layers), "emb": embs, "head": _pack_head(crit, int8)}


def _pack_head(crit: torch.nn.Module, int8: bool) -> tuple[Linear, ...]:
    """One pair ``(projection, linear)`` per cluster (the projection ``[D, d_i]`` packed as the map ``D -> d_i``),
    or one fused matrix when no cluster is projected."""
    pieces = []
    for i in range(len(crit.bounds)):
        weight, bias, proj = crit.cluster_params(i)
        if i == 0 and crit.n_clusters:
            weight = torch.cat([weight, crit.cluster_weight], 0)
            bias = torch.cat([bias, crit.cluster_bias], 0)
        pieces.append((weight, bias, proj))
    if all(p is None for _, _, p in pieces):  # one matrix read once: [head words; cluster rows; tail words]
        weight = torch.cat([w for w, _, _ in pieces], 0)
        bias = torch.cat([b for _, b, _ in pieces], 0)
        return ((None, pack_linear(weight, bias, int8)),)
    return tuple((None if p is None else pack_linear(p.t(), None, int8), pack_linear(w, b, int8))
                 for w, b, p in pieces)


def spec_of(model: TransformerXLLM, heads: tuple, *, mem_len: int, same_length: bool) -> StepSpec:
    """The constants of ``model``'s step with the packed softmax ``heads`` (fused: one matrix, else per cluster)."""
    cfg = model.config
    crit = model.crit
    emb_bounds = tuple(model.word_emb.bounds) if cfg.div_val > 1 else ((0, cfg.n_token),)  # one table: div_val 1
    fused = len(heads) == 1 and crit.n_clusters > 0
    sizes = tuple(hi - lo + (crit.n_clusters if i == 0 else 0) for i, (lo, hi) in enumerate(crit.bounds))
    return StepSpec(n_layer=cfg.n_layer, n_head=cfg.n_head, d_head=cfg.d_head, pre_lnorm=cfg.pre_lnorm,
                    eps=model.layers[0].pos_ff.layer_norm.eps, scale=model.layers[0].dec_attn.scale,
                    emb_scale=model.word_emb.emb_scale, emb_bounds=emb_bounds,
                    head_sizes=sizes if fused else (), shortlist=crit.shortlist, n_clusters=crit.n_clusters,
                    same_length=same_length, mem_len=mem_len)


def check_supported(model: TransformerXLLM) -> None:
    """A one-line :class:`ConfigError` unless the captured step can run ``model``."""
    why = supported(model)
    if why is not None:
        raise ConfigError(f"the captured decode step does not support {why}; use the plain step")


# ---------------------------------------------------------------------------------------------- the math
def linear(x: Tensor, lin: Linear) -> Tensor:
    """``x W^T + b`` for ``x [N, in]``: float, or int8 weights by the plain model's kernel
    (:func:`~transformer_xl.model.int8.int8_matmul`), the result in ``x``'s type."""
    if lin.scale is None:
        return float_linear(x, lin.weight, lin.bias, lin.shape[0])
    return int8_matmul(x, lin.weight, lin.scale, lin.bias)


def float_linear(x: Tensor, weight: Tensor, bias: Tensor | None, out: int) -> Tensor:
    """``x W^T + b`` over float weights: ``[out, in]`` by BLAS, or row blocks (:func:`block_rows`) as one multiply
    and sum per row of ``x``, which the compiler turns into one pass over the blocks with 16 output rows in the lanes
    of a vector, at about the machine's read rate (BLAS's matrix-vector kernel reads these small matrices at about
    half of it: ``benchmarks/decode_kernels.py``). The sums of several rows (a batch) fuse into one loop that reads
    each block once, one accumulator per row. More than :data:`SUM_ROWS` rows (a memory's projection): one matrix
    product."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    n = x.size(0)
    if n > SUM_ROWS:
        y = torch.einsum("ni,kio->nko", x, weight)  # [N, K, 16]
    else:
        y = torch.stack([(weight * row[None, :, None]).sum(1) for row in x])  # [N, K, 16]
    y = y.reshape(n, -1)[:, :out]
    return y if bias is None else y + bias


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
    if spec.head_sizes:
        logits = list(linear(h, heads[0][1]).split(spec.head_sizes, dim=-1))
    else:
        logits = [linear(h if proj is None else linear(h, proj), lin) for proj, lin in heads]
    head = F.log_softmax(logits[0], dim=-1)  # [B, shortlist + n_clusters]
    if not spec.n_clusters:
        return head
    parts = [head[:, :spec.shortlist]]
    parts += [head[:, -i, None] + F.log_softmax(logits[i], dim=-1) for i in range(1, spec.n_clusters + 1)]
    return torch.cat(parts, dim=1)


def _dot_keys(q: Tensor, k: Tensor) -> Tensor:
    """``q . k`` per slot: ``q [B, H, E]``, ``k [B, H, C, E]`` -> ``[B, H, C]``; a batched matrix-vector product
    on a float32 ring with several rows, else a fused multiply-and-sum (one pass over the ring; it widens a narrower
    ring as it reads it)."""
    if k.dtype == q.dtype and q.size(0) != 1:
        return torch.matmul(k, q[..., None])[..., 0]
    return (q[:, :, None, :] * k).sum(-1)


def position_keys(model: TransformerXLLM, r_dist: Tensor, dtype: torch.dtype) -> list[Tensor]:
    """``W_kR R_d`` for every distance row of ``r_dist [C, D]`` (sinusoids), per layer ``[H, C, E]`` in ``dtype``
    (module docstring)."""
    cfg = model.config
    with torch.no_grad():
        return [F.linear(r_dist, layer.dec_attn.r_net.weight).view(-1, cfg.n_head, cfg.d_head)
                .transpose(0, 1).to(dtype).contiguous() for layer in model.layers]


def _dot_positions(qv: Tensor, pos: Tensor) -> Tensor:
    """``qv . pos_d`` per distance: ``qv [B, H, E]``, ``pos [H, C, E]`` (shared by the batch) -> ``[B, H, C]``."""
    if pos.dtype == qv.dtype and qv.size(0) != 1:  # one [H, C, E] x [H, E, B] product
        return torch.matmul(pos, qv.permute(1, 2, 0)).permute(2, 0, 1)
    return (qv[:, :, None, :] * pos).sum(-1)


def _mix_values(prob: Tensor, v: Tensor) -> Tensor:
    """``sum_c prob_c v_c``: ``prob [B, H, C]``, values by dimension ``v [B, H, E, C]`` -> ``[B, H, E]`` (as
    :func:`_dot_keys`; one contiguous sum over the slots per dimension)."""
    if v.dtype == prob.dtype and prob.size(0) != 1:
        return torch.matmul(v, prob[..., None])[..., 0]
    return (prob[:, :, None, :] * v).sum(-1)


def step(spec: StepSpec, weights: dict, tok: Tensor, ks: list[Tensor], vs: list[Tensor], slot_pos: Tensor,
         cur: Tensor, pos_keys: list[Tensor]) -> tuple[Tensor, Tensor]:
    """One token per row: ``tok [B]`` -> next-token log-probabilities ``[B, V]`` and the memory rows of this
    position ``[L + 1, B, D]`` (every layer's input and the output). Writes the keys/values into the rings
    ``ks`` (``[B, H, C, E]`` per layer) and ``vs`` (by dimension: ``[B, H, E, C]``), ``cur`` into ``slot_pos`` and
    advances ``cur`` (in place).
    ``pos_keys``: :func:`position_keys` of the model for ``C`` distances."""
    n_slot = slot_pos.size(0)
    bsz, n_head, d_head = tok.size(0), spec.n_head, spec.d_head
    slot = torch.remainder(cur, n_slot).view(1)  # [1]
    slot_pos.index_copy_(0, slot, cur.view(1))
    dist = cur - slot_pos  # [C] distance of every slot's position (garbage where empty)
    visible = slot_pos >= 0
    if spec.same_length:  # every query sees mem_len keys, itself included
        visible = visible & (dist < spec.mem_len)
    bias = torch.where(visible, 0.0, float("-inf"))  # [C]
    by_slot = dist.clamp(0, n_slot - 1)  # [C] the distance row of every slot

    h = embed(spec, weights["emb"], tok)  # [B, D]
    hids = [h]
    for i, w in enumerate(weights["layers"]):
        x = F.layer_norm(h, h.shape[-1:], *w["ln1"], spec.eps) if spec.pre_lnorm else h
        q, k, v = linear(x, w["qkv"]).view(bsz, 3, n_head, d_head).unbind(1)  # [B, H, E] each
        ks[i].index_copy_(2, slot, k[:, :, None].to(ks[i].dtype))
        vs[i].index_copy_(3, slot, v[..., None].to(vs[i].dtype))
        ac = _dot_keys(q + w["u"], ks[i])  # terms (a)+(c): [B, H, C]
        bd = _dot_positions(q + w["v"], pos_keys[i])[:, :, by_slot]  # terms (b)+(d): [B, H, C]
        prob = torch.softmax((ac + bd) * spec.scale + bias, dim=-1)  # [B, H, C]
        a = _mix_values(prob, vs[i])  # [B, H, E]
        out = linear(a.reshape(bsz, n_head * d_head), w["o"])  # [B, D]
        h = h + out if spec.pre_lnorm else F.layer_norm(h + out, h.shape[-1:], *w["ln1"], spec.eps)
        x = F.layer_norm(h, h.shape[-1:], *w["ln2"], spec.eps) if spec.pre_lnorm else h
        core = linear(torch.relu(linear(x, w["ff1"])), w["ff2"])  # [B, D]
        h = h + core if spec.pre_lnorm else F.layer_norm(h + core, h.shape[-1:], *w["ln2"], spec.eps)
        hids.append(h)
    cur.add_(1)
    return head_log_probs(spec, weights["head"], h), torch.stack(hids)
