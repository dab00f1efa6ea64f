"""The tables of speed figures in the docs, rendered from the result files, so that a page and its file cannot
disagree.

A page holds a block between two markers that name a result file::

    <!-- figures: benchmarks/results/generate_yardstick_cpu_2t.json -->
    (generated: the command, the CPU and its flags, the table)
    <!-- /figures -->

and :func:`update_pages` (``make figures``, i.e. ``python benchmarks/render_docs.py``) rewrites every block from
its file with the table the bench itself prints (:func:`render`). ``tests/experiments/bench/test_figures.py``
fails when a committed page is not what its files render. The command shown is the one recorded in the file,
with its ``--json`` output pointed at the committed file and its ``--markdown`` output left out.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError

#: A block: the opening marker names the file (relative to the repository root), or several files of one kind
#: measured on different classes of CPU (a column each: :func:`render_classes`); the closing marker ends it.
BLOCK = re.compile(r"(<!-- figures: (?P<path>[^ >]+(?: [^ >]+)*) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.DOTALL)
#: The pages :func:`update_pages` reads, relative to the repository root.
PAGES = ("README.md", "docs/*.md")


def _command(report: dict[str, Any], path: str) -> str:
    """The recorded command, ``--json`` pointed at ``path`` and without ``--markdown`` (module docstring)."""
    words, out = shlex.split(report.get("command", "")), []
    while words:
        word = words.pop(0)
        if word in ("--json", "--markdown"):
            value = words.pop(0) if words else ""
            if word == "--json" and value:
                out += [word, path]
            continue
        out.append(word)
    if not out:
        raise ConfigError(f"{path}: no command recorded; a table needs the command that measured it")
    return shlex.join(out)


def render(path: str, root: Path) -> str:
    """The Markdown of the result file ``path`` (relative to ``root``): a ``txl bench`` report, a ``txl bench
    generate`` report or its ``--quality`` report, as the bench prints it."""
    file = root / path
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read a result file ({exc})") from exc
    command = _command(report, path)
    if "variants" in report and "tokens" in report:
        from transformer_xl.experiments.bench.decode_quality import quality_markdown

        return quality_markdown(report, f"`{command}`")
    if "rows" in report and "options" in report:
        from transformer_xl.experiments.bench.generate import to_markdown as generate_markdown

        return generate_markdown(report, command)
    if "results" in report and "env" in report:
        from transformer_xl.experiments.bench.report import to_markdown

        return to_markdown(report, command).rstrip("\n")
    from transformer_xl.experiments.bench.soak import is_soak_report, soak_markdown

    if is_soak_report(report):
        return soak_markdown(report, command)
    if "rows" in report and "read_rate_bytes_per_s" in report:
        return decode_kernels_markdown(report, command)
    if ("groups" in report and "forms" in report) or "profiles" in report:
        from transformer_xl.experiments.bench.decode_profile import profile_markdown

        profiles = report.get("profiles", [report])
        return "\n\n".join(profile_markdown(p, f"`{command}`: products {p['forms']['products']}") for p in profiles)
    if "rows" in report and all("cold_s" in row for row in report["rows"]):
        return compile_time_markdown(report, command)
    if "convert_seconds" in report:
        return tf_convert_markdown(report, command)
    if "rows" in report and all("test_hours" in row for row in report["rows"]):
        return released_eval_markdown(report, command)
    raise ConfigError(f"{path}: not a txl bench, bench generate, bench decode, quality, decode-kernels, "
                      "compile-time, soak, TF conversion or released-model evaluation report")


def tf_convert_markdown(report: dict[str, Any], command: str) -> str:
    """The table of a ``benchmarks/bench_tf_convert.py`` report: time and rates beside the plain read and write
    of the same run, peak memory beside the output and the largest tensor."""
    gb = 1e9
    lines = [f"`{command}` ({report['cpu']}, {report['cores']} cores; load average {report['load_average']:.2f})",
             "", "| | |", "|---|---|",
             f"| bundle (the model and {report['bundle_bytes'] // report['model_bytes'] - 1} optimizer slots per "
             f"variable) | {report['bundle_bytes'] / gb:.2f} GB |",
             f"| output | {report['output_bytes'] / gb:.2f} GB, the largest tensor "
             f"{report['largest_tensor_bytes'] / 1e6:.0f} MB |",
             f"| conversion | {report['convert_seconds']:.1f} s: {report['convert_model_mb_per_s']:.0f} MB/s of the "
             f"model's weights |",
             f"| yardsticks of the same run | plain read {report['plain_read_mb_per_s']:,.0f} MB/s (page cache), "
             f"plain write with fsync {report['plain_write_mb_per_s']:,.0f} MB/s; reading and writing the model once "
             f"at those rates is {report['convert_share_of_read_then_write']:.0%} of the conversion's time |",
             f"| peak memory | {report['peak_rss_bytes'] / gb:.2f} GB: the process's own "
             f"{report['baseline_rss_bytes'] / gb:.2f} GB, then "
             f"{report['peak_less_baseline_over_output_plus_largest']:.2f} x (output + largest tensor); "
             f"{report['peak_over_bundle']:.0%} of the bundle |"]
    return "\n".join(lines)


def released_eval_markdown(report: dict[str, Any], command: str) -> str:
    """The table of a ``benchmarks/bench_released_eval.py`` report: per released model, its evaluation's speed,
    memory and the time of its test set."""
    first = report["rows"][0]
    lines = [f"`{command}` ({first['cpu']}, flags: {', '.join(first['cpu_flags'])}; {first['threads']} threads; "
             f"load average {first['load_average']})", "",
             "| model | parameters | tgt_len / mem_len | tokens/s | matmul share of the fp32 GEMM peak | peak memory "
             "| per 100,000 tokens | test set |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in report["rows"]:
        test = "not known here" if r["test_hours"] is None else \
            f"{r['test_tokens']:,} tokens: {r['test_hours']:.1f} h"
        lines.append(f"| {r['model']} | {r['parameters'] / 1e6:.0f} M | {r['tgt_len']} / {r['mem_len']:,} "
                     f"| {r['tokens_per_s']:.1f} | {r['share_of_fp32_peak']:.0%} "
                     f"({r['matmul_gflop_per_s']:.0f} of {r['fp32_gemm_peak_gflop_per_s']:.0f} GFLOP/s) "
                     f"| {r['peak_rss_bytes'] / 1e9:.1f} GB | {r['seconds_per_100k_tokens'] / 60:.0f} min | {test} |")
    return "\n".join(lines)


def compile_time_markdown(report: dict[str, Any], command: str) -> str:
    """The table of a ``benchmarks/compile_time.py`` report: per case, the first step's seconds with an empty
    inductor cache (cold) and from that cache in a new process (warm)."""
    m = report["machine"]
    lines = [f"`{command}` (torch {report['torch']}, {m['threads']} thread(s), {m['cpu']}; load average "
             f"{m['load_average']} before, {report.get('load_average_after', 'not recorded')} after)", "",
             "| case | first step, empty cache (cold) s | first step, from the cache (warm) s |", "|---|---:|---:|"]
    lines += [f"| {row['case']} | {row['cold_s']:.1f} | {row['warm_s']:.1f} |" for row in report["rows"]]
    return "\n".join(lines)


#: The variants of the earlier ``benchmarks/decode_kernels.py`` (its result files), in the order of its table.
KERNELS = {"blas": "BLAS products (before)", "reduction-linear": "weights as reductions",
           "reduction": "every product a reduction (now)"}


def decode_kernels_markdown(report: dict[str, Any], command: str) -> str:
    """The table of a ``benchmarks/decode_kernels.py`` report: per case, the bytes a step reads, the plain step's
    time, and the captured step's best time with its share of the run's best read rate and the share the issue
    asks for (files of the earlier benchmark: each compiled variant, :func:`_kernel_variants_markdown`)."""
    if report["rows"] and "captured" not in report["rows"][0]:
        return _kernel_variants_markdown(report, command)
    m = report["machine"]
    rate = report["read_rate_bytes_per_s"]
    lines = [f"`{command}` (torch {report['torch']}, {m['threads']} thread(s), {m['cpu']}; flags: "
             f"{', '.join(m['cpu_flags'])}; load average {m['load_average']} before, "
             f"{report.get('load_average_after', 'not recorded')} after; clock: {report['clock']}; best read rate "
             f"of the run {rate / 1e9:.1f} GB/s on huge pages, {report['read_rate_4k_pages_bytes_per_s'] / 1e9:.1f} "
             "GB/s on 4 KiB pages)", "",
             "| shape | words | memory | batch | weights | MB per step | plain step ms | captured step ms | tok/s "
             "| share of the read rate | target |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        c = row["captured"]
        target = "–" if row["target"] is None else f"{row['target']:.0%}"
        weights = "int8, bf16 ring" if row["int8"] else "fp32"
        lines.append(f"| {row['shape']} | {row['n_token']:,} | {row['mem_len']:,} | {row['batch']} | {weights} "
                     f"| {c['bytes']['total'] / 1e6:.1f} | {row['plain_step_s']['best'] * 1e3:.1f} "
                     f"| {c['best_s'] * 1e3:.2f} | {c['tok_per_s']:.0f} | {c['share_of_read_rate']:.0%} | {target} |")
    by_case = {row["case"]: row for row in report["rows"]}
    pairs = [(case, by_case[case + ":int8"]) for case in by_case if case + ":int8" in by_case]
    if pairs:
        lines += ["", "int8 weights against float32, the same case: " + "; ".join(
            f"{case} {by_case[case]['captured']['best_s'] / row['captured']['best_s']:.2f}× as fast"
            for case, row in pairs) + "."]
    return "\n".join(lines)


def _kernel_variants_markdown(report: dict[str, Any], command: str) -> str:
    """The table of an earlier ``benchmarks/decode_kernels.py`` report (three variants of the compiled step)."""
    m = report["machine"]
    rate = report["read_rate_bytes_per_s"]
    lines = [f"`{command}` (torch {report['torch']}, {m['threads']} thread(s), {m['cpu']}; flags: "
             f"{', '.join(m['cpu_flags'])}; load average {m['load_average']}; clock: {report['clock']}; best read "
             f"rate of the run {rate / 1e9:.1f} GB/s)", "",
             "| shape | words | memory | batch | MB per step | plain step ms | "
             + " | ".join(f"{name}: ms, share of the read rate" for name in KERNELS.values()) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(KERNELS)]
    for row in report["rows"]:
        cells = [f"{row[k]['best_s'] * 1e3:.1f}, {row[k]['share_of_read_rate']:.0%}" for k in KERNELS]
        lines.append(f"| {row['shape']} | {row['n_token']:,} | {row['mem_len']:,} | {row['batch']} "
                     f"| {row['blas']['bytes']['total'] / 1e6:.1f} | {row['plain_step_s']['best'] * 1e3:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def _read(path: str, root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read a result file ({exc})") from exc


def _machine(report: dict[str, Any]) -> dict[str, Any]:
    """The machine a report records: ``machine`` (decode kernels) or ``env.machine`` (``txl bench``)."""
    m = report.get("machine")
    return m if isinstance(m, dict) else report.get("env", {}).get("machine", {})


def _aligned(reports: list[dict[str, Any]],
             key: Callable[[dict[str, Any]], Any]) -> Iterator[tuple[Any, list[Any], dict[str, Any]]]:
    """Each ``key(row)`` of the reports' rows in first-seen order, with each report's row of it (None where a report
    has none) and the first of them."""
    for k in dict.fromkeys(key(row) for r in reports for row in r["rows"]):
        rows = [next((row for row in r["rows"] if key(row) == k), None) for r in reports]
        yield k, rows, next(row for row in rows if row is not None)


def render_classes(paths: list[str], root: Path) -> str:
    """One table of several result files of one kind (``benchmarks/decode_kernels.py``, ``benchmarks/int8_forms.py``
    or ``txl bench`` training reports), a column per file: the same cases measured on different classes of CPU, each
    column named by its class, with a line per file naming its command, CPU, flags and load."""
    from transformer_xl.train.precision import CPU_CLASSES

    reports = [_read(path, root) for path in paths]
    for path, report in zip(paths, reports):
        if "cpu_class" not in _machine(report):
            raise ConfigError(f"{path}: no CPU class recorded; a column per class needs it (measure it again)")
    names = [CPU_CLASSES.get(_machine(r)["cpu_class"], _machine(r)["cpu_class"])
             + (f", {_machine(r)['vendor']}" if _machine(r).get("vendor") else "")
             + (f", {r['products']} products" if r.get("products") else "") for r in reports]
    lines = []
    for name, report, path in zip(names, reports, paths):
        m, torch_version = _machine(report), report.get("torch") or report["env"]["torch"]
        lines.append(f"- **{name}**: `{_command(report, path)}` (torch {torch_version}, {m['threads']} threads, "
                     f"{m['cpu']}; flags: "
                     f"{', '.join(m['cpu_flags'])}; load average {m['load_average']})")
    lines.append("")
    if all("read_rate_bytes_per_s" in r and r["rows"] and "captured" in r["rows"][0] for r in reports):
        lines += ["| shape | words | memory | batch | weights | MB per step | "
                  + " | ".join(f"{n}: captured ms, share of the read rate" for n in names) + " |",
                  "|---|---:|---:|---:|---|---:|" + "---:|" * len(reports)]
        for _, rows, first in _aligned(reports, lambda row: row["case"]):
            cells = ["–" if row is None else f"{row['captured']['best_s'] * 1e3:.2f}, "
                     f"{row['captured']['share_of_read_rate']:.0%}" for row in rows]
            lines.append(f"| {first['shape']} | {first['n_token']:,} | {first['mem_len']:,} | {first['batch']} | "
                         f"{'int8, bf16 ring' if first['int8'] else 'fp32'} | "
                         f"{first['captured']['bytes']['total'] / 1e6:.1f} | " + " | ".join(cells) + " |")
        return "\n".join([*lines, "", *decode_targets_markdown(reports, names)])
    if all(r.get("rows") and "lanes" in r["rows"][0] for r in reports):  # benchmarks/int8_forms.py
        lines += ["| `(out, in)` | MB | " + " | ".join(f"{n}: int8 lanes, 32-bit words GB/s" for n in names) + " |",
                  "|---|---:|" + "---:|" * len(reports)]
        for shape, rows, first in _aligned(reports, lambda row: (row["out"], row["in"])):
            cells = ["–" if row is None else f"{row['lanes']['gb_per_s']:.1f}, {row['words']['gb_per_s']:.1f}"
                     for row in rows]
            lines.append(f"| {shape[0]:,} × {shape[1]:,} | {first['lanes']['bytes'] / 1e6:.2f} | "
                         + " | ".join(cells) + " |")
        return "\n".join(lines)
    if all("results" in r and "env" in r for r in reports):
        lines += ["| case | measure | " + " | ".join(f"{n}: txl ÷ HF (txl MFU)" for n in names) + " |",
                  "|---|---|" + "---:|" * len(reports)]
        keys = dict.fromkeys((res["case"], mem) for r in reports for res in r["results"]
                             for mem in (None, *res["eval"]))  # (case, None): training; (case, mem): evaluation
        for case, mem in keys:
            cells = []
            for r in reports:
                res = next((x for x in r["results"] if x["case"] == case), None)
                sec = None if res is None else (res["train"] if mem is None else res["eval"].get(mem))
                mfu = None if not sec or "ratio" not in sec else sec["txl"].get("mfu")
                cells.append("–" if not sec or "ratio" not in sec else
                             f"**{sec['ratio']:.2f}**" + ("" if mfu is None else f" ({mfu:.0%})"))
            label = "train tok/s" if mem is None else f"eval tok/s, mem {mem}"
            lines.append(f"| {case} | {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
    raise ConfigError(f"{', '.join(paths)}: a column per class needs decode-kernels, int8-forms or txl bench "
                      "training reports, all of one kind")


#: The decode step's targets per class of CPU: (what, case, share of its byte limit at least), and int8 faster
#: than float32 on the same case.
DECODE_TARGETS = (("captured float32, wt103-base, memory 640, batch 1", "wt103-base:640:1", 0.85),
                  ("captured int8 (bf16 ring), wt103-base, memory 640, batch 1", "wt103-base:640:1:int8", 0.75))


def decode_targets_markdown(reports: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The targets of :data:`DECODE_TARGETS` against each report's figure (a column per report), and whether int8
    is faster than float32: yes/no beside each figure (lines of a markdown table; none where no report has the
    cases)."""
    rows = [{row["case"]: row for row in r["rows"]} for r in reports]
    if not any(case in by for _, case, _ in DECODE_TARGETS for by in rows):
        return []
    lines = ["| target | " + " | ".join(names) + " |", "|---|" + "---:|" * len(reports)]
    for what, case, target in DECODE_TARGETS:
        cells = []
        for by in rows:
            got = by.get(case, {}).get("captured", {}).get("share_of_read_rate")
            cells.append("–" if got is None else f"{got:.0%} ({'met' if got >= target else 'not met'})")
        lines.append(f"| {what}: at least {target:.0%} of its byte limit | " + " | ".join(cells) + " |")
    cells = []
    for by in rows:
        fp, q = by.get("wt103-base:640:1"), by.get("wt103-base:640:1:int8")
        ratio = None if fp is None or q is None else fp["captured"]["best_s"] / q["captured"]["best_s"]
        cells.append("–" if ratio is None else f"{ratio:.2f}× ({'met' if ratio > 1 else 'not met'})")
    lines.append("| captured int8 faster than float32 (the same case): float32 ms ÷ int8 ms above 1 | "
                 + " | ".join(cells) + " |")
    return lines


def update_text(text: str, root: Path) -> str:
    """``text`` with every block rendered again from its file (or files: :func:`render_classes`)."""
    def block(m: re.Match) -> str:
        paths = m.group("path").split()
        body = render(paths[0], root) if len(paths) == 1 else render_classes(paths, root)
        return f"{m.group(1)}{body}\n{m.group(4)}"

    return BLOCK.sub(block, text)


def pages(root: Path) -> list[Path]:
    """The pages that may hold blocks (:data:`PAGES`)."""
    return sorted(p for pattern in PAGES for p in root.glob(pattern))


def update_pages(root: Path, *, check: bool = False) -> list[Path]:
    """Render every block of every page under ``root`` again; the pages that changed (with ``check``: that would
    change, nothing written)."""
    changed = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        new = update_text(text, root)
        if new != text:
            changed.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    return changed
