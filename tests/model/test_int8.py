"""int8 weights for CPU inference (TransformerXLLM.quantize): close to float, inference only, refused clearly."""

from __future__ import annotations

import pytest
import torch

from transformer_xl import InferenceCache, Recurrence, TransformerXLLM, TXLConfig
from transformer_xl.errors import ConfigError
from transformer_xl.inference.generate import generate, reference_generate
from transformer_xl.model.int8 import is_quantized

V = 60


def _model(**kw) -> TransformerXLLM:
    base = dict(n_token=V, n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, tgt_len=6, mem_len=8,
                init_std=0.1)
    torch.manual_seed(0)
    return TransformerXLLM(TXLConfig(**{**base, **kw})).eval()


@pytest.mark.parametrize("kw", [
    dict(), dict(cutoffs=[20, 40], div_val=1), dict(cutoffs=[20, 40], div_val=2, d_embed=32),
    dict(cutoffs=[20], d_embed=16, tie_projs=[False, True]), dict(pre_lnorm=True, untie_r=True, same_length=True),
    dict(attn_type=1), dict(attn_type=2), dict(attn_type=3), dict(sample_softmax=10),
])
def test_int8_log_probs_are_close_to_float(kw: dict) -> None:
    model = _model(**kw)
    quant = _model(**kw).quantize("int8")
    assert quant.quantized == "int8" and not quant.training
    qlinears = [m for m in quant.modules() if is_quantized(m)]
    assert len(qlinears) >= 4 * model.config.n_layer  # qkv, o, both feed-forward layers of every block
    x = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(1))
    rec_f, rec_q = Recurrence(model), Recurrence(quant)
    with torch.no_grad():
        for _ in range(3):
            lp_f = rec_f(x, return_log_probs=True).log_probs
            lp_q = rec_q(x, return_log_probs=True).log_probs
            diff = (lp_q - lp_f).abs().max().item()
            assert 0 < diff < 0.1  # int8 rounding: different, and close (a wrong weight gives errors of order 1)
            torch.testing.assert_close(lp_q.exp().sum(-1), torch.ones(3, 6))  # still a distribution


def test_int8_generation_matches_its_own_plain_path_and_mostly_float() -> None:
    model = _model(cutoffs=[20, 40])
    quant = _model(cutoffs=[20, 40]).quantize("int8")
    prompt = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    a = generate(quant, prompt, max_new_tokens=30, mem_len=12)
    # The plain path: every step replayed from empty memories without the inference cache, int8 weights too.
    plain_ids, plain_lp = reference_generate(quant, prompt, 30, mode="replay", mem_len=12)
    assert torch.equal(a.new_tokens, plain_ids)
    # int8 activations are scaled per call: the cache projects only new positions, the plain path all of them
    torch.testing.assert_close(a.log_probs, plain_lp, atol=0.05, rtol=0)
    b = generate(model, prompt, max_new_tokens=30, mem_len=12)
    float_ids, float_lp = reference_generate(model, prompt, 30, mode="replay", mem_len=12)
    assert not torch.allclose(plain_lp, float_lp, atol=1e-6)  # the plain path really ran the int8 weights
    assert (a.new_tokens == b.new_tokens).float().mean() > 0.8 and torch.equal(b.new_tokens, float_ids)


def test_a_cache_made_before_quantizing_is_not_reused() -> None:
    model = _model()
    x = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(3))
    cache = InferenceCache()
    with torch.no_grad():
        mems = model(x, mems=None, cache=cache).mems
        model.quantize("int8")
        served = model(x, x, mems, cache=cache).nll
        torch.testing.assert_close(served, model(x, x, mems).nll)  # projected by the int8 weights


def test_a_quantized_model_does_not_train_save_or_quantize_again(tmp_path) -> None:
    model = _model().quantize("int8")
    with pytest.raises(ConfigError, match="inference only"):
        model.train()
    with pytest.raises(ConfigError, match="not saved"):
        model.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()
    with pytest.raises(ConfigError, match="already quantized"):
        model.quantize("int8")
    with pytest.raises(ConfigError, match="unknown quantization 'int4'"):
        _model().quantize("int4")
    meta = _model().to("meta")
    with pytest.raises(ConfigError, match="for CPU inference; the model is on meta"):
        meta.quantize("int8")
