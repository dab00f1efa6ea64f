"""The POPGym report (:mod:`transformer_xl.experiments.popgym_report`): scores are means over episodes, MMER is the
best running return, the tables say which settings differ, and the page's generated parts are replaced in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_xl.experiments import popgym_report as report

ARGS = {"envs": 16, "horizon": 64, "epochs": 4, "minibatches": 2, "lr": 3e-4, "gamma": 0.99, "lmbda": 0.95,
        "entropy": 0.01, "d_model": 64, "n_layer": 2, "mem_len": 16, "gating": "gru", "gate_bias": 2.0,
        "no_reorder": False, "mlp_hidden": None, "param_budget": 0.05}
MACHINE = {"cpu": "Test CPU (avx2)", "threads": 1, "torch": "2.13.0+cpu", "torchrl": "0.14.1", "load_average": 0.05}


def run(env: str, policy: str, seed: int, points: list[tuple[int, int, float]], **args) -> dict:
    """A run file's content: ``points`` are (environment steps, episodes ended in that batch, their mean return)."""
    return {"env": env, "policy": policy, "seed": seed, "frames": points[-1][0], "wall_s": 10.0 + seed,
            "curve": [{"frames": f, "episodes": n, "mean_return": m} for f, n, m in points],
            "args": {**ARGS, **args}, "machine": MACHINE}


def test_the_running_return_is_a_mean_over_at_least_a_window_of_episodes() -> None:
    curve = run("T", "gru", 0, [(1, 60, 0.0), (2, 60, 1.0), (3, 50, 1.0), (4, 100, -1.0)])["curve"]
    # after batch 2: 60 episodes are too few, so batch 1 joins (0.5); after 3: 50 + 60 episodes, all of them at 1.0
    assert report.running_returns(curve, window=100) == [(1, 0.0), (2, 0.5), (3, 1.0), (4, -1.0)]
    # a batch's mean weighs by its episodes: 10 at +1 and 90 at -1 is -0.8, not the batches' mean 0
    assert report.running_returns(run("T", "gru", 0, [(1, 10, 1.0), (2, 90, -1.0)])["curve"])[-1] == (2, -0.8)


def test_mmer_is_the_best_running_return_and_the_final_return_the_last() -> None:
    r = run("T", "gtrxl", 0, [(1, 100, -0.5), (2, 100, 0.9), (3, 100, 0.1)])
    assert report.mmer(r) == 0.9
    assert report.final_return(r) == 0.1
    assert report.first_reaching(r, 0.9) == 2
    assert report.first_reaching(r, 0.95) is None


def test_mmer_leaves_out_the_windows_of_fewer_than_a_hundred_episodes() -> None:
    """A lucky first batch of 16 episodes is no MMER; a run that never filled a window takes its best anyway."""
    assert report.mmer(run("T", "gru", 0, [(1, 16, 1.0), (2, 100, 0.2), (3, 100, 0.3)])) == 0.3
    assert report.mmer(run("T", "gru", 0, [(1, 16, 1.0), (2, 16, 0.0)])) == 1.0


def _suite() -> list[dict]:
    return [run("TaskA", "gtrxl", s, [(1024, 100, 0.2 + 0.1 * s), (2048, 100, 0.5)]) for s in range(3)] + \
        [run("TaskA", "gru", s, [(1024, 100, 0.1), (2048, 100, 0.3 - 0.1 * s)]) for s in range(3)] + \
        [run("TaskB", "mlp", 0, [(1024, 100, -0.4)]), run("TaskB", "gtrxl", 0, [(1024, 100, -0.2)], mem_len=64)]


def test_the_suite_table_gives_mean_spread_and_seeds_and_marks_the_best_of_each_task() -> None:
    table = report.suite_table(_suite(), Path("results/suite"))
    lines = table.splitlines()
    gtrxl_a = next(line for line in lines if line.startswith("| TaskA | gtrxl |"))
    gru_a = next(line for line in lines if line.startswith("| TaskA | gru |"))
    assert "| 3 | +0.50 ± 0.00 | **+0.50 ± 0.00** | +0.50, +0.50, +0.50 | 2,048 | - | 10, 11, 12 |" in gtrxl_a
    assert "| +0.20 ± 0.10 | +0.20 ± 0.10 | +0.30, +0.20, +0.10 |" in gru_a and "**" not in gru_a
    assert lines.index(gtrxl_a) < lines.index(gru_a)  # the policies' order
    # one seed says so; a setting the row changed is named as its flag
    assert "| TaskB | gtrxl | 1 | -0.20 (1 seed) | **-0.20 (1 seed)** | -0.20 | 1,024 | --mem-len 64 |" in table
    assert "Test CPU (avx2), 1 thread(s) per run" in table and "files: `results/suite/*.json`" in table
    assert "lr 0.0003, GTrXL mem_len 16, gru gate, gate bias 2" in table  # what a row's "-" stands for


