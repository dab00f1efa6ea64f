"""The four position-encoding strategies (paper Sec. 3.3, Table 6), each against its definition written out."""

from __future__ import annotations

import pytest
import torch

from transformer_xl.errors import ConfigError
from transformer_xl.model.fastpath import mask_bias
from transformer_xl.model.positional import (
    AbsoluteLearned,
    AbsoluteSinusoid,
    RelativeLearned,
    RelativeSinusoid,
    build_positional,
    rel_shift,
    sinusoid,
)
from transformer_xl.model.segment import Segment


def _segment(model, qlen: int, mlen: int, clamp_len: int = -1) -> Segment:
    lengths = model.config.lengths(clamp_len=clamp_len)
    cpu = torch.device("cpu")
    return Segment(qlen=qlen, mlen=mlen, lengths=lengths, pos=model.pos_enc,
                   mask_bias=mask_bias(qlen=qlen, mlen=mlen, mem_len=lengths.mem_len, same_length=False, device=cpu,
                                       dtype=torch.float32),
                   make_table=lambda: model.pos_enc.table(qlen + mlen, clamp_len, torch.float32, cpu))


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (3, 0), (3, 4), (5, 2)])
def test_rel_shift_puts_distance_m_plus_i_minus_j_at_column_j(qlen: int, mlen: int) -> None:
    """Column r of the input holds distance K-1-r; after the shift, out[i, j] holds distance M+i-j (j <= M+i)."""
    klen = qlen + mlen
    x = torch.randn(2, qlen, klen)
    out = rel_shift(x)
    for i in range(qlen):
        for j in range(mlen + i + 1):
            assert out[0, i, j] == x[0, i, klen - 1 - (mlen + i - j)]


def test_sinusoid_is_the_transformer_embedding() -> None:
    d = 8
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d, 2.0) / d))
    emb = sinusoid(torch.tensor([0.0, 1.0, 5.0]), inv_freq)
    for row, p in enumerate((0.0, 1.0, 5.0)):
        for k in range(d // 2):
            angle = p / 10000 ** (2 * k / d)
            assert emb[row, k] == pytest.approx(torch.tensor(angle).sin().item(), abs=1e-6)
            assert emb[row, d // 2 + k] == pytest.approx(torch.tensor(angle).cos().item(), abs=1e-6)


@pytest.mark.parametrize("clamp_len", [-1, 3])
def test_relative_sinusoid_terms_b_and_d(clamp_len: int, tiny_model) -> None:
    """P_ij = (q_i + v)^T W_kR R_{min(M+i-j, clamp)}: terms (b) + (d) of the paper, for every visible key."""
    model = tiny_model(n_layer=1)
    pos, r_net = model.pos_enc, model.layers[0].dec_attn.r_net
    with torch.no_grad():
        pos.r_r_bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    qlen, mlen = 3, 5
    q = torch.randn(2, 2, qlen, 8, generator=torch.Generator().manual_seed(1))  # [B, H, Q, E]
    seg = _segment(model, qlen, mlen, clamp_len)
    with torch.no_grad():
        p = pos.position_scores(0, q, r_net, seg).dense()  # [B, H, Q, K]
        for i in range(qlen):
            for j in range(mlen + i + 1):
                dist = mlen + i - j
                r = sinusoid(torch.tensor([float(min(dist, clamp_len) if clamp_len > 0 else dist)]), pos.inv_freq)
                r_k = r_net(r).view(2, 8)  # [H, E]
                want = ((q[:, :, i] + pos.r_r_bias) * r_k).sum(-1)  # [B, H]
                torch.testing.assert_close(p[:, :, i, j], want, rtol=1e-5, atol=1e-6)
    assert torch.equal(pos.content_bias(0), pos.r_w_bias)


def test_untied_biases_are_per_layer(tiny_model) -> None:
    model = tiny_model(untie_r=True)
    assert model.pos_enc.r_w_bias.shape == (2, 2, 8)
    assert torch.equal(model.pos_enc.content_bias(1), model.pos_enc.r_w_bias[1])


def test_relative_learned_shaw_reuses_the_farthest_row_beyond_the_table(tiny_model) -> None:
    """Shaw et al.: P_ij = q_i^T E_{M+i-j} + b_{M+i-j}, learned per layer; distances past the table (K > max_klen)
    read its farthest row, as officially."""
    model = tiny_model(attn_type=1, tgt_len=2, mem_len=2)  # a table of 4 distances, rows for distances 3..0
    pos = model.pos_enc
    with torch.no_grad():
        pos.r_emb.normal_(generator=torch.Generator().manual_seed(2))
        pos.r_bias.normal_(generator=torch.Generator().manual_seed(3))
    qlen, mlen = 2, 5  # K = 7 > 4
    q = torch.randn(1, 2, qlen, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        p = pos.position_scores(0, q, None, _segment(model, qlen, mlen)).dense()  # [B, H, Q, K]
    table_rows = pos.r_emb.size(1)
    for i in range(qlen):
        for j in range(mlen + i + 1):
            row = table_rows - 1 - min(mlen + i - j, table_rows - 1)
            want = (q[0, :, i] * pos.r_emb[0, row]).sum(-1) + pos.r_bias[0, row]
            torch.testing.assert_close(p[0, :, i, j], want.detach(), rtol=1e-5, atol=1e-6)


def test_absolute_sinusoid_adds_positions_to_the_input_and_the_first_memory(tiny_model) -> None:
    model = tiny_model(attn_type=2)
    seg = _segment(model, 3, 2)
    emb = torch.zeros(1, 3, 16)
    table = sinusoid(torch.arange(4, -1, -1.0), model.pos_enc.inv_freq)  # distances K-1..0
    torch.testing.assert_close(model.pos_enc.embed(emb, seg), table[-3:][None])
    mem = torch.zeros(1, 2, 16)
    h, m0 = model.pos_enc.layer_inputs(0, emb, mem, seg)
    assert torch.equal(h, emb)
    torch.testing.assert_close(m0, table[:2][None])
    _, m1 = model.pos_enc.layer_inputs(1, emb, mem, seg)
    assert m1 is mem  # only the first layer's memory
    assert isinstance(model.pos_enc, AbsoluteSinusoid) and not model.pos_enc.memory_position_free


def test_absolute_learned_adds_right_aligned_rows_at_every_layer(tiny_model) -> None:
    model = tiny_model(attn_type=3, tgt_len=3, mem_len=2)  # 5 learned positions
    pos = model.pos_enc
    with torch.no_grad():
        pos.r_emb.normal_(generator=torch.Generator().manual_seed(5))
    h, mem = torch.zeros(1, 3, 16), torch.zeros(1, 2, 16)
    for layer in (0, 1):
        table = pos.r_emb[layer].flatten(1)  # [5, D]
        got_h, got_m = pos.layer_inputs(layer, h, mem, _segment(model, 3, 2))
        torch.testing.assert_close(got_h, table[-3:][None].detach())
        torch.testing.assert_close(got_m, table[:2][None].detach())
    with pytest.raises(ConfigError, match="does not fit"):
        pos.layer_inputs(0, torch.zeros(1, 6, 16), None, _segment(model, 6, 0))


def test_build_positional_is_the_one_reader_of_attn_type(tiny_model) -> None:
    kinds = {0: RelativeSinusoid, 1: RelativeLearned, 2: AbsoluteSinusoid, 3: AbsoluteLearned}
    for attn_type, cls in kinds.items():
        assert type(build_positional(tiny_model(attn_type=attn_type).config)) is cls
    assert RelativeSinusoid.needs_r_net and not AbsoluteLearned.needs_r_net
