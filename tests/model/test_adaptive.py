"""Adaptive input/softmax and sampled softmax (paper Sec. 4; official formulas), against explicit computations."""

from __future__ import annotations

import torch

from tests.helpers import TINY
from transformer_xl.model.adaptive import LogUniformSampler, sampled_logits

V = TINY["n_token"]


def test_nll_equals_log_prob_gather(tiny_model) -> None:
    for kw in (dict(), dict(cutoffs=[10, 30], div_val=2), dict(cutoffs=[10, 30], div_val=1, d_embed=8)):
        model = tiny_model(**kw)
        x = torch.randint(0, V, (2, 4))
        y = torch.randint(0, V, (2, 4))
        out = model(x, y, return_log_probs=True)
        gathered = -out.log_probs.gather(-1, y[..., None]).squeeze(-1)
        torch.testing.assert_close(out.nll, gathered, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(2, 4), atol=1e-5, rtol=1e-5)


def test_log_uniform_sampler_probabilities() -> None:
    n, s = 1000, 20
    sampler = LogUniformSampler(n, s)
    assert torch.isclose(sampler.dist.sum(), torch.tensor(1.0), atol=1e-5)
    # The official expression: log(1 - (1 + p_k)^(-2s)), close to log P(k drawn in 2s draws) for small p_k.
    expected = torch.log(1 - (1 + sampler.dist.double()) ** (-2 * s)).float()
    torch.testing.assert_close(sampler.log_q, expected, atol=1e-5, rtol=1e-4)
    exact = torch.log(1 - (1 - sampler.dist.double()) ** (2 * s)).float()
    assert (sampler.log_q[100:] - exact[100:]).abs().max() < 1e-2
    neg = sampler.sample(generator=torch.Generator().manual_seed(0))
    assert neg.unique().numel() == neg.numel() <= 2 * s


def test_sampled_logits_mask_hits_and_correct_true_column() -> None:
    torch.manual_seed(0)
    w, b = torch.randn(30, 8), torch.randn(30)
    h = torch.randn(5, 8)
    target = torch.tensor([1, 2, 3, 4, 5])
    neg = torch.tensor([0, 2, 7])
    log_q = torch.randn(30)
    logits = sampled_logits(w, b, target, h, neg, log_q)
    assert logits.shape == (5, 4)
    torch.testing.assert_close(logits[0, 0], h[0] @ w[1] + b[1] - log_q[1])
    torch.testing.assert_close(logits[0, 3], h[0] @ w[7] + b[7] - log_q[7])
    assert logits[1, 2] == -1e30  # row 1's target (2) is also a sampled negative


def test_sampled_softmax_model_trains_and_evaluates_with_full_softmax(tiny_model) -> None:
    model = tiny_model(sample_softmax=10, n_token=V)
    assert model.out_layer.weight is model.word_emb.emb_layers[0].weight
    x = torch.randint(0, V, (2, 4))
    model.train()
    loss = model(x, x).loss
    loss.backward()
    assert torch.isfinite(loss) and model.out_layer.bias.grad is not None
    model.eval()
    out = model(x, x, return_log_probs=True)
    torch.testing.assert_close(out.nll, -out.log_probs.gather(-1, x[..., None]).squeeze(-1))


def test_adaptive_input_runs_under_bf16_autocast() -> None:
    """The clusters' bf16 products are written into the float32 embedding (they were refused: index_copy_ dtype)."""
    from transformer_xl.model.adaptive import AdaptiveEmbedding

    torch.manual_seed(0)
    emb = AdaptiveEmbedding(100, 16, 16, [20, 60], div_val=2)
    ids = torch.randint(0, 100, (2, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = emb(ids)
    assert out.shape == (2, 7, 16) and out.dtype == torch.float32
    torch.testing.assert_close(out, emb(ids), rtol=2e-2, atol=2e-2)  # bf16 rounding of the projections only
