"""The captured decode step's weights as it reads them: every matrix in row blocks of :data:`ROW_BLOCK` output rows,
float32, or int8 with one bf16 scale per row in one of two forms (int8 lanes, or four weights of a row to a 32-bit
word, chosen by the width of the compiler's vectors: :func:`int8_words`); the adaptive softmax's clusters without
projections as one matrix. The step that reads them: :mod:`transformer_xl.inference.decode` (its docstring: why
these layouts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_xl.model import TransformerXLLM
from transformer_xl.model.dispatch import decode_products
from transformer_xl.model.int8 import quantize_rows
from transformer_xl.model.native import TILE_F32, TILE_Q8, tile, untile

#: Output rows of a matrix (and slots of a ring) are interleaved in blocks of this many (one AVX-512 vector of
#: float32): :func:`block_rows`, :func:`~transformer_xl.inference.decode.block_slots`.
ROW_BLOCK = 16
#: An int8 product takes this many inputs per loop step (the int8 matrices' input width is padded to a multiple of
#: it): in lanes (:func:`block_rows`), an inner sum the compiler unrolls, 64 bytes of weights per step instead of 16;
#: in words (:func:`block_words`), the weights of this many inputs of a row in one 32-bit word.
INT8_UNROLL = 4


class Linear(NamedTuple):
    """A linear map ``x -> x W^T + b`` as a step reads it (:func:`pack_linear`)."""

    weight: Tensor  # row blocks [ceil(out / 16), in, 16] (float, or int8 in lanes), int8 in words
    # [ceil(out / 16), in / 4, 16, 4]; or float [out, in] (BLAS, off the CPU); or tiles of txl's kernels
    # (form "tiles": transformer_xl.model.native.tile, float32 [O, I, 8, 8] or int8 [O, I, 4, 32])
    scale: Tensor | None  # int8: one bf16 scale per output row, [ceil(out / 16), 16] (tiles: float32 [O * 4]);
    # float: None
    bias: Tensor | None  # [out]
    shape: tuple[int, int]  # (out, in) of the map; ``weight`` may hold zero rows or columns beyond them
    form: str = "blocks"  # "blocks" (row blocks or int8 words: inductor's reductions), "tiles", "blas"

    @property
    def padding_bytes(self) -> int:
        """Bytes of ``weight`` beyond the map's ``out x in`` (zero rows of the last block, zero columns)."""
        return self.weight.nbytes - self.shape[0] * self.shape[1] * self.weight.element_size()


