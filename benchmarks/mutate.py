"""Mutation testing of one module (or package folder) with mutmut, against that module's tests only.

``make mutate MODULE=src/transformer_xl/train/resume.py`` runs this script. It copies the sources, the tests and
``pyproject.toml`` (with a ``[tool.mutmut]`` section naming the module and its tests) into a scratch folder,
``.mutation/<module>/``, runs ``mutmut run`` there (mutmut copies them once more into ``mutants/``, changes one
expression at a time and runs, for each change, the tests that reach the function it is in), and counts the
outcomes from mutmut's own ``.meta`` files. The counts go to ``benchmarks/results/mutation/<module>.json`` under
a label (``after`` by default; ``--ref main --label before`` measures the module and its tests as they are at a
git revision); ``docs/mutation-testing.md`` renders them (``--table``).

The tests run are the module's mirror test module (``src/transformer_xl/a/b.py`` -> ``tests/a/test_b.py``; every
mirror module of a package folder) plus the related ones listed in :data:`RELATED`; ``--tests`` (``make mutate
TESTS=...``) replaces that list. An equivalent mutant (a change no test can tell apart, e.g. a default that the
only caller always overrides) is marked on its line with ``# pragma: no mutate`` and a one-line reason: mutmut
then makes no mutant of that line, and the marks are counted as ``equivalent``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "mutation"
SCRATCH = REPO / ".mutation"
PRAGMA = re.compile(r"#\s*pragma:\s*no mutate")

#: Tests beyond the mirror module that reach a module in-process through the user's path (its CLI, a caller).
#: Tests that run ``txl`` in a subprocess are left out: mutmut picks each mutant's tests by the functions they
#: reached while it watched them in its own process, and sees nothing of a subprocess.
RELATED: dict[str, list[str]] = {
    "src/transformer_xl/train/resume.py": ["tests/cli/test_train.py"],
    "src/transformer_xl/data/fetch.py": ["tests/data/test_hub.py", "tests/cli/test_data.py"],
    "src/transformer_xl/data/hub.py": ["tests/data/test_fetch.py"],
    "src/transformer_xl/interop/hub.py": ["tests/interop/test_hf.py"],
    "src/transformer_xl/inference/captured.py": ["tests/inference/test_generate.py"],
    "src/transformer_xl/store": ["tests/train/test_resume.py"],
    "src/transformer_xl/store/checkpoint.py": ["tests/train/test_resume.py"],
    "src/transformer_xl/store/layout.py": ["tests/train/test_resume.py"],
    "src/transformer_xl/inference/lines.py": ["tests/inference/test_score.py", "tests/cli/test_score.py"],
    "src/transformer_xl/inference/score.py": ["tests/cli/test_score.py", "tests/integrations/test_harness.py"],
    "src/transformer_xl/integrations/harness.py": ["tests/inference/test_score.py"],
    "src/transformer_xl/train/loggers.py": ["tests/train/test_metrics.py"],
    # the captured step packs and multiplies its weights with int8.py's functions (pack_linear, linear)
    "src/transformer_xl/model/int8.py": ["tests/inference/test_decode.py"],
    # the HTTP API's tests: the openai client against a server on a thread of the test process
    "src/transformer_xl/serve/completions.py": ["tests/serve/test_app.py"],
    # the captured step is decode.py's step compiled: test_captured.py runs it eagerly against the plain step
    "src/transformer_xl/inference/decode.py": ["tests/inference/test_captured.py"],
    "src/transformer_xl/inference/packing.py": ["tests/inference/test_decode.py", "tests/inference/test_captured.py"],
}
#: Tests left out of the mutation runs: each takes close to a minute on two cores and would run again for every
#: mutant that survives the others. ``torch.compile`` of the captured step: what it compiles is
#: ``inference/decode.py``'s step, tested eagerly by the rest of ``test_captured.py``.
DESELECT = ["tests/inference/test_captured.py::test_compiled_step_equals_the_plain_step",
            # the harness's command line and killed or torchrun training runs: subprocesses mutmut cannot see
            "tests/integrations/test_harness.py::test_the_harness_command_line_reports_txl_scores",
            "tests/train/test_loggers.py::test_a_killed_and_resumed_run_shows_every_step_once_with_the_metrics_jsonl_value",
            "tests/train/test_loggers.py::test_under_torchrun_only_rank_0_logs"]
RECHECKED = "working tree (survivors rechecked)"
#: Files some tests read besides ``src/`` and ``tests/`` (the precision rule is checked against the bench's results).
DATA = ["benchmarks/results"]
#: Outcomes as mutmut's exit codes name them, gathered into the columns reported.
COLUMNS = ("killed", "survived", "timeout", "no_tests", "suspicious", "not_checked")


def mirror_tests(module: str) -> list[str]:
    """``tests/a/test_b.py`` for ``src/transformer_xl/a/b.py``; every such module for a package folder."""
    path = REPO / module
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    out = []
    for f in files:
        rel = f.relative_to(REPO / "src" / "transformer_xl")
        if rel.name == "__init__.py":
            continue
        test = Path("tests") / rel.parent / f"test_{rel.name}"
        if (REPO / test).is_file():
            out.append(str(test))
    return out


def tests_for(module: str) -> list[str]:
    return mirror_tests(module) + [t for t in RELATED.get(module.rstrip("/"), []) if t not in mirror_tests(module)]


def _populate(scratch: Path, ref: str | None) -> None:
    """``src/``, ``tests/`` and ``pyproject.toml`` from the working tree, or from git revision ``ref``."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if ref is None:
        for name in ("src", "tests", *DATA):
            shutil.copytree(REPO / name, scratch / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(REPO / "pyproject.toml", scratch / "pyproject.toml")
        return
    tar = subprocess.run(["git", "archive", "--format=tar", ref, "src", "tests", "pyproject.toml", *DATA], cwd=REPO,
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as tf:
        tf.extractall(scratch, filter="data")


def _configure(scratch: Path, module: str, tests: list[str]) -> None:
    deselect = [arg for test in DESELECT if (scratch / test.split("::")[0]).is_file() for arg in ("--deselect", test)]
    pattern = module.rstrip("/") + ("/*" if (scratch / module).is_dir() else "")
    section = (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"also_copy = {json.dumps(DATA)}\n"
        f"only_mutate = {json.dumps([pattern])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        f"pytest_add_cli_args = {json.dumps(['-p', 'no:cacheprovider', '-m', 'not slow', *deselect])}\n"
        'process_isolation = "forkserver"\n'  # torch in the test process: fork each mutant from a clean server
    )
    with open(scratch / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(section)


def count(scratch: Path, module: str, marks_from: Path | None = None) -> dict[str, int]:
    """Outcomes from mutmut's ``mutants/<file>.meta`` files, and the ``# pragma: no mutate`` marks: ``equivalent``,
    or ``left_out`` when the reason says "left out" (a mutant only a test too slow to repeat per mutant can catch,
    such as one that compiles). Each mark counts once, however many mutants its line or block would give."""
    from mutmut.stats import status_by_exit_code

    counts = dict.fromkeys(COLUMNS, 0)
    src = scratch / module
    files = sorted(src.rglob("*.py")) if src.is_dir() else [src]
    for f in files:
        meta = scratch / "mutants" / f"{f.relative_to(scratch)}.meta"
        if meta.is_file():
            for code in json.loads(meta.read_text())["exit_code_by_key"].values():
                status = status_by_exit_code[code].replace(" ", "_")
                status = {"segfault": "killed", "caught_by_type_check": "killed",
                          "check_was_interrupted_by_user": "not_checked"}.get(status, status)
                if status != "skipped":  # a recheck found its line marked since: not a mutant any more
                    counts[status] += 1
    marks = []  # each mark with the line above it (where a reason too long for the line goes)
    for f in [(marks_from or scratch) / f.relative_to(scratch) for f in files]:
        lines = ["", *f.read_text().splitlines()]
        marks += [lines[i - 1] + lines[i] for i in range(1, len(lines)) if PRAGMA.search(lines[i])]
    counts["left_out"] = sum("left out" in text for text in marks)
    counts["equivalent"] = len(marks) - counts["left_out"]
    return counts


def score(c: dict[str, int]) -> float | None:
    """Killed (a timeout counts: the change hung the tests) over every mutant tried; equivalent ones are not made."""
    tried = sum(c[k] for k in COLUMNS)
    return round(100.0 * (c["killed"] + c["timeout"]) / tried, 1) if tried else None


def survivors(scratch: Path) -> list[str]:
    out = subprocess.run([str(Path(sys.executable).parent / "mutmut"), "results"], cwd=scratch,
                         capture_output=True, text=True).stdout
    return [ln.split(":")[0].strip() for ln in out.splitlines() if ln.strip().endswith(("survived", "no tests"))]


def recheck(module: str, tests: list[str], label: str) -> dict:
    """Run the survivors of the last run (``label``) again against the current tests, without making the mutants
    again: each through mutmut's own switch (``MUTANT_UNDER_TEST``) in its ``mutants/`` copy. A survivor whose
    line has been marked ``# pragma: no mutate`` since is dropped (mutmut's "skipped")."""
    import mutmut

    scratch = SCRATCH / slug(module) / label
    mutants = scratch / "mutants"
    if not mutants.is_dir():
        raise SystemExit(f"make mutate: no earlier run in {scratch} to recheck")
    src = REPO / module
    for f in sorted(src.rglob("*.py")) if src.is_dir() else [src]:  # the mutants are of the code as it was then
        then = scratch / f.relative_to(REPO)
        if not then.is_file() or ast.dump(ast.parse(then.read_text())) != ast.dump(ast.parse(f.read_text())):
            raise SystemExit(f"make mutate: {f.relative_to(REPO)} changed since the run in {scratch} (more than its "
                             "comments): run it whole again")
    shutil.rmtree(mutants / "tests")
    shutil.copytree(REPO / "tests", mutants / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for name in DATA:
        shutil.copytree(REPO / name, mutants / name, dirs_exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": "src"}
    deselect = [a for t in DESELECT if (mutants / t.split("::")[0]).is_file() for a in ("--deselect", t)]
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", *deselect, *tests]
    mutmut_bin = str(Path(sys.executable).parent / "mutmut")
    for f in sorted(src.rglob("*.py")) if src.is_dir() else [src]:
        meta_path = mutants / f"{f.relative_to(REPO)}.meta"
        if not meta_path.is_file():
            continue
        meta = json.loads(meta_path.read_text())
        lines, marked = f.read_text().splitlines(), []
        for i, ln in enumerate(lines):
            if PRAGMA.search(ln):  # the line, and for "no mutate block" the lines indented under it
                marked.append(ln.split("  #")[0].strip())
                indent = len(ln) - len(ln.lstrip())
                for nxt in lines[i + 1:] if "no mutate block" in ln else []:
                    if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                        break
                    marked.append(nxt.split("  #")[0].strip())
        for name, code in meta["exit_code_by_key"].items():
            if code not in (0, 5, 33):
                continue
            diff = subprocess.run([mutmut_bin, "show", name], cwd=scratch, capture_output=True, text=True).stdout
            old = [ln[1:].split("  #")[0].strip() for ln in diff.splitlines()
                   if ln.startswith("-") and not ln.startswith("---")]
            if old and any(o in marked for o in old):
                meta["exit_code_by_key"][name] = 34  # its line is marked now: no such mutant any more
                continue
            try:
                rc = subprocess.run(cmd, cwd=mutants, env={**env, "MUTANT_UNDER_TEST": name}, capture_output=True,
                                    timeout=600).returncode
            except subprocess.TimeoutExpired:
                rc = 36
            meta["exit_code_by_key"][name] = {5: 33}.get(rc, rc)
            print(f"  recheck {name}: {'survived' if rc == 0 else 'no tests' if rc == 5 else 'killed'}", flush=True)
        meta_path.write_text(json.dumps(meta))
    counts = count(scratch, module, marks_from=REPO)  # the marks as they are now
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    return {**counts, "score": score(counts), "survivors": survivors(scratch), "tests": tests,
            "source": RECHECKED, "commit": rev.strip() + "+", "seconds": None,
            "max_children": 1, "tool": f"mutmut {mutmut.__version__}", "cpu": _cpu()}


def slug(module: str) -> str:
    return module.rstrip("/").removeprefix("src/transformer_xl/").removesuffix(".py").replace("/", ".")


def run(module: str, tests: list[str], label: str, ref: str | None, children: int) -> dict:
    import mutmut

    scratch = SCRATCH / slug(module) / label
    _populate(scratch, ref)
    if not (scratch / module).exists():
        raise SystemExit(f"make mutate: {module} is not in {'the working tree' if ref is None else ref}")
    _configure(scratch, module, tests)
    rev = subprocess.run(["git", "rev-parse", "--short", ref or "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()  # what was copied, before the run (the tree may move on)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [str(Path(sys.executable).parent / "mutmut"), "run", "--max-children", str(children)]
    start = time.perf_counter()
    print(f"make mutate: {module}: mutmut run in {scratch.relative_to(REPO)} against {' '.join(tests)}", flush=True)
    with open(scratch / "mutmut.log", "w", encoding="utf-8") as log:  # its progress spinner: kept out of the terminal
        proc = subprocess.run(cmd, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (scratch / "mutmut.log").read_text(errors="replace").replace("\r", "\n").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit(f"make mutate: mutmut exited with {proc.returncode} (log: {scratch / 'mutmut.log'}); "
                         "nothing recorded")
    counts = count(scratch, module)
    return {**counts, "score": score(counts), "survivors": survivors(scratch), "tests": tests,
            "source": ref or "working tree", "commit": rev + ("" if ref else "+"), "seconds": round(seconds),
            "max_children": children, "tool": f"mutmut {mutmut.__version__}", "cpu": _cpu()}


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    name = re.search(r"model name\s*:\s*(.*)", text)
    return f"{name.group(1).strip() if name else 'unknown'}, {os.cpu_count()} logical cores"


def table() -> str:
    """The Markdown table of every result file: one row per module, before and after."""
    rows = ["| module | run | killed | survived | timeout | no tests | equivalent | left out | score | tool |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        runs = dict(data["runs"])
        if set(runs) == {"after"} and runs["after"]["source"] != RECHECKED:
            runs = {"before": runs["after"]}  # one whole run, not rechecked yet: the figures before any new test
        for label in ("before", "after"):
            r = runs.get(label)
            if r is None:
                continue
            cells = [r[k] for k in ("killed", "survived", "timeout", "no_tests", "equivalent")]
            cells += [r.get("left_out", 0), f"{r['score']} %", r["tool"]]
            rows.append(f"| `{data['module']}` | {label} ({r['commit']}) | " + " | ".join(map(str, cells)) + " |")
    return "\n".join(rows)


DOC = REPO / "docs" / "mutation-testing.md"
START, END = "<!-- mutation table: generated by benchmarks/mutate.py --docs -->", "<!-- end of mutation table -->"


def write_docs() -> None:
    """Replace the table between the markers of ``docs/mutation-testing.md`` with :func:`table`."""
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{table()}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", nargs="?", help="a source file or package folder, e.g. src/transformer_xl/store")
    ap.add_argument("--tests", help="space-separated test files or node ids (default: mirror + RELATED)")
    ap.add_argument("--label", default="after", help="the result file's entry to write (before / after)")
    ap.add_argument("--ref", help="take the sources and tests from this git revision (e.g. main)")
    ap.add_argument("--recheck", action="store_true", help="run the last run's survivors again (current tests)")
    ap.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--table", action="store_true", help="print the Markdown table of every result file")
    ap.add_argument("--docs", action="store_true", help="write that table into docs/mutation-testing.md")
    args = ap.parse_args(argv)
    if args.table or args.docs:
        write_docs() if args.docs else print(table())
        return 0
    if not args.module:
        ap.error("give MODULE (make mutate MODULE=src/transformer_xl/train/resume.py)")
    module = str(Path(args.module).resolve().relative_to(REPO)) if Path(args.module).is_absolute() else args.module
    tests = args.tests.split() if args.tests else tests_for(module)
    if not tests:
        ap.error(f"no tests for {module}: give TESTS=... (its mirror test module is missing)")
    if args.recheck:
        result = recheck(module, tests, args.label)
    else:
        result = run(module, tests, args.label, args.ref, args.max_children)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{slug(module)}.json"
    data = json.loads(out.read_text()) if out.is_file() else {"module": module.rstrip("/"), "runs": {}}
    if args.label == "after" and "after" in data["runs"] and "before" not in data["runs"]:
        data["runs"]["before"] = data["runs"]["after"]  # the first whole run: rechecked, or run again
    data["runs"][args.label] = result
    out.write_text(json.dumps(data, indent=2) + "\n")
    r = result
    print(f"{module}: " + ", ".join(f"{k.replace('_', ' ')} {r[k]}" for k in (*COLUMNS[:4], "equivalent", "left_out"))
          + f"; score {r['score']} % ({r['seconds']} s) -> {out.relative_to(REPO)}")
    for name in r["survivors"]:
        print(f"  survived: {name} (mutmut show {name}, in {(SCRATCH / slug(module) / args.label).relative_to(REPO)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
