"""What the layers of one forward share: without an inference cache the plain projections, with one the cache's."""

from __future__ import annotations

import torch

from tests.helpers import tiny_model
from txl.model.fastpath import mask_bias
from txl.model.segment import Segment


class _RecordingCache:
    """Stands in for an InferenceCache: records what the segment asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def memory_kv(self, layer, mem, project):
        self.calls.append(f"memory_kv {layer}")
        return torch.full((mem.size(0), mem.size(1), 4), 7.0)

    def keep_kv(self, layer, kv):
        self.calls.append(f"keep_kv {layer} {tuple(kv.shape)}")

    def position_keys(self, layer, r_net, seg, rows):
        self.calls.append(f"position_keys {layer} {tuple(rows(seg.klen).shape)}")
        return torch.zeros(seg.klen, 16)


def _segment(cache=None) -> tuple[Segment, torch.nn.Module]:
    model = tiny_model()
    cpu = torch.device("cpu")
    seg = Segment(qlen=3, mlen=2, lengths=model.config.lengths(), pos=model.pos_enc,
                  mask_bias=mask_bias(qlen=3, mlen=2, mem_len=6, same_length=False, device=cpu, dtype=torch.float32),
                  table=model.pos_enc.table(5, -1, torch.float32, cpu), cache=cache)
    return seg, model


def test_without_a_cache_the_plain_formulas_run() -> None:
    seg, model = _segment()
    assert seg.klen == 5 and seg.mask_bias.shape == (3, 5)
    mem = torch.randn(2, 2, 16)
    torch.testing.assert_close(seg.memory_kv(0, mem, lambda m: m * 2), mem * 2)
    seg.keep_kv(0, torch.zeros(2, 5, 32))  # nothing to keep it for
    r_net = model.layers[0].dec_attn.r_net
    torch.testing.assert_close(seg.position_keys(0, r_net, lambda n: None), r_net(seg.table))


def test_with_a_cache_the_projections_are_asked_of_it() -> None:
    cache = _RecordingCache()
    seg, model = _segment(cache)
    mem = torch.randn(2, 2, 16)
    assert torch.equal(seg.memory_kv(1, mem, lambda m: m), torch.full((2, 2, 4), 7.0))
    seg.keep_kv(1, torch.zeros(2, 5, 32))
    rows = model.pos_enc.sinusoid_rows
    seg.position_keys(1, model.layers[1].dec_attn.r_net, lambda n: rows(n, -1, torch.float32, torch.device("cpu")))
    assert cache.calls == ["memory_kv 1", "keep_kv 1 (2, 5, 32)", "position_keys 1 (5, 16)"]
