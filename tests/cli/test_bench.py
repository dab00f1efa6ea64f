"""txl bench: a tiny case end to end (JSON report, Markdown rows with the command) and one-line errors."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from tests.helpers import one_line_error
from transformer_xl import TXLConfig
from transformer_xl.cli import main

TINY = dict(n_token=30, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6)


@pytest.fixture
def tiny_case(monkeypatch):
    """A ``tiny`` benchmark case; a fixed matmul peak (its measurement takes longer than the whole case) and no
    Hugging Face (the tests use --no-hf; importing transformers would take seconds)."""
    from transformer_xl.experiments import bench
    from transformer_xl.experiments.bench import report

    monkeypatch.setitem(bench.CASES, "tiny", (lambda: TXLConfig(**TINY), 2))
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):  # (make test-avx2 sets them)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(report, "gemm_peaks", lambda device: {"fp32": 1e9, "bf16": 2e9, "bf16_gemm": 2e9})
    monkeypatch.setattr(report, "hf_available", lambda: False)


def test_smoke_bench_writes_json_and_markdown_with_the_command(tiny_case, tmp_path, monkeypatch, capsys) -> None:
    out_json, out_md = tmp_path / "out" / "bench.json", tmp_path / "bench.md"
    out_md.write_text("earlier results\n", encoding="utf-8")
    argv = ["bench", "--cases", "tiny", "--eval-mem-lens", "4,8", "--no-hf", "--no-memory", "--steps", "1",
            "--repeats", "1", "--threads", "1", "--json", str(out_json), "--markdown", str(out_md)]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/txl", *argv])  # as the console script sees it
    assert main(argv) == 0
    command = shlex.join(["txl", *argv])

    report = json.loads(out_json.read_text(encoding="utf-8"))
    assert report["command"] == command
    opts = report["options"]
    assert opts["cases"] == ["tiny"] and opts["eval_mem_lens"] == [4, 8] and opts["steps"] == 1
    assert opts["repeats"] == 1 and opts["hf"] is False and opts["memory"] is False and opts["threads"] == 1
    (res,) = report["results"]
    assert res["case"] == "tiny" and res["batch_size"] == 2 and res["hf"] is False and "memory" not in res
    assert res["config"]["n_token"] == 30 and set(res["eval"]) == {"4", "8"}
    assert res["train"]["txl"]["tok_per_s"] > 0 and "hf" not in res["train"] and "ratio" not in res["train"]

    md = out_md.read_text(encoding="utf-8")
    assert md.startswith("earlier results\n")  # appended
    rows = [line for line in md.splitlines() if line.startswith("| tiny |")]
    assert [r.split(" | ")[1] for r in rows] == ["train tok/s", "eval tok/s, mem 4", "eval tok/s, mem 8"]
    assert all(r.endswith(f"| `{command}` |") for r in rows)
    stdout = capsys.readouterr().out
    assert "[tiny] train: txl" in stdout and rows[0] in stdout  # the log and the table


def test_bench_batch_size_and_python_command(tiny_case, tmp_path, monkeypatch) -> None:
    """Run as ``python -m transformer_xl`` without ``bench`` in sys.argv, the command recorded is the Python one,
    after the variables that held the kernels to another instruction set."""
    monkeypatch.setattr(sys, "argv", ["x.py", "--flag"])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    argv = ["bench", "--cases", "tiny", "--eval-mem-lens", "4", "--no-hf", "--no-memory", "--steps", "1",
            "--repeats", "1", "--batch-size", "4", "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert report["command"] == "ONEDNN_MAX_CPU_ISA=AVX2 python x.py --flag"
    assert report["results"][0]["batch_size"] == 4 and report["options"]["batch_size"] == 4
    assert not (tmp_path / "bench.md").exists()


@pytest.mark.parametrize("value, message", [
    ("128,abc", "--eval-mem-lens must be a comma-separated list of integers, got '128,abc'"),
    ("-4", "--eval-mem-lens values must be >= 0, got -4"),
    ("", "--eval-mem-lens must be a comma-separated list of integers"),
])
def test_bad_eval_mem_lens_is_a_one_line_error(tmp_path, capsys, value: str, message: str) -> None:
    out_json = tmp_path / "r.json"
    assert main(["bench", "--eval-mem-lens", value, "--no-hf", "--json", str(out_json)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("txl bench: error: ") and message in err and len(err.splitlines()) == 1
    assert captured.out == "" and not out_json.exists()  # nothing was run


def test_unknown_case_is_a_one_line_error(tiny_case, capsys) -> None:
    assert main(["bench", "--cases", "tiny,nope", "--eval-mem-lens", "4", "--no-hf", "--no-memory",
                 "--steps", "1", "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txl bench: error: unknown benchmark case 'nope'") and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag", ["--steps", "--repeats", "--threads", "--batch-size"])
def test_zero_counts_are_refused_before_anything_runs(capsys, flag: str) -> None:
    assert main(["bench", "--no-hf", flag, "0"]) == 2
    assert f"argument {flag}: expected a positive integer, got '0'" in one_line_error(capsys, "txl bench: error: ")


def test_eval_mem_lens_none_times_training_only(tiny_case, tmp_path, capsys) -> None:
    out_json = tmp_path / "bench.json"
    argv = ["bench", "--cases", "tiny", "--eval-mem-lens", "none", "--no-hf", "--no-memory", "--steps", "1",
            "--repeats", "1", "--threads", "1", "--json", str(out_json)]
    assert main(argv) == 0
    (res,) = json.loads(out_json.read_text(encoding="utf-8"))["results"]
    assert res["eval"] == {} and res["train"]["txl"]["tok_per_s"] > 0
    assert "[tiny] warm-up, 2 training steps (compilation included): txl " in capsys.readouterr().out


def test_a_share_above_the_limit_is_refused_not_printed(tiny_case, tmp_path, monkeypatch, capsys) -> None:
    """A GEMM peak the model beats (a wrong yardstick): one line, non-zero exit, no table and no JSON."""
    from transformer_xl.experiments.bench import report

    monkeypatch.setattr(report, "gemm_peaks", lambda device: {"fp32": 1.0, "bf16": 1.0, "bf16_gemm": 1.0})
    out_json = tmp_path / "r.json"
    argv = ["bench", "--cases", "tiny", "--eval-mem-lens", "none", "--no-hf", "--no-memory", "--steps", "1",
            "--repeats", "1", "--json", str(out_json)]
    assert main(argv) != 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "tiny txl training MFU" in err and "above 100 %" in err and len(err.splitlines()) == 1
    assert "| tiny |" not in captured.out and not out_json.exists()