def test_each_row_names_its_own_settings_whatever_run_comes_first() -> None:
    """Rows are compared with the harness's defaults, not with the first file: a GTrXL-only setting is not named for
    another policy, the MLP's width only for the MLP, a flag that is off is not named at all."""
    runs = [run("A", "gru", 0, [(1, 100, 0.0)], mem_len=64, lr=1e-3, mlp_hidden=64),
            run("B", "gtrxl", 0, [(1, 100, 0.0)], gating="residual", no_reorder=True, gate_bias=0.0),
            run("C", "mlp", 0, [(1, 100, 0.0)], mlp_hidden=64), run("D", "gtrxl", 0, [(1, 100, 0.0)])]
    assert [report.differences(r) for r in runs] == ["--lr 0.001", "--gating residual --gate-bias 0 --no-reorder",
                                                     "--mlp-hidden 64", "-"]


def test_runs_of_two_ppo_loops_are_not_one_table() -> None:
    runs = [run("A", "gru", 0, [(1, 100, 0.0)]), run("A", "gtrxl", 0, [(1, 100, 0.0)], horizon=32)]
    with pytest.raises(SystemExit, match=r"A_gru_seed0\.json and A_gtrxl_seed0\.json differ in --horizon"):
        report.suite_table(runs, Path("x"))


def test_ties_as_rounded_are_all_bold_and_seeds_of_other_lengths_show_the_range() -> None:
    runs = [run("A", "gru", 0, [(1, 100, 0.9712)]), run("A", "lstm", 0, [(1, 100, 0.9705)]),
            run("A", "mlp", 0, [(1, 100, 0.5)]), run("A", "mlp", 1, [(1, 100, 0.5), (2, 100, 0.5)])]
    table = report.suite_table(runs, Path("x"))
    assert table.count("**") == 4 and "| **+0.50 ± 0.00** |" not in table
    assert "| 1–2 |" in table


def _groups(default: list[dict], variants: dict[str, list[dict]]) -> list[tuple[str, list[dict]]]:
    return report.settings_groups(default, variants)


def test_the_settings_table_puts_each_variant_beside_the_default_of_its_task() -> None:
    variants = {"mem64": [run("TaskB", "gtrxl", 0, [(1024, 100, 0.95)], mem_len=64)],
                "bias0": [run("TaskA", "gtrxl", s, [(1024, 100, 0.1), (2048, 100, 0.92)], gate_bias=0.0)
                          for s in range(2)]}
    default = [run("TaskA", "gtrxl", 0, [(1024, 100, 0.95)]), run("TaskB", "gtrxl", 0, [(1024, 100, 0.1)]),
               run("TaskC", "gtrxl", 0, [(1024, 100, 0.1)]), run("TaskA", "gru", 0, [(1024, 100, 0.5)])]
    rows = report.settings_table(_groups(default, variants), 0.9, Path("s")).splitlines()
    assert rows[2:6] == [
        "| TaskA | default | 1 | +0.95 (1 seed) | +0.95 (1 seed) | 1,024 | 1,024 |",
        "| TaskA | --gate-bias 0 | 2 | +0.92 ± 0.00 | +0.92 ± 0.00 | 2,048 | 2,048, 2,048 |",
        "| TaskB | default | 1 | +0.10 (1 seed) | +0.10 (1 seed) | 1,024 | never |",
        "| TaskB | --mem-len 64 | 1 | +0.95 (1 seed) | +0.95 (1 seed) | 1,024 | 1,024 |"]
    assert not any("TaskC" in r or "gru" in r for r in rows)  # no variant ran there; GTrXL's settings only


def test_two_folders_of_one_setting_and_no_settings_at_all(tmp_path: Path) -> None:
    default = [run("A", "gtrxl", 0, [(1, 100, 0.0)])]
    same = {"x": [run("A", "gtrxl", 0, [(1, 100, 0.1)], lr=1e-3)],
            "y": [run("A", "gtrxl", 1, [(1, 100, 0.2)], lr=1e-3)]}
    with pytest.raises(SystemExit, match=r"settings folder y repeats the setting '--lr 0\.001'"):
        _groups(default, same)
    assert report.settings_table(_groups(default, {}), 0.9, Path("s")) == "(no settings runs in `s`)\n"


def test_the_speed_table_gives_each_rate_as_a_ratio_to_the_grus() -> None:
    rows = [{"policy": p, "trunk_params": 1000, "acting_steps_per_s": a, "learning_steps_per_s": g, "envs": 16,
             "horizon": 64, "threads": 1} for p, a, g in (("gtrxl", 5000.0, 20000.0), ("gru", 20000.0, 10000.0))]
    table = report.speed_table({"rows": rows, "machine": MACHINE})
    assert "| gtrxl | 1,000 | 5,000 | 0.25 | 20,000 | 2.00 |" in table
    assert "| gru | 1,000 | 20,000 | 1.00 | 10,000 | 1.00 |" in table
    assert "load average 0.05" in table


