"""The memory scoring takes, from a config's lengths, against what the machine has: the parts of the estimate, the
machine's available memory, and the one-line refusal of lengths that cannot fit."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_config
from transformer_xl.errors import ConfigError
from transformer_xl.inference import budget
from transformer_xl.inference.budget import SMALL, check_scoring, scoring_bytes
from transformer_xl.model.cache import capacity


def test_the_parts_of_the_estimate() -> None:
    """The module docstring's formulas, in floats of 4 bytes (tiny: 2 layers, 2 heads of 8, d_model 16, d_inner 32,
    50 tokens)."""
    cfg = tiny_config(tgt_len=4, mem_len=6)
    parts = scoring_bytes(cfg, rows=3, positions=20)
    q, m, k = 4, 6, 10
    cap = capacity(mlen=m, qlen=q, mem_len=6)
    assert parts == {"memory": 4 * 3 * cap * (2 * 2 * 16 + 3 * 16), "attention": 4 * 3 * 3 * 2 * q * k,
                     "positions": 4 * (k * 16 + 2 * 2 * k * 16), "activations": 4 * 3 * q * (8 * 16 + 32 + 3 * 16),
                     "logits": 4 * 2 * 3 * q * 50, "weights": 0, "total": sum(parts.values()) - parts["total"]}
    short = scoring_bytes(cfg, rows=1, positions=2, tgt_len=8, mem_len=0, weights=True)
    assert short["memory"] == 0 and short["attention"] == 4 * 3 * 2 * 2 * 2  # Q = K = 2: the stream is that short
    assert short["weights"] == 4 * 2 * cfg.parameter_count()
    adaptive = tiny_config(n_token=1000, cutoffs=[100, 500])
    columns = scoring_bytes(adaptive, rows=1, positions=1)["logits"] // 8
    full = scoring_bytes(adaptive, rows=1, positions=1, full_distribution=True)["logits"] // 8
    assert 100 + 2 < columns < 1000 == full


def test_a_huge_memory_length_costs_its_cache_slack_even_for_one_token() -> None:
    """The inference cache allocates ``mem_len // 2`` positions of slack at the first segment: a ``mem_len`` of 10**9
    asks for hundreds of gigabytes however short the text."""
    parts = scoring_bytes(tiny_config(mem_len=10**9), rows=1, positions=1)
    assert parts["memory"] >= 4 * (10**9 // 2) * (2 * 2 * 16 + 3 * 16) > 10**11


def test_lengths_that_cannot_fit_are_refused_in_one_line(monkeypatch) -> None:
    cfg = tiny_config(mem_len=10**12)
    with pytest.raises(ConfigError) as info:
        check_scoring(cfg, rows=1, positions=1, device="cpu")
    message = str(info.value)
    assert message.startswith("scoring with tgt_len=4 and mem_len=1,000,000,000,000 (1 stream of up to 1 tokens, 2 "
                              "layers of d_model 16) needs about ") and "(memory " in message and "\n" not in message
    assert message.endswith("GB available: lower mem_len, tgt_len or the batch size, or fix the lengths of the model's "
                            "config.json")
    check_scoring(cfg, rows=1, positions=1, device="cpu", mem_len=100)  # a shorter memory fits
    calls = []
    monkeypatch.setattr(budget, "available_bytes", lambda device: calls.append(device) or 10**6)
    check_scoring(tiny_config(), rows=16, positions=10**4, device="cpu")  # under SMALL: the machine is not asked
    assert calls == [] and scoring_bytes(tiny_config(), rows=16, positions=10**4)["total"] < SMALL
    with pytest.raises(ConfigError, match=r"\(16 streams of up to 100,000 tokens.* but cpu has 0.0 GB available"):
        check_scoring(tiny_config(tgt_len=10**9), rows=16, positions=10**5, device="cpu")
    monkeypatch.setattr(budget, "available_bytes", lambda device: None)  # unknown: nothing to compare with
    check_scoring(cfg, rows=1, positions=1, device="cpu")
