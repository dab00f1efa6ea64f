"""The long-context report: seeds aggregated per distance, the tables and figures of the rows present."""

import math

import pytest

from transformer_xl.experiments.long_context_report import (
    distance_table,
    memory_table,
    summarize,
    write_report,
)


def _eval(kind, mem, window, d20, other):
    dist = {20: {"loss": d20, "tokens": 10}}  # as run_long_context returns them (int_distances)
    return {"kind": kind, "mem_len": mem, "window": window, "loss": (d20 + other) / 2,
            "copies": {"loss": d20, "tokens": 10}, "other": {"loss": other, "tokens": 10},
            "all": {"loss": (d20 + other) / 2, "tokens": 20}, "distances": dist}


def _row(variant, seed, mem, d20):
    evals = [_eval("train", mem, None, d20, 1.4), _eval("memory", 0 if mem else 8, None, 1.5, 1.4)]
    if mem == 0:
        evals.append(_eval("window", None, 8, 1.38, 1.39))
    return {"variant": variant, "seed": seed, "encoding": variant.split("-")[0], "train_mem_len": mem, "n_layer": 2,
            "params": 1000, "train_steps": 10, "train_tokens": 80, "train_minutes": 0.1, "eval_minutes": 0.1,
            "guess_loss": math.log(4), "reach": {f"train:{mem}": 20 if d20 < 0.69 else 0}, "evals": evals}


ROWS = [_row("ours-L2-m24", 0, 24, 0.2), _row("ours-L2-m24", 1, 24, 0.4), _row("ours-L2-m0", 0, 0, 1.38),
        _row("ours-L2-m0", 1, 0, 1.38)]


def test_summarize_gives_mean_and_spread_in_bits_per_distance():
    s = summarize(ROWS, "ours-L2-m24", "train", None)
    assert s["seeds"] == [0, 1]
    assert s["distances"][20]["mean"] == pytest.approx(0.3 / math.log(2))
    assert s["distances"][20]["std"] == pytest.approx(math.sqrt(0.02) / math.log(2))
    assert s["reach"]["mean"] == 20
    assert summarize(ROWS, "ours-L2-m24", "window", None) is None
    table = distance_table([s], ["xl"])
    assert "| xl | 0.43 ± 0.20 |" in table and "D = 20" in table


def test_memory_table_marks_missing_evaluations():
    table = memory_table(ROWS, ["ours-L2-m24", "ours-L2-m0"], [0, 24, 96])
    assert "— |" in table  # no evaluation at 96
    assert f"{1.45 / math.log(2):.3f}" in table  # the memory-0 evaluation of the XL model, all tokens


def test_write_report_makes_the_sections_and_figures(tmp_path):
    pytest.importorskip("matplotlib")
    md = write_report(ROWS, tmp_path, mem_len=24, n_layer=2, eval_mems=[0], guess_bits=2.0)
    assert "Recurrence against none" in md and "shorter than training" in md
    assert (tmp_path / "long-context-recurrence.png").stat().st_size > 0
    assert "depth and memory" not in md  # one depth only
