"""The runners compute the same thing on both sides, and their evaluation memories move on like ``txl eval``'s."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import adaptive_model
from transformer_xl.experiments.bench.runner import Runner, check_equal, setup, zipf_tokens
from transformer_xl.interop.hf import build_hf


@pytest.mark.hf4
def test_hf_copy_gives_the_same_nll() -> None:
    pytest.importorskip("transformers.models.deprecated.transfo_xl.modeling_transfo_xl")
    ours = adaptive_model(n_token=30, cutoffs=[10, 20], tgt_len=5, mem_len=5)
    x = torch.randint(0, 30, (2, 5))
    assert check_equal(ours, build_hf(ours), x, x.roll(-1, 1)) < 1e-5


def test_txl_eval_steps_carry_full_memories() -> None:
    runner, x, y = setup("char", "txl", device="cpu", dtype="fp32", compile=False, batch=1, seed=0)
    runner.set_eval_mem(16, 1, torch.Generator().manual_seed(0))
    assert runner.rec is not None and runner.rec.mems[0].shape == (1, 16, 256)
    before = runner.rec.mems[0]
    runner.eval_step(x, y)
    after = runner.rec.mems[0]
    assert after.shape == (1, 16, 256) and not torch.equal(after, before)  # full, and moved on by a segment
    assert runner.rec.cache is not None and runner.rec.cache._k  # the memory keys/values are reused


def test_train_step_updates_the_weights_and_keeps_memories() -> None:
    model = adaptive_model(n_token=30, cutoffs=[10, 20], tgt_len=5, mem_len=5)
    runner = Runner("txl", model, device="cpu", dtype="fp32", compile=False)
    x = zipf_tokens(30, (2, 6), torch.Generator().manual_seed(0))
    before = model.layers[0].dec_attn.qkv_net.weight.detach().clone()
    runner.train_step(x[:, :-1], x[:, 1:])
    assert not torch.equal(before, model.layers[0].dec_attn.qkv_net.weight) and runner.mems[0].shape == (2, 5, 16)
