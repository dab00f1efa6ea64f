"""The ablation report (transformer_xl.experiments.ablation_report): mean ± sample std over seeds, and its tables."""

from __future__ import annotations

import math

from transformer_xl.experiments import ablation_report as R


def test_mean_spread_is_the_mean_and_sample_std() -> None:
    s = R.mean_spread([1.0, 2.0, 3.0, 4.0])
    assert (s["n"], s["mean"], s["min"], s["max"]) == (4, 2.5, 1.0, 4.0)
    assert math.isclose(s["std"], math.sqrt(5 / 3))  # ddof = 1
    assert R.mean_spread([7.0]) == {"n": 1, "mean": 7.0, "std": None, "min": 7.0, "max": 7.0}
    rows = [{"variant": "v", "recurrence": False, "encoding": "ours", "loss": "full", "train_tgt_len": 8,
             "train_mem_len": 0, "seed": s, "train_steps": 10, "train_tokens": 320, "loss_init": li,
             "ppl_init": math.exp(li), "loss_best": li, "ppl_best": math.exp(li), "attn_len_best": a,
             "loss_window": None, "ppl_window": None} for s, li, a in ((0, 1.0, 8), (1, 2.0, 16), (2, 3.0, 24))]
    (agg,) = R.aggregate(rows)
    assert agg["attn_len_best"]["mean"] == 16 and agg["attn_len_best"]["std"] == 8
    assert agg["loss_init"]["std"] == 1.0 and agg["ppl_window"] is None
    from transformer_xl.experiments.ablation_report import ablation_aggregate_table

    line = ablation_aggregate_table([agg], char_level=True).splitlines()[-1]
    assert f"{2 / math.log(2):.4f} ± {1 / math.log(2):.4f}" in line and "16 ± 8" in line and "| — |" in line
