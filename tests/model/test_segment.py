"""What the layers of one forward share: without an inference cache the plain projections, with one the cache's."""

from __future__ import annotations

import torch

from tests.helpers import tiny_model
from transformer_xl.model.fastpath import mask_bias
from transformer_xl.model.segment import Segment


class _RecordingCache:
    """Stands in for an InferenceCache: records what the segment asks of it."""

    kv_active = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def keys_values(self, layer, mem, kv, n_head, project):
        self.calls.append(f"keys_values {layer} {tuple(kv.shape)} {n_head}")
        return torch.full((mem.size(0), n_head, 5, 4), 7.0), torch.zeros(mem.size(0), n_head, 5, 4)

    def position_keys(self, layer, r_net, seg, rows):
        self.calls.append(f"position_keys {layer} {tuple(rows(seg.klen).shape)}")
        return torch.zeros(seg.klen, 16)


def _segment(cache=None, made: list | None = None) -> tuple[Segment, torch.nn.Module]:
    model = tiny_model()
    cpu = torch.device("cpu")

    def make_table():
        if made is not None:
            made.append(1)
        return model.pos_enc.table(5, -1, torch.float32, cpu)

    seg = Segment(qlen=3, mlen=2, lengths=model.config.lengths(), pos=model.pos_enc,
                  mask_bias=mask_bias(qlen=3, mlen=2, mem_len=6, same_length=False, device=cpu, dtype=torch.float32),
                  make_table=make_table, cache=cache)
    return seg, model


def test_without_a_cache_the_plain_formulas_run() -> None:
    made: list[int] = []
    seg, model = _segment(made=made)
    assert seg.klen == 5 and seg.mask_bias.shape == (3, 5) and seg.dtype == torch.float32
    mem, kv = torch.randn(2, 2, 16), torch.randn(2, 3, 16)
    k, v = seg.keys_values(0, mem, kv, 2, lambda m: m * 2)  # [SG(m); h] concatenated, split into heads
    full = torch.cat([mem * 2, kv], 1).view(2, 5, 2, 2, 4)
    torch.testing.assert_close(k, full[:, :, 0].transpose(1, 2))
    torch.testing.assert_close(v, full[:, :, 1].transpose(1, 2))
    assert made == []  # the position table is made on first use only
    r_net = model.layers[0].dec_attn.r_net
    torch.testing.assert_close(seg.position_keys(0, r_net, lambda n: None), r_net(seg.table))
    assert made == [1] and seg.table is seg.table and made == [1]  # and once


def test_with_a_cache_the_projections_are_asked_of_it() -> None:
    cache = _RecordingCache()
    made: list[int] = []
    seg, model = _segment(cache, made)
    mem = torch.randn(2, 2, 16)
    k, _ = seg.keys_values(1, mem, torch.zeros(2, 3, 16), 2, lambda m: m)
    assert torch.equal(k, torch.full((2, 2, 5, 4), 7.0))
    rows = model.pos_enc.sinusoid_rows
    seg.position_keys(1, model.layers[1].dec_attn.r_net, lambda n: rows(n, -1, torch.float32, torch.device("cpu")))
    assert cache.calls == ["keys_values 1 (2, 3, 16) 2", "position_keys 1 (5, 16)"]
    assert made == []  # the cache's table served: no sinusoid computed for this forward
