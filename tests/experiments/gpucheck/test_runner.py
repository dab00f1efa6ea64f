"""The GPU check's driver: each part in its process under a time cap, failures isolated, the JSON and the exit
status; and the whole check run on the CPU with tiny sizes (what CI runs so that the GPU check cannot rot)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from transformer_xl.experiments.gpucheck import runner
from transformer_xl.experiments.gpucheck.options import PARTS, CheckOptions

FAKE = "tests.experiments.gpucheck.fake_parts"


def _opts(tmp_path: Path, **kw) -> CheckOptions:
    return CheckOptions(device="cpu", tiny=True, out_dir=tmp_path, log=lambda _: None, **kw)


@pytest.mark.integration
def test_a_part_returns_its_result_with_its_keyword_arguments(tmp_path: Path) -> None:
    out = runner.isolate(f"{FAKE}:ok", _opts(tmp_path), 30, name="x", kwargs={"model": "base"})
    assert out["status"] == "ok" and out["error"] is None
    assert out["result"] == {"value": 1.5, "kwargs": {"model": "base"}, "time_left_finite": True,
                             "checks": [{"name": "passes", "ok": True}]}


@pytest.mark.integration
def test_a_part_that_raises_fails_alone_with_its_one_line_error(tmp_path: Path) -> None:
    out = runner.isolate(f"{FAKE}:raises", _opts(tmp_path), 30, name="x")
    assert out["status"] == "failed" and out["result"] is None
    assert out["error"] == "RuntimeError: the device said no"
    assert "Traceback" in out["traceback"]


@pytest.mark.integration
def test_a_part_that_skips_itself_is_reported_skipped_with_its_reason(tmp_path: Path) -> None:
    out = runner.isolate(f"{FAKE}:skips", _opts(tmp_path), 30, name="x")
    assert out["status"] == "skipped" and out["error"] == "a package is missing"


@pytest.mark.integration
def test_a_part_that_crashes_fails_with_the_last_line_of_its_stderr(tmp_path: Path) -> None:
    out = runner.isolate(f"{FAKE}:crashes", _opts(tmp_path), 30, name="x")
    assert out["status"] == "failed"
    assert out["error"] == ("its process ended with status 3 without a result: fatal: the driver must read this "
                            "line")


@pytest.mark.integration
def test_a_part_past_its_cap_is_stopped_and_reported_timed_out(tmp_path: Path) -> None:
    start = time.monotonic()
    out = runner.isolate(f"{FAKE}:sleeps", _opts(tmp_path), 2.0, name="x")
    assert out["status"] == "timed_out" and "cap of 2 s" in out["error"]
    assert time.monotonic() - start < 2.0 + runner.GRACE_S
    pid = int((tmp_path / "sleeper.pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed, not left running
        os.kill(pid, 0)


@pytest.mark.integration
def test_a_stopped_driver_stops_the_part_it_runs(tmp_path: Path) -> None:
    code = ("import sys; from transformer_xl.experiments.gpucheck import runner as r; "
            "from transformer_xl.experiments.gpucheck.options import CheckOptions as O; r.exit_on_sigterm(); "
            f"r.run_check(O(device='cpu', tiny=True, out_dir=sys.argv[1], parts=('a',)), "
            f"{{'a': ('slow', '{FAKE}:sleeps')}})")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    driver = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.DEVNULL)
    pid_file = tmp_path / "sleeper.pid"
    deadline = time.monotonic() + 20
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    pid = int(pid_file.read_text())
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=15) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.integration
def test_a_missing_module_is_a_failed_part(tmp_path: Path) -> None:
    out = runner.isolate("transformer_xl.experiments.gpucheck.no_such_module:run", _opts(tmp_path), 30, name="x")
    assert out["status"] == "failed" and out["error"].startswith("ModuleNotFoundError")


@pytest.mark.integration
def test_the_check_goes_on_after_a_failure_and_reports_every_part(tmp_path: Path) -> None:
    registry = {"a": ("fine", f"{FAKE}:ok"), "b": ("broken", f"{FAKE}:raises"),
                "c": ("drifting", f"{FAKE}:out_of_tolerance"), "d": ("slow", f"{FAKE}:sleeps"),
                "e": ("fine again", f"{FAKE}:ok"), "f": ("missing", "no.such.module:run")}
    opts = _opts(tmp_path, caps={"d": 1.5})
    report = runner.run_check(opts, registry)
    status = {k: p["status"] for k, p in report["parts"].items()}
    assert status == {"a": "ok", "b": "failed", "c": "ok", "d": "timed_out", "e": "ok", "f": "failed"}
    assert report["failed_checks"] == ["c: drifts"]
    assert report["problems"] == ["b: failed", "d: timed_out", "f: failed", "c: drifts"]
    assert report["ok"] is False
    on_disk = json.loads((tmp_path / runner.JSON_NAME).read_text())
    assert on_disk["parts"].keys() == set(PARTS) and on_disk["ok"] is False
    assert on_disk["environment"]["device"] == "cpu" and on_disk["environment"]["tiny"] is True
    assert "NOT OK" in (tmp_path / runner.MD_NAME).read_text()


@pytest.mark.integration
def test_parts_beyond_the_budget_are_skipped(tmp_path: Path) -> None:
    registry = {p: ("slow", f"{FAKE}:sleeps") for p in PARTS}
    opts = _opts(tmp_path, parts=("a", "b"), budget_s=1.5)
    report = runner.run_check(opts, registry)
    assert report["parts"]["a"]["status"] == "timed_out" and report["parts"]["a"]["cap_s"] == 1.5
    assert report["parts"]["b"]["status"] == "skipped"
    assert report["parts"]["b"]["error"] == "no time left in the budget"


def test_failed_checks_lists_the_checks_that_are_not_ok() -> None:
    parts = {"a": {"result": {"checks": [{"name": "x", "ok": True}, {"name": "y", "ok": False}]}},
             "b": {"result": None}, "c": {"result": {"checks": [{"ok": False}, "not a dict"]}}, "d": {"result": [1]}}
    assert runner.failed_checks(parts) == ["a: y", "c: ?", "c: not a dict"]


def test_command_line_options() -> None:
    args = runner.parse_args(["--out", "o", "--device", "cpu", "--tiny", "--parts", "a, d", "--cap", "d=12.5",
                              "--no-compile", "--budget", "100"])
    opts = runner.options_from_args(args, "cmd")
    assert (opts.device, opts.tiny, opts.parts, opts.caps, opts.compile, opts.budget) == \
        ("cpu", True, ("a", "d"), {"d": 12.5}, False, 100.0)
    assert opts.command == "cmd" and opts.out_dir == Path("o")
    for bad in (["--cap", "d"], ["--cap", "d=soon"], ["--cap", "z=3"], ["--parts", "a,x"], ["--device", "tpu"]):
        with pytest.raises(ValueError):
            runner.options_from_args(runner.parse_args(["--out", "o", *bad]), "cmd")


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--out", str(tmp_path), "--parts", "q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check.py: unknown part(s) q") and err.count("\n") == 1


def test_cuda_where_there_is_none_is_refused_before_any_part(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(runner, "_cuda_available", lambda: False)
    assert runner.main(["--out", str(tmp_path / "out"), "--device", "cuda:1"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "--device cpu --tiny" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing run, nothing written


def test_one_line() -> None:
    assert runner.one_line(ValueError("a\nb")) == "ValueError: a"
    assert runner.one_line(KeyError()) == "KeyError"


@pytest.mark.slow
@pytest.mark.integration
def test_the_whole_check_runs_on_the_cpu_with_tiny_sizes(tmp_path: Path) -> None:
    """``make gpu-check ARGS="--device cpu --tiny"``, the command a GPU machine runs (each part in its own process):
    every part ends ok, every correctness figure is within its tolerance, and the summary is written. CI runs the
    check here only (60-70 s on a 2-core Zen 3), so that it cannot rot between GPU runs."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed: run benchmarks/gpu_check.py --device cpu --tiny by hand")
    run = subprocess.run(["make", "--no-print-directory", "gpu-check", f"OUT={tmp_path}", "ARGS=--device cpu --tiny"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    code = run.returncode
    assert (tmp_path / runner.JSON_NAME).is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / runner.JSON_NAME).read_text())
    assert set(report) >= {"schema", "environment", "parts", "failed_checks", "problems", "ok", "total_s"}
    assert list(report["parts"]) == list(PARTS)
    for name, part in report["parts"].items():
        assert set(part) >= {"title", "status", "seconds", "cap_s", "error", "result"}, name
    assert {k: p["status"] for k, p in report["parts"].items()} == dict.fromkeys(PARTS, "ok"), report["problems"]
    assert report["failed_checks"] == [] and report["ok"] is True and code == 0
    a = report["parts"]["a"]["result"]
    assert len(a["forward"]) == 7 and all(r["ok"] for r in a["forward"] + a["gradients"] + a["amp_training"])
    assert all(r["fp32_logprob_rel"] <= a["tolerances"]["fp32_rel"] for r in a["forward"])
    assert a["gpu_tests"]["status"] == "ok" and a["gpu_tests"]["skipped"] > 0  # no CUDA here: they skip
    b = report["parts"]["b"]["result"]
    assert {(r["model"], r["mode"]): r["status"] for r in b["rows"]} == {
        ("base", "bf16"): "ok", ("large", "bf16"): "ok", ("base", "tf32"): "ok", ("large", "tf32"): "ok",
        ("base", "bf16-compile"): "skipped", ("large", "bf16-compile"): "skipped",  # --tiny: no compiling
        ("base", "bf16-explicit"): "ok", ("base", "bf16-flex"): "skipped"}  # flex: its backward needs CUDA
    # MFU > 0 only: tiny rows beside the rest of the suite time too little for the share (full sizes check <= 1)
    assert all(r["tok_per_s"] > 0 and r["mfu"] > 0 for r in b["rows"] if r["status"] == "ok")
    assert len(report["parts"]["c"]["result"]["rows"]) == 4
    d = report["parts"]["d"]["result"]["rows"][0]
    assert d["same_tokens"].split("/")[0] == d["same_tokens"].split("/")[1] and 0 < d["share"] <= 1
    md = (tmp_path / runner.MD_NAME).read_text()
    assert "all parts ok" in md and all(f"## {p}. " in md for p in PARTS)
