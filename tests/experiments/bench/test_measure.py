"""Model FLOPs counted by hand; the matmul peak."""

from __future__ import annotations

from transformer_xl import TXLConfig
from transformer_xl.experiments.bench import model_flops


def test_model_flops_by_hand() -> None:
    cfg = TXLConfig(n_token=10, n_layer=1, n_head=2, d_model=4, d_head=2, d_inner=8)
    b, q, m = 3, 5, 7
    k, n = q + m, b * q
    layer = 2 * (n * 4 * 4 + b * k * 4 * 8 + k * 4 * 4 + 3 * b * q * k * 4 + n * 4 * 4 + 2 * n * 4 * 8)
    assert model_flops(cfg, batch=b, qlen=q, mlen=m, targets=None) == layer + n * 2 * 4 * 10
    streaming = layer - 2 * b * m * 4 * 8  # memory keys/values were projected by an earlier segment
    assert model_flops(cfg, batch=b, qlen=q, mlen=m, targets=None, streaming=True) == streaming + n * 2 * 4 * 10
