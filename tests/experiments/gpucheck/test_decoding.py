"""Part d of the GPU check: the captured step's row on a tiny model, and what its checks flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_xl.experiments.gpucheck import decoding as dec
from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.throughput import train_config
from transformer_xl.model import TransformerXLLM


def _row(**kw) -> dict:
    return {"mem_len": 640, "same_tokens": "10/10", "logprob_max_abs_diff": 1e-6, **kw}


def test_checks_flag_other_tokens_log_probs_and_an_impossible_share() -> None:
    assert all(c["ok"] for c in dec.checks_of(_row()))
    assert [c["ok"] for c in dec.checks_of(_row(same_tokens="9/10"))] == [False, True]
    assert [c["ok"] for c in dec.checks_of(_row(logprob_max_abs_diff=2 * dec.LOGPROB_TOL))] == [True, False]
    flagged = dec.checks_of(_row(share_error="decoding mem_len 640: 130 % of its limit"))
    assert [c["ok"] for c in flagged] == [True, True, False] and "130 %" in flagged[2]["error"]


def test_a_tiny_row_decodes_the_plain_steps_tokens(tmp_path: Path) -> None:
    opts = CheckOptions(device="cpu", tiny=True, out_dir=tmp_path, log=lambda _: None)
    cfg = train_config("base", True)[0].replace(dropout=0.0, dropatt=0.0)
    torch.manual_seed(0)
    net = TransformerXLLM(cfg).eval()
    row = dec.decode_row(opts, net, 32, rate=20e9)
    assert row["same_tokens"] == "6/6" and row["logprob_max_abs_diff"] < dec.LOGPROB_TOL
    assert not row["compiled"] and not row["cuda_graphs"] and row["compile_s"] is None
    assert row["limit_tok_per_s"] == pytest.approx(20e9 / row["step_bytes"]["total"])
    assert row["share"] == pytest.approx(row["tok_per_s"] / row["limit_tok_per_s"]) and not row["meets_goal"]
    too_slow_a_rate = dec.decode_row(opts, net, 32, rate=1.0)  # the figure above its limit: refused, flagged
    assert too_slow_a_rate["share"] is None and "above 100 %" in too_slow_a_rate["share_error"]
    assert not all(c["ok"] for c in dec.checks_of(too_slow_a_rate))
