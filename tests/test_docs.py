"""The user documentation: written by topic (no project history in it), its tested examples run as printed, and
the site builds with ``mkdocs build --strict`` with every public name in the API reference.

A fenced code block preceded by the line ``<!-- tested -->`` is run by these tests: the blocks of one page in
order, in one temporary directory, ``bash`` blocks with ``bash -euo pipefail`` and ``python`` blocks with this
interpreter, ``txl`` on the ``PATH`` and one thread (``tests.helpers.subprocess_env``)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, subprocess_env
from tests.test_public_api import MODULES

MARK = "<!-- tested -->"
FENCE = re.compile(r"^" + re.escape(MARK) + r"\n```(python|bash)\n(.*?)^```$", re.M | re.S)

#: History has no place in user docs (it belongs in CHANGELOG.md): issue numbers, work rounds, task items.
HISTORY = re.compile(
    r"\bissues? ?#?\d+|\bpre-issue|\bitems? \d+\b|\b(?:round|pass|session) (?:\d+|one|two|three)\b"
    r"|\b(?:first|second|third|previous|this|next|last|final) (?:round|pass|session)\b|\bthe lead\b",
    re.I)


def user_docs() -> list[Path]:
    """README, CONTRIBUTING (shown on the site) and every page under ``docs/``."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def marked_blocks(page: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of each block of ``page`` marked to be run."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def history_lines(text: str) -> list[str]:
    """The lines of ``text`` that speak of the project's history rather than of its use."""
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


def test_history_patterns() -> None:
    """The scanner finds what it is meant to find, and leaves ordinary words alone."""
    for line in ("as issue 23 asked", "(issue #5)", "issues 25 and 26", "item 4: blocks", "the pre-issue-17 run",
                 "Second round: int8", "in this session", "the lead's run", "round 2 (below)"):
        assert history_lines(line), line
    for line in ("5 rounds of 2 segments", "alternating rounds", "the first evaluation round", "a one-round thing",
                 "kill-and-resume", "items of a list", "one pass over the whole sequence"):
        assert not history_lines(line), line


def test_user_docs_tell_no_history() -> None:
    found = {str(p.relative_to(REPO)): history_lines(p.read_text(encoding="utf-8")) for p in user_docs()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"project history in user docs (move it to CHANGELOG.md): {found}"


def run_blocks(blocks: list[tuple[str, str]], cwd: Path, **env_extra: str) -> None:
    env = subprocess_env(cwd, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                         **env_extra)
    for i, (lang, code) in enumerate(blocks):
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"block {i + 1} ({lang}) failed:\n{code}\n--- stderr:\n{out.stderr[-3000:]}"


@pytest.mark.integration
@pytest.mark.slow
def test_getting_started_runs_as_printed(tmp_path: Path) -> None:
    blocks = marked_blocks(REPO / "docs" / "getting-started.md")
    code = "\n".join(c for _, c in blocks)
    assert {lang for lang, _ in blocks} == {"bash", "python"} and "txl train" in code and "generate" in code
    run_blocks(blocks, tmp_path)
    assert (tmp_path / "runs" / "first" / "best" / "model.safetensors").is_file()


@pytest.mark.integration
def test_readme_example_runs_as_printed(tmp_path: Path) -> None:
    blocks = marked_blocks(REPO / "README.md")
    assert [lang for lang, _ in blocks] == ["python"]
    assert len([line for line in blocks[0][1].splitlines() if line.strip()]) <= 12  # a short example
    run_blocks(blocks, tmp_path)


@pytest.mark.integration
def test_the_site_builds_strict_with_the_whole_public_api(tmp_path: Path) -> None:
    """``mkdocs build --strict`` (a broken link or an unresolved reference fails it), and every name the package
    exports has its entry (an HTML anchor) in the API reference."""
    pytest.importorskip("mkdocs", reason="the docs extra (make docs installs it)")
    site = tmp_path / "site"
    env = subprocess_env(tmp_path, NO_MKDOCS_2_WARNING="1")  # without Material's end-of-life banner
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    html = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [f"{m}.{name}" for m in MODULES for name in importlib.import_module(m).__all__  # re-exports: once
               if name != "__version__" and not any(f'id="{home}.{name}"' in html for home in MODULES)]
    assert not missing, f"the API reference lacks {missing}"
    roles = re.findall(r":[a-z]+:<code>[^<]*</code>", html)  # docstrings' reST roles, shown raw without the hook
    assert not roles, f"roles left as literal text in the API reference: {roles[:3]}"
    assert 'class="autorefs autorefs-internal"' in html and "<code>transformer_xl.data.Vocab</code></a>" in html
    # long code lines: the site's stylesheet, on every page, widens the page and shows code blocks' scrollbars
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"\.md-grid\s*{[^}]*max-width", css) and re.search(r"pre > code[^{]*{[^}]*overflow-x: auto", css)
    for page in (site / "index.html", site / "api" / "index.html", site / "harness-and-scoring" / "index.html"):
        assert "stylesheets/extra.css" in page.read_text(encoding="utf-8"), page