def int8_words() -> bool:
    """Whether this process's int8 products read their weights in 32-bit words (:func:`block_words`) rather than in
    int8 lanes (:func:`block_rows`): where the compiler's vectors are narrower than 512 bits (AVX2). There its code
    loads 8 int8 lanes through a copy (a partial vector), 2.4 GB/s against 13 GB/s in words on a core of an AMX Xeon
    held to AVX2; with AVX-512, masked loads read the lanes directly, 18-35 GB/s against 12-28 GB/s in words (the
    shifts that take a weight out of its word cost more than the loads they save). ``benchmarks/int8_forms.py``."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return pick_vec_isa().bit_width() < 512


def pack_linear(weight: Tensor, bias: Tensor | None, int8: bool, *, words: bool | None = None,
                products: str | None = None) -> Linear:
    """``weight [out, in]`` and ``bias`` as a step reads them (:class:`Linear`), in the form of ``products``
    (default :func:`~transformer_xl.model.dispatch.decode_products` of the weight's device): ``"native"``, tiles of
    txl's kernels (:func:`~transformer_xl.model.native.tile`; int8 with float32 row scales); ``"compiled"``, row
    blocks (:func:`block_rows`), int8 with one bf16 scale per row (:func:`~transformer_xl.model.int8.quantize_rows`,
    the plain model's scheme; in 32-bit words, :func:`block_words`, with ``words``, by default where
    :func:`int8_words`) or float; ``"blas"`` (off the CPU), a float matrix as it is."""
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    products = products or decode_products(weight.device)
    shape = (weight.size(0), weight.size(1))
    if products == "native" and weight.dtype == torch.float32:  # txl's kernels take float32 (others: row blocks)
        if not int8:
            return Linear(tile(weight.float(), *TILE_F32), None, bias, shape, "tiles")
        q, scale = quantize_rows(weight)
        scale = F.pad(scale.float(), (0, -scale.size(0) % TILE_Q8[0]))
        return Linear(tile(q[:, :weight.size(1)], *TILE_Q8), scale, bias, shape, "tiles")
    if int8:
        q, scale = quantize_rows(weight)  # [out, in_16] (the plain model's kernel pads in)
        q = F.pad(q[:, :weight.size(1)], (0, -weight.size(1) % INT8_UNROLL))  # in: a multiple of INT8_UNROLL
        scale = F.pad(scale, (0, -scale.size(0) % ROW_BLOCK)).view(-1, ROW_BLOCK)  # [ceil(out / 16), 16]
        blocks = block_words(q) if (int8_words() if words is None else words) else block_rows(q)
        return Linear(blocks, scale, bias, shape)
    if products != "blas" or weight.device.type == "cpu":
        return Linear(block_rows(weight), None, bias, shape)
    return Linear(weight.contiguous(), None, bias, shape, "blas")


def block_rows(weight: Tensor) -> Tensor:
    """``weight [out, in]`` as ``[ceil(out / 16), in, 16]``: output rows ``16 k .. 16 k + 15`` interleaved in block
    ``k`` (zero rows fill the last one), so that a product reads each block front to back with the 16 rows in the
    lanes of one vector (:func:`~transformer_xl.inference.decode.blocked_linear`)."""
    out, n_in = weight.shape
    padded = F.pad(weight, (0, 0, 0, -out % ROW_BLOCK))
    return padded.view(-1, ROW_BLOCK, n_in).transpose(1, 2).contiguous()


def block_words(q: Tensor) -> Tensor:
    """int8 ``q [out, in]`` (``in`` a multiple of :data:`INT8_UNROLL`) as ``[ceil(out / 16), in / 4, 16, 4]``: row
    blocks as :func:`block_rows`, and in a block the weights of 4 consecutive inputs of a row side by side, one 32-bit
    word that a product reads whole and splits into its 4 numbers
    (:func:`~transformer_xl.inference.decode.blocked_linear`)."""
    out, n_in = q.shape
    padded = F.pad(q, (0, 0, 0, -out % ROW_BLOCK))
    return padded.view(-1, ROW_BLOCK, n_in // INT8_UNROLL, INT8_UNROLL).transpose(1, 2).contiguous()


def unpack(lin: Linear) -> Tensor:
    """The ``[out, in]`` matrix of ``lin`` (int8: its numbers times their scales, in float32)."""
    if lin.form == "blas":
        return lin.weight
    if lin.form == "tiles":
        weight = untile(lin.weight, lin.shape)
    else:
        weight = unblock_rows(lin.weight, lin.shape[0])[:, :lin.shape[1]]
    if lin.scale is None:
        return weight
    return weight.float() * lin.scale.reshape(-1)[:lin.shape[0], None].float()


def unblock_rows(blocks: Tensor, out: int) -> Tensor:
    """The ``[out, in]`` matrix of :func:`block_rows`' (or :func:`block_words`') ``blocks`` (a copy)."""
    if blocks.dim() == 4:  # int8 words: [K, in / 4, 16, 4]
        return blocks.transpose(1, 2).reshape(blocks.size(0) * ROW_BLOCK, -1)[:out]
    return blocks.transpose(1, 2).reshape(-1, blocks.size(1))[:out]


def _layer_norm(ln: torch.nn.LayerNorm) -> tuple[Tensor, Tensor]:
    return ln.weight.detach(), ln.bias.detach()


def pack(model: TransformerXLLM, *, int8: bool = False, words: bool | None = None,
         products: str | None = None) -> dict:
    """The weights a step reads, laid out for it (the docstring of :mod:`transformer_xl.inference.decode`;
    ``words``, ``products``: :func:`pack_linear`); tensors only, in nested dicts/tuples."""
    products = products or decode_products(next(model.parameters()).device)
    if int8 and words is None and products == "compiled":
        words = int8_words()

    def lin(weight: Tensor, bias: Tensor | None = None) -> Linear:
        return pack_linear(weight, bias, int8, words=words, products=products)

    cfg = model.config
    crit, emb, pos = model.crit, model.word_emb, model.pos_enc
    layers = []
    for i, layer in enumerate(model.layers):
        att, ff = layer.dec_attn, layer.pos_ff
        layers.append({
            "qkv": lin(att.qkv_net.weight),
            "u": (pos.r_w_bias[i] if cfg.untie_r else pos.r_w_bias).detach(),  # [H, E]
            "v": (pos.r_r_bias[i] if cfg.untie_r else pos.r_r_bias).detach(),  # [H, E]
            "o": lin(att.o_net.weight),
            "ln1": _layer_norm(att.layer_norm),
            "ff1": lin(ff.CoreNet[0].weight, ff.CoreNet[0].bias),
            "ff2": lin(ff.CoreNet[3].weight, ff.CoreNet[3].bias),
            "ln2": _layer_norm(ff.layer_norm),
        })
    embs = tuple((layer.weight.detach(), lin(emb.emb_projs[j]) if len(emb.emb_projs) else None)
                 for j, layer in enumerate(emb.emb_layers))
    return {"layers": tuple(layers), "emb": embs, "head": _pack_head(crit, lin)}


def _pack_head(crit: torch.nn.Module, lin: Callable[..., Linear]) -> tuple[Linear, ...]:
    """One pair ``(projection, linear)`` per cluster (the projection ``[D, d_i]`` packed as the map ``D -> d_i``),
    or one fused matrix when no cluster is projected; ``lin(weight, bias)`` packs a matrix."""
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
        return ((None, lin(weight, bias)),)
    return tuple((None if p is None else lin(p.t()), lin(w, b)) for w, b, p in pieces)
