"""Part e of the GPU check on the CPU (``--tiny``): ``txl train`` killed and resumed equals the undisturbed run to
the bit; the comparison on its own catches a resume that differs."""

from __future__ import annotations

import json
import math
import signal

import pytest

from transformer_xl.experiments.gpucheck import train_check
from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.train_check import train_resume


def _opts(tmp_path, device: str = "cpu") -> CheckOptions:
    return CheckOptions(device=device, tiny=True, out_dir=tmp_path / "out", log=lambda msg: None)


# ---------------------------------------------------------------------------------------------- part e
@pytest.mark.integration
@pytest.mark.slow
def test_a_tiny_run_killed_and_resumed_logs_the_undisturbed_losses_bit_for_bit(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TXL_CACHE_DIR", raising=False)  # the part's private cache
    r = train_resume(_opts(tmp_path))
    assert r["status"] == "ok", r
    assert r["bit_exact"] and r["max_abs_diff"] == 0.0 and r["before_resume_bit_exact"]
    assert 0 < r["resumed_at"] < r["max_step"] == 12 and r["killed_after_checkpoint"] <= r["resumed_at"]
    assert r["killed_status"] == -signal.SIGKILL
    assert r["compared_steps"] == r["max_step"] - r["resumed_at"] and not r["missing_steps"]
    assert [c["ok"] for c in r["checks"]] == [True] and r["valid_steps"] == 1 and r["valid_max_abs_diff"] == 0.0
    kept = tmp_path / "out" / "e"
    killed = [json.loads(line) for line in (kept / "killed.metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in killed if e.get("event") == "resume"] == [r["resumed_at"]]
    assert "died of signal" not in (kept / "resumed.log").read_text()
    json.dumps(r, allow_nan=False)  # the driver's JSON: no NaN


def test_compare_losses_finds_any_difference_and_any_missing_step() -> None:
    ref = {5: 10.25, 6: 10.5, 7: 10.125}
    assert train_check.compare_losses(ref, dict(ref)) == {"steps": 3, "first_step": 5, "last_step": 7, "missing": [],
                                                           "max_abs_diff": 0.0, "bit_exact": True}
    off = {**ref, 6: math.nextafter(10.5, 11.0)}  # one ulp: what a resume from another seed or position beats
    got = train_check.compare_losses(ref, off)
    assert not got["bit_exact"] and 0 < got["max_abs_diff"] < 1e-12
    short = train_check.compare_losses(ref, {5: 10.25, 6: 10.5})  # the resumed run stopped early
    assert not short["bit_exact"] and short["missing"] == [7] and short["max_abs_diff"] == 0.0
    assert not train_check.compare_losses({}, {})["bit_exact"]  # nothing compared is not a pass
    nan = train_check.compare_losses(ref, {**ref, 7: math.nan})
    assert not nan["bit_exact"] and nan["max_abs_diff"] is None


def test_the_verdict_asks_equality_on_the_cpu_and_the_tolerance_on_cuda(tmp_path) -> None:
    ref = {s: 7.0 - s / 100 for s in range(1, 11)}

    def verdict(device: str, delta: float, drop: int | None = None) -> bool:
        other = {s: v + (delta if s == 4 else 0.0) for s, v in ref.items() if s != drop}
        [check] = train_check._checks(_opts(tmp_path, device), train_check.compare_losses(ref, other))
        return check["ok"]

    assert verdict("cpu", 0.0) and not verdict("cpu", 1e-9) and not verdict("cpu", 0.0, drop=10)
    assert verdict("cuda", 0.0) and verdict("cuda", 0.01) and not verdict("cuda", 0.2)
    assert not verdict("cuda", 0.0, drop=10)


def test_train_losses_keeps_the_train_records_in_the_step_range() -> None:
    records = [{"kind": "event", "step": 4, "event": "resume"}, {"kind": "valid", "step": 6, "valid_loss": 1.0},
               *({"kind": "train", "step": s, "train_loss": float(s)} for s in range(1, 9))]
    assert train_check.train_losses(records, after=4) == {5: 5.0, 6: 6.0, 7: 7.0, 8: 8.0}
    assert train_check.train_losses(records, upto=2) == {1: 1.0, 2: 2.0}


def test_every_run_of_part_e_has_one_command_line_that_starts_or_resumes(tmp_path) -> None:
    args = train_check.train_args(_opts(tmp_path), tmp_path / "run")
    assert args[:4] == ["--resume", "auto", "--out-dir", str(tmp_path / "run")]
    assert args[args.index("--precision") + 1] == "bf16" and args[args.index("--device") + 1] == "cpu"
    gpu = train_check.train_args(CheckOptions(device="cuda", out_dir=tmp_path), tmp_path / "run")
    assert gpu[gpu.index("--preset") + 1] == "demo" and gpu[gpu.index("--max-step") + 1] == "300"
