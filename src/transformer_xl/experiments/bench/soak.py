"""The tables of a ``benchmarks/serve_soak.py`` report: honest streaming clients beside an abusive one against a
live ``txl serve`` (what each attack got, ``/health`` latency, the server's resident memory), rendered into
docs/serving.md by :func:`transformer_xl.experiments.bench.figures.render`."""

from __future__ import annotations

from typing import Any

__all__ = ["is_soak_report", "soak_markdown", "soak_verdicts"]


def is_soak_report(report: dict[str, Any]) -> bool:
    """Whether ``report`` is a soak run's (it has attacks and honest rounds)."""
    return "attacks" in report and "honest_rounds" in report


def soak_verdicts(report: dict[str, Any]) -> dict[str, bool]:
    """What the run must show (``benchmarks/serve_soak.py``'s docstring): every honest round equal to its text
    alone, ``/health`` answered under 100 ms at the 99th percentile, every attack made (none in ``attacks_not_run``)
    and answered rightly, the server's memory bounded and back where it was, no log line forged."""
    rss = report["rss"]
    rounds = report["honest_rounds"]
    return {
        "every honest round equals its text alone": rounds.get("equal", 0) > 0 and set(rounds) == {"equal"},
        "/health p99 under 100 ms": report["health"]["p99_ms"] < 100 and not report["health"]["unanswered"],
        "every attack made": bool(report["attacks"]) and not report.get("attacks_not_run"),
        "every attack answered rightly": all(set(seen) <= {"right", "seconds"} for seen in
                                             report["attacks"].values()),
        "RSS after within 10 % of before": abs(rss["after_bytes"] - rss["before_bytes"]) <= 0.1 * rss["before_bytes"],
        f"peak RSS under before + {report['rss_bound_mib']} MiB":
            rss["peak_bytes"] <= rss["before_bytes"] + report["rss_bound_mib"] * 2 ** 20,
        "no forged log line": not report["forged_log_lines"],
    }


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:,.0f} MiB"


def soak_markdown(report: dict[str, Any], command: str) -> str:
    """The run's summary table, then one row per attack (how often it was answered as it should be, and its mean
    time from the first byte sent to the answer), and one per attack the soak ended before, with the reason."""
    m, h, rss = report["machine"], report["health"], report["rss"]
    rounds = report["honest_rounds"]
    total = sum(rounds.values())
    lines = [f"`{command}` on {m['cpu']}, {m['cores']} cores, load average {m['load_avg_before']:.2f} before.",
             "", "| measure | value |", "|---|---:|",
             f"| honest streaming clients (sessions of {report['turns']} completions) | {report['clients']} |",
             f"| soak | {report.get('wall_s', report['duration_s']):.0f} s |",
             f"| honest rounds equal to the client's text alone | {rounds.get('equal', 0)} of {total} |",
             f"| `/health` probes (unanswered) | {h['probes']} ({h['unanswered']}) |",
             f"| `/health` p50 / p99 / max | {h['p50_ms']:.1f} / {h['p99_ms']:.1f} / {h['max_ms']:.0f} ms |",
             f"| server RSS before / peak / after | {_mib(rss['before_bytes'])} / {_mib(rss['peak_bytes'])} / "
             f"{_mib(rss['after_bytes'])} |",
             f"| log lines forged | {len(report['forged_log_lines'])} |",
             "", "| attack (cycled through by one client) | answered as it should | other answers | mean seconds |",
             "|---|---:|---:|---:|"]
    for name, seen in report["attacks"].items():
        tries = sum(v for k, v in seen.items() if k != "seconds")
        other = ", ".join(f"{k} x{v}" for k, v in seen.items() if k not in ("right", "seconds")) or "-"
        lines.append(f"| {name} | {seen.get('right', 0)} of {tries} | {other} | {seen['seconds'] / tries:.2f} |")
    for name, why in report.get("attacks_not_run", {}).items():
        lines.append(f"| {name} | **not run** | {why} | - |")
    verdicts = report.get("verdicts", {})
    if verdicts:
        lines += ["", "Verdicts: " + "; ".join(f"{k}: **{'yes' if v else 'no'}**" for k, v in verdicts.items()) + "."]
    return "\n".join(lines)
