"""The perplexity cost of the captured step's narrower types, on a tiny model read token by token."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import tiny_model
from transformer_xl.experiments.bench import decode_quality as Q


def test_variants_read_the_same_tokens_and_captured_fp32_equals_plain() -> None:
    model = tiny_model(0, n_token=30)
    data = torch.randint(0, 30, (203,), generator=torch.Generator().manual_seed(0))
    report = Q.quality(model, data, batch=4, mem_len=5, compile=False)
    rows = report["variants"]
    assert list(rows) == list(Q.VARIANTS) and report["tokens"] == 4 * 49
    assert rows["plain"]["loss"] == pytest.approx(rows["captured"]["loss"], abs=1e-6)
    assert rows["captured"]["ppl_cost"] == 0.0
    for name in ("captured bf16 kv", "captured int8", "captured int8 + bf16 kv"):
        assert rows[name]["loss"] != rows["captured"]["loss"] and abs(rows[name]["ppl_cost"]) < 0.05
        assert rows[name]["ppl"] == pytest.approx(math.exp(rows[name]["loss"]))
    table = Q.quality_markdown(report, "tiny")
    assert "| captured int8 + bf16 kv |" in table and "196 tokens scored" in table


def test_streams_cut_the_split_into_contiguous_rows() -> None:
    ids = Q.streams(torch.arange(11), 3)
    assert ids.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
