"""The pieces of the captured step: packed weights, int8 linear maps, input embedding and the fused softmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_model
from transformer_xl.inference.decode import embed, head_log_probs, linear, pack, pack_linear, spec_of, supported


@pytest.mark.parametrize("overrides, fused", [
    ({"cutoffs": [10, 25]}, True),
    ({"cutoffs": [10, 25], "div_val": 2, "tie_projs": [False, True, True]}, False),
    ({}, False),  # no clusters: one matrix, nothing to fuse
])
def test_embedding_and_head_equal_the_model(overrides, fused) -> None:
    model = tiny_model(0, n_token=40, d_model=32, d_head=16, **overrides)
    weights = pack(model)
    spec = spec_of(model, weights["head"], mem_len=4, same_length=False)
    assert bool(spec.head_sizes) == fused
    tok = torch.arange(40)  # every word, every cluster
    with torch.no_grad():
        assert (embed(spec, weights["emb"], tok) - model.word_emb(tok)).abs().max() <= 1e-6
        h = torch.randn(5, 32)
        assert (head_log_probs(spec, weights["head"], h) - model.log_prob(h)).abs().max() <= 1e-5


def test_int8_linear_is_close_and_reads_int8() -> None:
    torch.manual_seed(0)
    w, b, x = torch.randn(64, 48), torch.randn(64), torch.randn(3, 48)
    packed = pack(tiny_model(0), int8=True)["layers"][0]["ff1"]
    assert packed[0].dtype == torch.int8 and packed[1] is not None
    q = pack_linear(w, b, int8=True)
    ref = F.linear(x, w, b)
    err = (linear(x, q) - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.02
    assert torch.equal(linear(x, pack_linear(w, b, int8=False)), ref)


def test_supported_says_why_not() -> None:
    assert supported(tiny_model(0)) is None
    assert "attn_type 2" in supported(tiny_model(0, attn_type=2))
    assert "sampled" in supported(tiny_model(0, sample_softmax=10))
    assert "quantized" in supported(tiny_model(0).quantize("int8"))
