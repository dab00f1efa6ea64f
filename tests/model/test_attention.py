"""The one attention over [memory; segment] (paper Sec. 3.3) and the feed-forward block, against the paper's
formulas written out element by element in float64."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_xl.model.fastpath import mask_bias
from transformer_xl.model.positional import sinusoid
from transformer_xl.model.segment import Segment


def _segment(model, qlen: int, mlen: int, **lengths) -> Segment:
    lengths = model.config.lengths(**lengths)
    dtype = torch.float64
    return Segment(qlen=qlen, mlen=mlen, lengths=lengths, pos=model.pos_enc,
                   mask_bias=mask_bias(qlen=qlen, mlen=mlen, mem_len=lengths.mem_len, same_length=lengths.same_length,
                                       device=torch.device("cpu"), dtype=dtype),
                   make_table=lambda: model.pos_enc.table(qlen + mlen, lengths.clamp_len, dtype, torch.device("cpu")))


def _explicit_attention(attn, pos, h: torch.Tensor, mem: torch.Tensor, clamp_len: int) -> torch.Tensor:
    """A_ij = (q_i + u)^T k_j + (q_i + v)^T W_kR R_{M+i-j} for j <= M + i, softmax over j of A / sqrt(E), the
    values, W_o, the residual and LayerNorm (post-LN: LN(h + o); pre-LN: h + o, everything projected from LN of
    the input and of the memory): one query and one key at a time."""
    n_head, d_head = attn.n_head, attn.d_head
    hd = n_head * d_head
    w_q, w_k, w_v = attn.qkv_net.weight[:hd], attn.qkv_net.weight[hd:2 * hd], attn.qkv_net.weight[2 * hd:]
    residual = h
    if attn.pre_lnorm:
        h, mem = attn.layer_norm(h), attn.layer_norm(mem)
    ctx = torch.cat([mem, h], dim=1)  # [B, K, D]
    bsz, qlen, _ = h.shape
    mlen = mem.size(1)
    out = torch.zeros(bsz, qlen, hd, dtype=h.dtype)
    for b in range(bsz):
        for i in range(qlen):
            for n in range(n_head):
                heads = slice(n * d_head, (n + 1) * d_head)
                q = w_q[heads] @ h[b, i]
                scores = []
                for j in range(mlen + i + 1):  # the causal mask: keys up to the query's own position
                    k = w_k[heads] @ ctx[b, j]
                    dist = mlen + i - j
                    r = sinusoid(torch.tensor([float(min(dist, clamp_len) if clamp_len > 0 else dist)],
                                              dtype=h.dtype), pos.inv_freq.double())[0]
                    r_k = attn.r_net.weight[heads] @ r  # W_kR R_{i-j}
                    scores.append((q + pos.r_w_bias[n]) @ k + (q + pos.r_r_bias[n]) @ r_k)
                prob = torch.softmax(torch.stack(scores) / math.sqrt(d_head), 0)
                out[b, i, heads] = sum(p * (w_v[heads] @ ctx[b, j]) for j, p in enumerate(prob))
    o = out @ attn.o_net.weight.t()
    return residual + o if attn.pre_lnorm else attn.layer_norm(residual + o)


@pytest.mark.parametrize("clamp_len", [-1, 2])
def test_relative_attention_is_the_papers_formula(clamp_len: int, tiny_model) -> None:
    model = tiny_model(n_layer=1, clamp_len=clamp_len).double()
    attn = model.layers[0].dec_attn
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero biases u, v (the initialization draws them small)
        model.pos_enc.r_w_bias.normal_(0, 0.5, generator=gen)
        model.pos_enc.r_r_bias.normal_(0, 0.5, generator=gen)
    h = torch.randn(2, 3, 16, generator=gen, dtype=torch.float64)
    mem = torch.randn(2, 4, 16, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        got = attn(h, mem, _segment(model, 3, 4))
        want = _explicit_attention(attn, model.pos_enc, h, mem, clamp_len)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_memory_only_feeds_keys_and_values(tiny_model) -> None:
    """Queries come from the segment only: changing the memory changes the output, the segment's queries do not
    move to the memory, and with no memory the layer is plain causal self-attention over the segment."""
    model = tiny_model(n_layer=1).double()
    attn = model.layers[0].dec_attn
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(1, 3, 16, generator=gen, dtype=torch.float64)
    mem = torch.randn(1, 4, 16, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        with_mem = attn(h, mem, _segment(model, 3, 4))
        other_mem = attn(h, mem + 1.0, _segment(model, 3, 4))
        no_mem = attn(h, None, _segment(model, 3, 0))
        empty_mem = attn(h, mem[:, :0], _segment(model, 3, 0))
    assert with_mem.shape == (1, 3, 16) and not torch.allclose(with_mem, other_mem)
    torch.testing.assert_close(no_mem, empty_mem)
    torch.testing.assert_close(no_mem, _explicit_attention(attn, model.pos_enc, h, mem[:, :0], -1), rtol=1e-10,
                               atol=1e-10)


def test_pre_lnorm_normalizes_the_input_and_the_memory_and_adds_the_residual_outside(tiny_model) -> None:
    model = tiny_model(n_layer=1, pre_lnorm=True).double()
    attn = model.layers[0].dec_attn
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        attn.layer_norm.weight.normal_(1.0, 0.3, generator=gen)  # a LayerNorm that is not the identity
        attn.layer_norm.bias.normal_(0.0, 0.3, generator=gen)
    h = torch.randn(1, 3, 16, generator=gen, dtype=torch.float64)
    mem = torch.randn(1, 2, 16, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        got = attn(h, mem, _segment(model, 3, 2))
        want = _explicit_attention(attn, model.pos_enc, h, mem, -1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_feed_forward_is_linear_relu_linear_with_residual(tiny_model) -> None:
    model = tiny_model(n_layer=1, dropout=0.3).double()
    ff = model.layers[0].pos_ff
    lin1, lin2 = ff.CoreNet[0], ff.CoreNet[3]
    h = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        want = ff.layer_norm(h + lin2(torch.relu(lin1(h))))  # evaluation: no dropout
        torch.testing.assert_close(ff(h), want)
        ff.pre_lnorm = True
        torch.testing.assert_close(ff(h), h + lin2(torch.relu(lin1(ff.layer_norm(h)))))
    ff.train()
    assert not torch.equal(ff(h), ff(h))  # dropout draws in training
    names = {k for k, _ in ff.named_parameters()}
    assert names == {"CoreNet.0.weight", "CoreNet.0.bias", "CoreNet.3.weight", "CoreNet.3.bias",
                     "layer_norm.weight", "layer_norm.bias"}  # the official parameter names


def test_decoder_layer_is_attention_then_feed_forward(tiny_model) -> None:
    model = tiny_model(n_layer=1).double()
    layer = model.layers[0]
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(2, 3, 16, generator=gen, dtype=torch.float64)
    mem = torch.randn(2, 2, 16, generator=gen, dtype=torch.float64)
    seg = _segment(model, 3, 2)
    with torch.no_grad():
        torch.testing.assert_close(layer(h, mem, seg), layer.pos_ff(layer.dec_attn(h, mem, seg)))
