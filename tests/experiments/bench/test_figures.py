"""The tables of figures in the docs are rendered from the result files, and the committed pages are up to date."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.experiments.bench import figures

REPO = Path(__file__).resolve().parents[3]
QUALITY = {"batch": 2, "mem_len": 8, "tokens": 30, "command": "txl bench generate --quality m --json /tmp/q.json "
           "--markdown /tmp/q.md", "variants": {"captured": {"loss": 1.5, "ppl": 4.4817, "ppl_cost": 0.0,
                                                              "seconds": 3.0}}}


def _tree(tmp_path: Path, report: dict) -> Path:
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "q.json").write_text(json.dumps(report), encoding="utf-8")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("Prose.\n\n<!-- figures: benchmarks/results/q.json -->\nold table\n"
                                               "<!-- /figures -->\n\nMore prose.\n", encoding="utf-8")
    return tmp_path


def test_the_committed_pages_are_what_their_result_files_render() -> None:
    assert figures.update_pages(REPO, check=True) == [], "run `make figures` and commit the pages"


def test_a_block_is_rendered_from_its_file_with_the_committed_command(tmp_path: Path) -> None:
    root = _tree(tmp_path, QUALITY)
    page = root / "docs" / "page.md"
    assert figures.update_pages(root, check=True) == [page] and "old table" in page.read_text()  # check: no write
    assert figures.update_pages(root) == [page]
    text = page.read_text()
    assert text.startswith("Prose.\n\n<!-- figures: benchmarks/results/q.json -->\n`txl bench generate --quality m "
                           "--json benchmarks/results/q.json`: 30 tokens scored")
    assert "| captured | 1.50000 | 4.482 | +0.000% | 3 |\n<!-- /figures -->\n\nMore prose.\n" in text
    assert figures.update_pages(root) == []  # rendered once, stable


def test_a_file_without_a_command_or_of_no_known_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no command recorded"):
        figures.render("benchmarks/results/q.json", _tree(tmp_path, {**QUALITY, "command": ""}))
    (tmp_path / "benchmarks" / "results" / "q.json").write_text(json.dumps({"command": "txl x"}))
    with pytest.raises(ConfigError, match="not a txl bench, bench generate, bench decode, quality, decode-kernels"):
        figures.render("benchmarks/results/q.json", tmp_path)
    with pytest.raises(ConfigError, match="cannot read a result file"):
        figures.render("benchmarks/results/missing.json", tmp_path)


def test_every_kind_of_committed_result_renders_as_the_bench_prints_it() -> None:
    from transformer_xl.experiments.bench.generate import to_markdown

    path = "benchmarks/results/generate_cpu_1t.json"
    report = json.loads((REPO / path).read_text())
    assert figures.render(path, REPO) == to_markdown(report, figures._command(report, path))
    assert figures.render("benchmarks/results/cpu_fp32.json", REPO).startswith("Device: ")


def test_the_script_checks_and_renders_pages(tmp_path: Path) -> None:
    root = _tree(tmp_path, QUALITY)
    script = [sys.executable, str(REPO / "benchmarks" / "render_docs.py"), "--root", str(root)]
    out = subprocess.run([*script, "--check"], capture_output=True, text=True, check=False)
    assert out.returncode == 1 and out.stdout == "out of date: docs/page.md\n"
    (root / "benchmarks" / "results" / "q.json").write_text("{}")
    out = subprocess.run(script, capture_output=True, text=True, check=False)
    assert out.returncode == 2 and out.stderr.startswith("render_docs: benchmarks/results/q.json: no command")


MACHINE = {"cpu": "AMD EPYC", "cpu_flags": ["avx2"], "threads": 2, "load_average": "0.50 0.40 0.30"}


def test_the_decode_kernels_and_compile_time_reports_render_one_row_per_case() -> None:
    row = {"case": "wt103-base:640:1:int8", "shape": "wt103-base", "n_token": 33278, "mem_len": 640, "batch": 1,
           "int8": True, "target": 0.75, "plain_step_s": {"best": 0.0123},
           "captured": {"best_s": 0.004, "bytes": {"total": 78_400_000}, "tok_per_s": 250.0,
                        "share_of_read_rate": 0.5}}
    report = {"machine": MACHINE, "torch": "2.13.0+cpu", "clock": "wall", "read_rate_bytes_per_s": 39.2e9,
              "read_rate_4k_pages_bytes_per_s": 30.1e9, "load_average_after": "1.00 0.50 0.40",
              "rows": [row, {**row, "int8": False, "target": None}]}
    text = figures.decode_kernels_markdown(report, "python benchmarks/decode_kernels.py --threads 2")
    assert "best read rate of the run 39.2 GB/s on huge pages, 30.1 GB/s on 4 KiB pages" in text
    assert "load average 0.50 0.40 0.30 before, 1.00 0.50 0.40 after" in text
    assert text.endswith("| wt103-base | 33,278 | 640 | 1 | int8, bf16 ring | 78.4 | 12.3 | 4.00 | 250 | 50% | 75% |\n"
                         "| wt103-base | 33,278 | 640 | 1 | fp32 | 78.4 | 12.3 | 4.00 | 250 | 50% | – |")
    compile_report = {"machine": MACHINE, "torch": "2.13.0+cpu", "rows": [{"case": "demo:128:1", "cold_s": 41.26,
                                                                           "warm_s": 2.04}]}
    text = figures.compile_time_markdown(compile_report, "python benchmarks/compile_time.py")
    assert text.endswith("| demo:128:1 | 41.3 | 2.0 |") and "load average 0.50 0.40 0.30 before" in text
