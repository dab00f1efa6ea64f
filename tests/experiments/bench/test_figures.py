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
    with pytest.raises(ConfigError, match="not a txl bench, bench generate, quality or decode-kernels report"):
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
