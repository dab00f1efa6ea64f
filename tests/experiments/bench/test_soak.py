"""The soak and abuse run of ``txl serve`` (benchmarks/serve_soak.py, in a subprocess, its quick form) and the table
its report renders to."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, subprocess_env
from transformer_xl.experiments.bench.figures import render
from transformer_xl.experiments.bench.soak import is_soak_report, soak_markdown, soak_verdicts

pytest.importorskip("fastapi")


def _report(**over) -> dict:
    report = {"command": "python benchmarks/serve_soak.py --json x.json", "clients": 2, "turns": 3,
              "duration_s": 8.0, "machine": {"cpu": "a CPU (avx2)", "cores": 2, "load_avg_before": 0.5},
              "honest_rounds": {"equal": 7, "different": 1},
              "health": {"probes": 10, "unanswered": 1, "p50_ms": 1.5, "p99_ms": 20.25, "max_ms": 30.0},
              "rss": {"before_bytes": 100 * 2 ** 20, "peak_bytes": 150 * 2 ** 20, "after_bytes": 101 * 2 ** 20},
              "attacks": {"big body": {"right": 3, "seconds": 0.3},
                          "slow body": {"right": 1, "status 200": 1, "seconds": 4.0}},
              "forged_log_lines": [], "verdicts": {"it held": True, "it fell": False}, "rss_bound_mib": 256}
    return {**report, **over}


def test_the_table_shows_every_figure_and_attack_as_recorded(tmp_path) -> None:
    report = _report()
    assert is_soak_report(report) and not is_soak_report({"rows": []})
    text = soak_markdown(report, "CMD")
    for part in ("`CMD` on a CPU (avx2), 2 cores, load average 0.50", "| 7 of 8 |", "| 10 (1) |",
                 "| 1.5 / 20.2 / 30 ms |", "| 100 MiB / 150 MiB / 101 MiB |", "| big body | 3 of 3 | - | 0.10 |",
                 "| slow body | 1 of 2 | status 200 x1 | 2.00 |", "it held: **yes**; it fell: **no**."):
        assert part in text, part
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert render("r.json", tmp_path) == soak_markdown(report, "python benchmarks/serve_soak.py --json r.json")


def test_an_attack_the_soak_ended_before_is_shown_not_run_and_the_run_does_not_hold() -> None:
    """On a slow CPU one cycle of attacks outlasted the quick form's 8 s and the last ones left no trace but their
    absence, under a verdict that said every attack was answered rightly."""
    held = _report(honest_rounds={"equal": 8}, health={"probes": 10, "unanswered": 0, "p50_ms": 1.5, "p99_ms": 20.25,
                                                      "max_ms": 30.0}, attacks={"big body": {"right": 3, "seconds": 1}})
    assert all(soak_verdicts(held).values()), soak_verdicts(held)
    report = {**held, "attacks_not_run": {"n=8 x 2,048 tokens": "the soak ended at its --max-duration of 9 s "
                                                                "before it"}}
    assert {k for k, v in soak_verdicts(report).items() if not v} == {"every attack made"}
    assert not soak_verdicts({**held, "attacks": {}})["every attack made"]
    assert "| n=8 x 2,048 tokens | **not run** | the soak ended at its --max-duration of 9 s before it | - |" in \
        soak_markdown(report, "CMD")


@pytest.mark.slow
def test_honest_clients_beside_an_abusive_one_get_what_they_get_alone(tmp_path) -> None:
    """The quick form: 4 honest streaming clients for 8 s, and on until every attack has been made once (one cycle
    took about 15 s on a 2-core Zen 3), beside every attack; every verdict but /health's latency (a timing, here
    beside the rest of the suite) must hold."""
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "serve_soak.py"), "--clients", "4", "--duration",
                          "8", "--json", str(out)], env=subprocess_env(tmp_path), capture_output=True, text=True,
                         timeout=600)
    report = json.loads(out.read_text())
    verdicts = {k: v for k, v in report["verdicts"].items() if not k.startswith("/health")}
    wrong = {k: v for k, v in report["attacks"].items() if set(v) - {"right", "seconds"}}
    assert all(verdicts.values()), (verdicts, wrong, report["honest_errors"], run.stderr[-2000:])
    assert report["attacks_not_run"] == {} and len(report["attacks"]) == 19, report["attacks"]  # every one was made
    assert {"body over the cap (chunked)", "Origin of another site", "n=8 x 2,048 tokens, client gone after 0.3 s",
            "32 connections that send nothing"} <= set(report["attacks"])
    assert report["verdicts"]["every attack made"]
    assert report["health"]["unanswered"] == 0