@pytest.mark.parametrize("script", ["bench_int8_choice.py", "bench_int8_path.py"])
def test_generated_tables_are_those_their_result_files_give(script: str, tmp_path: Path) -> None:
    """A table between a script's markers in the docs is what ``script --table`` makes of the result files now:
    figures are written from the results, never by hand (``script --docs`` rewrites it)."""
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--table"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env=subprocess_env(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    page = (REPO / "docs" / "generation-speed.md").read_text(encoding="utf-8")
    start = re.search(rf"<!-- [^>]*generated by benchmarks/{re.escape(script)} --docs -->\n", page)
    assert start is not None, f"no table of {script} in docs/generation-speed.md"
    assert page[start.end():].startswith(out.stdout)


def test_the_popgym_tables_are_what_their_run_files_give() -> None:
    """The POPGym tables of the agents page (suite, speed, settings) are what ``popgym_ppo.py --docs`` makes of the
    committed run files."""
    from transformer_xl.experiments import popgym_report

    page = (REPO / "docs" / "agents.md").read_text(encoding="utf-8")
    for name, text in popgym_report.blocks(REPO / "benchmarks" / "results" / "popgym").items():
        start, end = popgym_report._marker(name)
        assert f"{start}\n{text}{end}\n" in page, f"docs/agents.md: the {name} is not what its run files give"


#: A path of the machine a page was written on: a user's machine has none of these folders.
MACHINE_PATH = re.compile(r"/work/|/home/|/root/|/Users/|\.\./shared/")


