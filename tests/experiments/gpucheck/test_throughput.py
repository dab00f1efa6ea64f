"""Parts b and c of the GPU check: NVIDIA's configurations, MFU and the figures beside it, TF32 restored, a row's
out-of-memory recorded while the others go on, and a tiny row of each kind run for real."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from transformer_xl.experiments.gpucheck import throughput as tp
from transformer_xl.experiments.gpucheck.options import CheckOptions


def _opts(tmp_path: Path, **kw) -> CheckOptions:
    return CheckOptions(device="cpu", tiny=True, out_dir=tmp_path, log=lambda _: None, **kw)


def test_nvidia_configurations() -> None:
    base, b = tp.train_config("base", tiny=False)
    large, lb = tp.train_config("large", tiny=False)
    assert (base.n_layer, base.d_model, base.n_head, base.d_head, base.d_inner, base.tgt_len, base.mem_len, b,
            base.dropout, base.dropatt, base.div_val) == (16, 512, 8, 64, 2048, 192, 192, 32, 0.1, 0.0, 1)
    assert (large.n_layer, large.d_model, large.n_head, large.d_head, large.d_inner, large.tgt_len, large.mem_len,
            lb, large.div_val) == (18, 1024, 16, 64, 4096, 384, 384, 16, 4)
    for cfg in (base, large):
        assert cfg.n_token == 267735 and cfg.cutoffs == (20000, 40000, 200000)
    assert [(c.tgt_len, c.mem_len) for c in (tp.eval_config("base", False), tp.eval_config("large", False))] == \
        [(64, 640), (128, 1600)]
    with pytest.raises(ValueError, match="unknown model"):
        tp.train_config("huge", tiny=False)


def test_mfu_is_flops_over_the_peak_of_the_rows_precision() -> None:
    peak = {"bf16": 800e12, "fp32": 50e12, "tf32": 400e12}
    row = tp.compare_training({"status": "ok", "model": "base", "mode": "bf16", "train_flops": 40e12,
                               "step_s": 0.1, "tok_per_s": 130000.0}, peak)
    assert row["mfu"] == pytest.approx(0.5) and row["nvidia_a100_tok_per_s"] == 59961
    assert row["goal_tok_per_s"] == 120000 and row["meets_goal"] is True
    row = tp.compare_training({"status": "ok", "model": "base", "mode": "tf32", "train_flops": 40e12,
                               "step_s": 0.2, "tok_per_s": 30000.0}, peak)
    assert row["mfu"] == pytest.approx(0.5) and row["nvidia_a100_tok_per_s"] == 41527 and "goal_tok_per_s" not in row
    row = tp.compare_training({"status": "ok", "model": "large", "mode": "bf16-compile", "train_flops": 1e12,
                               "step_s": 1.0, "tok_per_s": 49999.0}, peak)
    assert row["nvidia_a100_tok_per_s"] == 25084 and row["meets_goal"] is False
    assert tp.compare_training({"status": "oom"}, peak) == {"status": "oom"}


def test_tf32_is_set_and_restored_even_after_an_error() -> None:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with pytest.raises(RuntimeError), tp.tf32(not before[0]):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before[0])
        assert torch.backends.cudnn.allow_tf32 is (not before[0])
        raise RuntimeError
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_a_tiny_training_row(tmp_path: Path) -> None:
    row = tp.train_row(_opts(tmp_path), "large", "tf32")
    assert row["tok_per_s"] == pytest.approx(2 * 16 / row["step_s"]) and row["timed_steps"] == 2
    assert row["train_flops"] > 0 and row["first_loss"] > 0 and row["last_loss"] > 0 and not row["compiled"]


def test_an_out_of_memory_row_is_recorded_and_the_others_go_on(tmp_path: Path, monkeypatch) -> None:
    def fake_row(opts, model, mode):
        if (model, mode) == ("large", "bf16"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if (model, mode) == ("base", "tf32"):
            raise KeyError("bug")
        return {"model": model, "mode": mode, "train_flops": 1e9, "step_s": 0.5, "tok_per_s": 64.0,
                "first_loss": 7.0, "last_loss": 6.5, "compiled": False}

    monkeypatch.setattr(tp, "train_row", fake_row)
    monkeypatch.setattr(tp, "peaks", lambda opts: {"bf16": 1e10, "fp32": 1e10, "tf32": 1e10})
    res = tp.training(_opts(tmp_path))
    status = {(r["model"], r["mode"]): r["status"] for r in res["rows"]}
    assert status == {("base", "bf16"): "ok", ("large", "bf16"): "oom", ("base", "tf32"): "failed",
                      ("large", "tf32"): "ok", ("base", "bf16-compile"): "skipped",
                      ("large", "bf16-compile"): "skipped", ("base", "bf16-explicit"): "ok",
                      ("base", "bf16-flex"): "skipped"}
    oom = next(r for r in res["rows"] if r["status"] == "oom")
    assert oom["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    failing = [c["name"] for c in res["checks"] if not c["ok"]]
    assert failing == ["training base tf32 ran"]  # a bug fails the check; running out of memory is a figure


@pytest.mark.integration
def test_a_compiled_row_runs_in_its_own_process_under_the_parts_time(tmp_path: Path) -> None:
    opts = _opts(tmp_path, deadline=time.monotonic() + 60)
    row = tp._isolated_row(opts, "base", "bf16-compile", min_s=5)
    assert row["status"] == "ok" and row["model"] == "base" and row["mode"] == "bf16-compile"
    assert row["tok_per_s"] > 0 and row["process_s"] > 0 and not row["compiled"]  # tiny: the same step, eager
    short = _opts(tmp_path, deadline=time.monotonic() + 12)
    assert tp._isolated_row(short, "base", "bf16-compile", min_s=5)["status"] == "skipped"


def test_evaluation_rows_and_an_out_of_memory_batch(tmp_path: Path, monkeypatch) -> None:
    res = tp.evaluation(_opts(tmp_path))
    assert [(r["model"], r["batch"], r["status"]) for r in res["rows"]] == [
        ("base", 1, "ok"), ("base", 2, "ok"), ("large", 1, "ok"), ("large", 2, "ok")]
    assert all(c["ok"] for c in res["checks"]) and res["rows"][0]["nvidia_a100_tok_per_s"] == 6936
    real = tp.eval_row

    def fake(opts, net, model, batch):
        if batch == 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(opts, net, model, batch)

    monkeypatch.setattr(tp, "eval_row", fake)
    res = tp.evaluation(_opts(tmp_path))
    assert [r["status"] for r in res["rows"]] == ["ok", "oom", "ok", "oom"]


def test_the_explicit_row_runs_the_explicit_path_and_restores_the_choice(tmp_path: Path, monkeypatch) -> None:
    """``bf16-explicit`` times the path ``choose`` would not take: every attention with a gradient goes the explicit
    way inside the row, and ``choose`` is the real one again after it (also after an error)."""
    from transformer_xl.model import dispatch

    taken: list[dispatch.Path] = []
    real_attend = dispatch.attend_explicit
    monkeypatch.setattr(dispatch, "attend_explicit", lambda *a, **k: taken.append(dispatch.EXPLICIT) or
                        real_attend(*a, **k))
    row = tp.train_row(_opts(tmp_path), "base", "bf16-explicit")
    assert row["mode"] == "bf16-explicit" and taken and dispatch.choose.__name__ == "choose"
    with pytest.raises(RuntimeError), tp.training_path(dispatch.EXPLICIT):
        assert dispatch.choose(grad=True, qlen=2, device=torch.device("cpu"), compiling=False, dropatt=0.0,
                               factored=True).path is dispatch.EXPLICIT
        raise RuntimeError
    assert dispatch.choose.__name__ == "choose"
    taken.clear()
    tp.train_row(_opts(tmp_path), "base", "bf16")  # the CPU's own training path: not the explicit one
    assert not taken


def test_an_mfu_above_the_peak_fails_a_full_size_check(tmp_path: Path, monkeypatch) -> None:
    """A share above 100 % means the yardstick is wrong: at full sizes it is a failed check (tiny rows on a busy CPU
    time too little to say, and are not checked)."""
    def fake_row(opts, model, mode):
        return {"model": model, "mode": mode, "train_flops": 1e12, "step_s": 0.5, "tok_per_s": 64.0,
                "first_loss": 7.0, "last_loss": 6.5, "compiled": False}

    monkeypatch.setattr(tp, "train_row", fake_row)
    monkeypatch.setattr(tp, "peaks", lambda opts: {"bf16": 1e10, "fp32": 1e10, "tf32": 1e10})
    full = CheckOptions(device="cpu", tiny=False, compile=False, out_dir=tmp_path, log=lambda _: None)
    bad = [c for c in tp.training(full)["checks"] if not c["ok"]]
    assert bad and all("MFU at most 100 %" in c["name"] and c["value"] == pytest.approx(200.0) for c in bad)
    assert all(c["ok"] for c in tp.training(_opts(tmp_path))["checks"])
