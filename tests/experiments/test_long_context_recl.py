"""RECL of the long-context models: per-seed groups read back, mean ± std over seeds, the report and figure."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.long_context_recl import recl_report, recl_summary, seed_group
from transformer_xl.experiments.recl import compute_recl

CONTEXTS = [4, 8, 12, 16]


def _result(seed: int, reach: int):
    """Two models on 400 tokens: 'far' gains at every step up to context ``reach``, 'near' never."""
    rng = np.random.default_rng(seed)
    base = 2.0 + rng.random(400)
    far = np.stack([base * (1 - 0.2 * min(c, reach) / 4) for c in CONTEXTS])
    near = np.stack([base for _ in CONTEXTS])
    return compute_recl(np.stack([far, near]), CONTEXTS, names=["far", "near"], r_values=[0.1, 1.0])


def test_summary_gives_each_seed_and_mean_and_spread(tmp_path) -> None:
    results = {0: _result(0, 8), 1: _result(1, 12)}
    s = recl_summary(results)
    assert s["far"]["0.1"]["seeds"] == {0: 8, 1: 12}
    assert s["far"]["0.1"]["mean"] == 10 and s["far"]["0.1"]["std"] == pytest.approx(np.std([8, 12], ddof=1))
    assert s["near"]["1.0"]["mean"] == 4 and s["near"]["1.0"]["censored"] == 0
    pytest.importorskip("matplotlib")
    md = recl_report(results, tmp_path)
    assert "| far | 10.0 ± 2.8 (8, 12) |" in md and "Seeds 0, 1" in md
    assert (tmp_path / "long-context-recl.png").stat().st_size > 0


def test_a_group_needs_finished_models(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no finished model"):
        seed_group(tmp_path, 0, ["ours-L2-m24"])
