"""Evaluation speed, Transformer-XL memory vs the vanilla sliding window (paper Table 9)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import tiny_config
from txl.errors import ConfigError
from txl.experiments.speed import eval_speed

BASE = tiny_config(n_token=40, tgt_len=8, mem_len=8, init_std=0.02)


def test_eval_speed_rows(capsys) -> None:
    data = np.random.default_rng(0).integers(0, 40, 4000)
    lines: list[str] = []
    rows = eval_speed(BASE, data, [8, 16], tgt_len=4, xl_batch=2, rows=4, xl_tokens=32, vanilla_tokens=8, repeats=2,
                      progress=lines.append, bar="lines")
    assert [r["attn_len"] for r in rows] == [8, 16]
    assert [ln.split(":")[0] for ln in lines] == ["L=8", "L=16"]
    assert [ln.split(" | ")[0] for ln in capsys.readouterr().err.splitlines()] == ["eval-speed 1/2 (50%)",
                                                                                   "eval-speed 2/2 (100%)"]
    for r in rows:
        assert r["xl_ms_per_token"] > 0 and r["vanilla_ms_per_token"] > 0
        assert r["slowdown"] == pytest.approx(r["vanilla_ms_per_token"] / r["xl_ms_per_token"])
        assert r["xl_tokens"] == 32 and r["vanilla_tokens"] == 8 and len(r["xl_ms_all"]) == 2
    with pytest.raises(ConfigError):
        eval_speed(BASE, data, [8], vanilla_attn_type=0)