def test_the_curves_carry_a_seed_forward_and_stop_where_the_shortest_seed_stops() -> None:
    runs = [run("T", "gru", 0, [(1, 100, 0.0), (2, 100, 1.0), (3, 100, 1.0)]),
            run("T", "gru", 1, [(1, 100, 0.5), (3, 100, 0.0)]),  # no episode ended in its batch at step 2
            run("T", "gru", 2, [(1, 100, 0.2), (2, 100, 0.4)])]
    steps, mean, low, high = report.curves(runs)["T"]["gru"]
    assert steps == [1, 2]
    assert mean == pytest.approx([0.7 / 3, 1.9 / 3])
    assert low == [0.0, 0.4] and high == [0.5, 1.0]


def _root(tmp_path: Path) -> Path:
    for i, r in enumerate(_suite()):
        (tmp_path / "suite").mkdir(parents=True, exist_ok=True)
        (tmp_path / "suite" / f"{r['env']}_{r['policy']}_seed{r['seed']}_{i}.json").write_text(json.dumps(r))
    (tmp_path / "settings" / "bias0").mkdir(parents=True)
    r = run("TaskA", "gtrxl", 0, [(1024, 100, 0.3)], gate_bias=0.0)
    (tmp_path / "settings" / "bias0" / "TaskA_gtrxl_seed0.json").write_text(json.dumps(r))
    rows = [{"policy": "gru", "trunk_params": 1, "acting_steps_per_s": 1.0, "learning_steps_per_s": 1.0, "envs": 16,
             "horizon": 64, "threads": 1}]
    (tmp_path / "suite" / "TaskA_speed.json").write_text(json.dumps({"rows": rows, "machine": MACHINE}))
    return tmp_path


def test_write_docs_replaces_only_the_generated_parts_and_draws_the_curves(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    root = _root(tmp_path / "results")
    doc = tmp_path / "docs" / "agents.md"
    doc.parent.mkdir()
    parts = ["# Agents\n"]
    for name in ("popgym table", "popgym speed", "popgym settings"):
        start, end = report._marker(name)
        parts += [f"before {name}\n", start + "\n", "stale\n", end + "\n"]
    doc.write_text("".join(parts) + "after\n", encoding="utf-8")
    report.write_docs(root, doc, shown="R")
    page = doc.read_text(encoding="utf-8")
    assert "stale" not in page and page.startswith("# Agents\nbefore popgym table\n") and page.endswith("after\n")
    for name, text in report.blocks(root, shown="R").items():
        start, end = report._marker(name)
        assert f"{start}\n{text}{end}\n" in page
    assert "| TaskA | --gate-bias 0 | 1 |" in page
    assert (doc.parent / "popgym-suite.png").stat().st_size > 0 and (doc.parent / "popgym-settings.png").exists()


def test_a_page_without_the_markers_or_a_root_without_runs_is_one_line(tmp_path: Path) -> None:
    root = _root(tmp_path / "results")
    doc = tmp_path / "agents.md"
    doc.write_text("# nothing generated here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="has no <!-- popgym table"):
        report.write_docs(root, doc)
    with pytest.raises(SystemExit, match="no run files"):
        report.blocks(tmp_path / "empty")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"env": "T"}'])
def test_a_file_that_is_not_a_run_file_is_one_line_naming_it(tmp_path: Path, content: str) -> None:
    (tmp_path / "T_gru_seed0.json").write_text(content)
    with pytest.raises(SystemExit, match=r"T_gru_seed0\.json: not a run file of popgym_ppo\.py"):
        report.load_runs(tmp_path)


@pytest.mark.parametrize("content", ['{"rows": []}', '{"rows": [{"policy": "gru"}], "machine": {}}', "{"])
def test_a_speed_file_that_is_not_one_is_one_line(tmp_path: Path, content: str) -> None:
    root = _root(tmp_path)
    (root / "suite" / "TaskA_speed.json").write_text(content)
    with pytest.raises(SystemExit, match=r"TaskA_speed\.json: not a speed file"):
        report.blocks(root)
    (root / "suite" / "TaskB_speed.json").write_text(content)
    with pytest.raises(SystemExit, match="2 speed files"):
        report.blocks(root)


@pytest.mark.parametrize("curve", ['[]', '[{"frames": 1, "episodes": 0, "mean_return": 0.5}]',
                                   '[{"frames": 1, "mean_return": 0.5}]'])
def test_a_curve_without_episodes_is_one_line(tmp_path: Path, curve: str) -> None:
    r = json.dumps(run("T", "gru", 0, [(1, 1, 0.0)]))
    (tmp_path / "T_gru_seed0.json").write_text(r.replace('[{"frames": 1, "episodes": 1, "mean_return": 0.0}]', curve))
    with pytest.raises(SystemExit, match=r"T_gru_seed0\.json: not a run file of popgym_ppo\.py"):
        report.load_runs(tmp_path)