def test_user_docs_name_no_folder_of_the_machine_they_were_written_on() -> None:
    """Commands in the docs run on the reader's machine: no absolute path of ours (``/work/...``, a home folder)
    nor our sibling data folder; a placeholder or the package's default stands in for such a folder."""
    found = {str(p.relative_to(REPO)): [line.strip() for line in p.read_text(encoding="utf-8").splitlines()
                                        if MACHINE_PATH.search(line)] for p in user_docs()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"paths of the writer's machine in user docs: {found}"


#: ``pip install transformer-xl[...]``: the distribution is not on the package index, so such a line fails.
FROM_INDEX = re.compile(r"""pip install +(?:-\S+ +)*['"]?transformer[-_]xl\b(?![-_.\w]*\.whl)""", re.I)
#: A line the program prints (``txl train: error: ...``): its text comes from the source, quoted as printed.
PRINTED_ERROR = re.compile(r"^\S+(?: \S+)?: error: ")


def test_install_commands_name_the_checkout_or_a_wheel() -> None:
    """txl is installed from a clone (``pip install -e '.[serve]'``) or a wheel built from one, never by its name
    from the package index, where it is not."""
    for line in ("pip install 'transformer-xl[serve]'", 'pip install "transformer-xl[hub]"',
                 "pip install -U transformer-xl", "`pip install transformer_xl[plot]`"):
        assert FROM_INDEX.search(line), line
    for line in ("pip install -e '.[serve]'", "pip install 'dist/transformer_xl-VERSION-py3-none-any.whl[eval]'",
                 "pip install torch==2.13.0", "the distribution is `transformer-xl`"):
        assert not FROM_INDEX.search(line), line
    found = {str(p.relative_to(REPO)): [line.strip() for line in p.read_text(encoding="utf-8").splitlines()
                                        if FROM_INDEX.search(line) and not PRINTED_ERROR.match(line)]
             for p in user_docs()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"install commands that ask the package index for txl: {found}"


def marked_files(page: Path) -> dict[str, str]:
    """The blocks of ``page`` preceded by ``<!-- file: PATH -->``: the files a worked example has the reader write."""
    block = re.compile(r"^<!-- file: (\S+) -->\n```\w*\n(.*?)^```$", re.M | re.S)
    return {m.group(1): m.group(2) for m in block.finditer(page.read_text(encoding="utf-8"))}


@pytest.mark.integration
@pytest.mark.slow
def test_the_local_harness_task_runs_as_printed(tmp_path: Path) -> None:
    """The harness page's task over a local text file: its text file and YAML written as printed, its command run as
    printed (the harness's command line, offline) against a tiny model standing in for ``run``; the harness reads one
    document per paragraph, counts the words of the text, and logs for each document ``txl score --documents``'
    total."""
    pytest.importorskip("lm_eval")
    from tests.helpers import eval_model
    from transformer_xl.data import Vocab

    page = REPO / "docs" / "harness-and-scoring.md"
    files = marked_files(page)
    assert any(p.endswith(".yaml") for p in files) and any(p.endswith(".txt") for p in files), files
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content, encoding="utf-8")
    text_file, text = next((p, c) for p, c in files.items() if p.endswith(".txt"))
    words = sorted(set(text.split()))
    vocab = Vocab(["<eos>", "<unk>", *words[: len(words) * 9 // 10]], special=["<eos>", "<unk>"], eos="<eos>",
                  unk="<unk>")  # a tenth of the words left out: some are <unk>
    eval_model(n_token=len(vocab), tgt_len=8, mem_len=8, init_std=0.3).save_pretrained(tmp_path / "run", vocab=vocab)
    blocks = marked_blocks(page)
    assert [lang for lang, _ in blocks] == ["bash"] and "txl-lm-eval" in blocks[0][1], blocks
    code = blocks[0][1]
    assert "--output_path" in code and "--log_samples" in code
    run_blocks(blocks, tmp_path, HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    out = re.search(r"--output_path (\S+)", code).group(1)
    samples = [json.loads(line) for path in (tmp_path / out).rglob("samples_*.jsonl")
               for line in path.read_text(encoding="utf-8").splitlines()]
    samples.sort(key=lambda s: s["doc_id"])
    documents = [d for d in text.split("\n\n") if d.strip()]
    assert len(samples) == len(documents) >= 2
    assert sum(s["word_perplexity"][1] for s in samples) == len(text.split())  # words of the text, no more
    scored = subprocess.run([sys.executable, "-m", "transformer_xl", "score", "run", text_file, "--documents"],
                            cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(tmp_path), timeout=120)
    assert scored.returncode == 0, scored.stderr[-2000:]
    totals = [json.loads(line)["total_log_prob"] for line in scored.stdout.splitlines()]
    assert [float(s["resps"][0][0]) for s in samples] == pytest.approx(totals, rel=0, abs=1e-5)


def sh_lines(markdown: str) -> list[str]:
    """The command lines of the ``sh`` blocks of ``markdown``, without their comments."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", markdown, re.M | re.S)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_site_home_page_has_the_quick_start_of_the_readme() -> None:
    """The site's home page starts the reader off as the README does: ``make demo``, ``make test``, the clone, and
    the first ``txl`` commands on the demo's run."""
    home = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", home, re.M | re.S)
    assert section, "docs/index.md has no Quick start section"
    quick = sh_lines(section.group(1))
    readme_quick = sh_lines(re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.M | re.S).group(1))
    assert {"make demo", "make test"} <= set(quick) & set(readme_quick)
    assert any(line.startswith("txl ") and "runs/demo" in line for line in quick), quick
    assert "getting-started.md#install" in section.group(1)
