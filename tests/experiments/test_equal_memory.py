"""Equal measured training memory (transformer_xl.experiments.equal_memory): the longest segment within a budget, and
the
bytes of one training step on CPU (saved tensors and state) and CUDA (the allocator's peak)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_config
from transformer_xl.errors import ConfigError
from transformer_xl.experiments import equal_memory as EM
from transformer_xl.model import TransformerXLLM

BASE = tiny_config(n_token=40, tgt_len=8, mem_len=8, init_std=0.02)


# ---------------------------------------------------------------------------------------------- equal memory
def test_longest_within_a_budget() -> None:
    seen = []

    def square(n: int) -> int:
        seen.append(n)
        return n * n

    assert EM.longest_within(square, 2000, start=32)[0] == 44  # 44² = 1936, 45² = 2025
    assert seen[:2] == [32, 64] and len(seen) == len(set(seen)) < 10
    length, tried = EM.longest_within(square, 2000, start=100)  # start too long: searched below it
    assert length == 44 and tried[0] == (100, 10000)
    assert EM.longest_within(square, 10**9, start=4, limit=50)[0] == 50
    with pytest.raises(ConfigError, match="no segment length fits"):
        EM.longest_within(square, 0, start=4)


def test_training_step_bytes_on_cpu_counts_saved_tensors_and_state() -> None:
    xl = EM.training_step_bytes(BASE, 4)
    assert xl["method"] == "saved-tensors" and xl["bytes"] == xl["saved"] + xl["parameters"] + xl["memories"]
    n_params = sum(p.numel() for p in TransformerXLLM(BASE).parameters())
    assert xl["parameters"] == 4 * 4 * n_params  # weights, gradients, two Adam moments, float32
    assert xl["memories"] == 2 * (BASE.n_layer + 1) * 4 * 8 * BASE.d_model * 4
    norec = [EM.training_step_bytes(BASE.replace(tgt_len=n, mem_len=0), 4)["bytes"] for n in (8, 12, 16)]
    assert norec[0] < xl["bytes"] and norec == sorted(norec)
    assert EM.training_step_bytes(BASE, 4) == xl  # deterministic
    with pytest.raises(ConfigError, match="CUDA"):
        EM.training_step_bytes(BASE, 4, method="allocator")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_step_bytes_on_cuda_is_the_allocator_peak() -> None:
    big = BASE.replace(d_model=64, n_head=2, d_head=32, d_inner=128)
    xl = EM.training_step_bytes(big, 16, device="cuda")
    assert xl["method"] == "allocator" and xl["bytes"] > 0
    norec = [EM.training_step_bytes(big.replace(tgt_len=n, mem_len=0), 16, device="cuda")["bytes"]
             for n in (8, 16, 32)]
    assert norec == sorted(norec) and norec[0] < xl["bytes"] < norec[-1]
