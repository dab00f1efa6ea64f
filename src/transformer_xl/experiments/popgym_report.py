"""The tables and curves of ``benchmarks/popgym_ppo.py``, made from its run files only (no torch, no TorchRL).

A run file holds, per PPO batch in which episodes ended, the number of those episodes and their mean return. Every
score here is a mean over **episodes**, not over batches (a batch may end 10 episodes or 40):

* the **running return** after a batch: the mean return of the latest whole batches that hold at least ``WINDOW``
  episodes, as RLlib reports ``episode_reward_mean`` after each training iteration in POPGym's runs;
* the **final return** of a run: its running return after its last batch;
* the **MMER** (max-mean episodic return), POPGym's metric (Morad et al., ICLR 2023): the largest running return of
  the run, over the batches whose window holds ``WINDOW`` episodes (a lucky first batch of 16 episodes is no MMER).
  POPGym scales every environment's rewards so that an episode's return lies in [-1, 1], so MMERs of different
  tasks are on one scale; the table gives their mean and spread over seeds.

The final return says where a run ended, the MMER the best it reached; a run that learned and then collapsed has a
high MMER and a low final return.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

WINDOW = 100  # episodes in a running return (RLlib's metrics window in POPGym's runs)
POLICY_ORDER = ("gtrxl", "gru", "lstm", "mlp")
#: The harness's defaults of the arguments that make a setting (``add_ppo_arguments``; a test keeps them equal).
#: A row names the ones it changed; the PPO loop's arguments (PPO_ARGS) must be the same in every run of a table.
DEFAULTS = {"d_model": 64, "n_layer": 2, "mem_len": 16, "gating": "gru", "gate_bias": 2.0, "no_reorder": False,
            "lr": 3e-4, "mlp_hidden": None}
ONLY = {"mem_len": "gtrxl", "gate_bias": "gtrxl", "no_reorder": "gtrxl", "mlp_hidden": "mlp"}  # the others size all
PPO_ARGS = ("envs", "horizon", "epochs", "minibatches", "gamma", "lmbda", "entropy", "param_budget")
RUN_KEYS = {"env", "policy", "seed", "curve", "args", "machine", "frames", "wall_s"}


def _name(run: dict) -> str:
    return run.get("file", f"{run['env']}_{run['policy']}_seed{run['seed']}.json")


def _check_curve(curve) -> str | None:
    """What is wrong with a run file's curve (None: nothing)."""
    if not isinstance(curve, list) or not curve:
        return "no curve"
    for point in curve:
        if not isinstance(point, dict) or not isinstance(point.get("frames"), int) \
                or not isinstance(point.get("episodes"), int) or point["episodes"] < 1 \
                or not isinstance(point.get("mean_return"), (int, float)):
            return f"a curve point {point!r} is not frames, episodes >= 1 and mean_return"
    return None


def load_runs(out: Path) -> list[dict]:
    """Every run file (``*_seed*.json``) directly in ``out``, in name order, each with its ``file`` name; one that is
    not a run file is a one-line error naming it."""
    runs = []
    for f in sorted(out.glob("*_seed*.json")):
        try:
            run = json.loads(f.read_text(encoding="utf-8"))
            missing = RUN_KEYS - set(run)
            wrong = f"no {', '.join(sorted(missing))}" if missing else _check_curve(run["curve"])
        except (ValueError, TypeError) as err:
            wrong = str(err)
        if wrong:
            raise SystemExit(f"{f}: not a run file of popgym_ppo.py ({wrong})")
        runs.append({**run, "file": f.name})
    return runs


def _windows(curve: list[dict], window: int) -> list[tuple[int, float, int]]:
    """``(environment steps, running return, episodes in its window)`` after every batch of ``curve``."""
    points = []
    for i, point in enumerate(curve):
        episodes, total = 0, 0.0
        for past in reversed(curve[:i + 1]):
            episodes += past["episodes"]
            total += past["episodes"] * past["mean_return"]
            if episodes >= window:
                break
        points.append((point["frames"], total / episodes, episodes))
    return points


def running_returns(curve: list[dict], window: int = WINDOW) -> list[tuple[int, float]]:
    """``(environment steps, running return)`` after every batch of ``curve``: the episode-weighted mean over the
    fewest latest batches that hold at least ``window`` episodes (all of them, early on)."""
    return [(frames, value) for frames, value, _ in _windows(curve, window)]


def final_return(run: dict) -> float:
    """The running return after the run's last batch."""
    return running_returns(run["curve"])[-1][1]


def mmer(run: dict) -> float:
    """The max-mean episodic return: the largest running return of the run whose window holds ``WINDOW`` episodes
    (of all of them, where no window is full)."""
    points = _windows(run["curve"], WINDOW)
    return max(value for _, value, n in points if n >= WINDOW or points[-1][2] < WINDOW)


def first_reaching(run: dict, level: float) -> int | None:
    """The environment steps after which the running return first reached ``level`` (None: never)."""
    return next((frames for frames, value in running_returns(run["curve"]) if value >= level), None)


def _spread(values: list[float]) -> str:
    """``mean ± sample standard deviation`` over seeds (one seed: its value and ``(1 seed)``)."""
    if len(values) == 1:
        return f"{values[0]:+.2f} (1 seed)"
    return f"{statistics.mean(values):+.2f} ± {statistics.stdev(values):.2f}"


def _steps(runs: list[dict]) -> str:
    """The environment steps of ``runs``: one number, or the least and largest where they differ."""
    low, high = min(r["frames"] for r in runs), max(r["frames"] for r in runs)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _cells(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The runs grouped by (environment, policy), each group in seed order, policies in POLICY_ORDER."""
    keys = sorted({(r["env"], r["policy"]) for r in runs},
                  key=lambda k: (k[0], POLICY_ORDER.index(k[1]) if k[1] in POLICY_ORDER else len(POLICY_ORDER), k[1]))
    return {k: sorted((r for r in runs if (r["env"], r["policy"]) == k), key=lambda r: r["seed"]) for k in keys}


def _flag(key: str, value) -> str:
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else f"(no {flag})"
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def differences(run: dict) -> str:
    """The settings of ``run`` that differ from the harness's :data:`DEFAULTS`, as its command-line flags (``-``:
    none); a GTrXL-only setting is not named for another policy, nor the MLP's width for another."""
    flags = [_flag(key, run["args"].get(key, default)) for key, default in DEFAULTS.items()
             if run["args"].get(key, default) != default and ONLY.get(key, run["policy"]) == run["policy"]]
    return " ".join(flags) or "-"


def _shared(runs: list[dict]) -> dict:
    """The PPO loop's arguments, the same in every run (else a one-line error naming two runs that differ)."""
    first = runs[0]
    for key in PPO_ARGS:
        other = next((r for r in runs if r["args"].get(key) != first["args"].get(key)), None)
        if other is not None:
            raise SystemExit(f"{_name(first)} and {_name(other)} differ in --{key.replace('_', '-')} "
                             f"({first['args'].get(key)} and {other['args'].get(key)}): a table compares runs of "
                             "one PPO loop")
    return first["args"]


def footer(runs: list[dict], out: Path) -> str:
    """The machines and packages of ``runs`` (every distinct value), the PPO loop they share, the defaults a row's
    ``-`` stands for, and where the files are."""
    a = _shared(runs)

    def every(key: str) -> str:
        return " / ".join(sorted({str(r["machine"].get(key)) for r in runs}))

    d = DEFAULTS
    return (f"({every('cpu')}, {every('threads')} thread(s) per run, torch {every('torch')}, torchrl "
            f"{every('torchrl')}; PPO: {a['envs']} environments × {a['horizon']} steps per batch, {a['epochs']} "
            f"epochs of {a['minibatches']} minibatches, γ {a['gamma']}, λ {a['lmbda']}, entropy {a['entropy']}, "
            f"trunks within {a['param_budget']:.0%} of the GTrXL's parameters; other settings as the harness's "
            f"defaults: d_model {d['d_model']}, {d['n_layer']} layers, lr {d['lr']:g}, GTrXL mem_len "
            f"{d['mem_len']}, {d['gating']} gate, gate bias {d['gate_bias']:g}; mean ± sample deviation over seeds; "
            f"bold: the highest mean MMER of its task, as rounded (no significance test); wall times are not a "
            f"speed figure; files: `{out.as_posix()}/*.json`)")


def suite_table(runs: list[dict], out: Path) -> str:
    """Per task and policy: the final return and the MMER (over seeds, then each seed), the environment steps of
    the runs, the settings that differ from the harness's defaults, and the wall times. The best mean MMER of each
    task, as rounded, is in bold (every row that ties)."""
    cells = _cells(runs)
    shown = {k: round(statistics.mean(mmer(r) for r in mine), 2) for k, mine in cells.items()}
    best = {env: max(v for (e, _), v in shown.items() if e == env) for env, _ in cells}
    rows = ["| task | policy | seeds | final return | MMER | MMER per seed | environment steps | other settings "
            "| wall time per run (s) |", "|---|---|---|---|---|---|---:|---|---|"]
    for (env, policy), mine in cells.items():
        score = _spread([mmer(r) for r in mine])
        rows.append(f"| {env} | {policy} | {len(mine)} | {_spread([final_return(r) for r in mine])} "
                    f"| {f'**{score}**' if shown[env, policy] == best[env] else score} "
                    f"| {', '.join(f'{mmer(r):+.2f}' for r in mine)} | {_steps(mine)} | {differences(mine[0])} "
                    f"| {', '.join(str(round(r['wall_s'])) for r in mine)} |")
    return "\n".join([*rows, "", footer(runs, out)]) + "\n"


def settings_groups(suite: list[dict], variants: dict[str, list[dict]]) -> list[tuple[str, list[dict]]]:
    """``(setting, GTrXL runs)``: the suite's default GTrXL runs of every task some variant ran on, then each
    variant folder's runs of those tasks, named by the flags that differ from the defaults. Two folders of the same
    setting on one task are a one-line error (their curves would merge)."""
    default = [r for r in suite if r["policy"] == "gtrxl" and differences(r) == "-"]
    default_tasks = {r["env"] for r in default}
    groups = [("default", default)]
    seen: set[tuple[str, str]] = set()  # (setting, task) of the folders read so far
    for folder, runs in sorted(variants.items()):
        runs = [r for r in runs if r["policy"] == "gtrxl" and r["env"] in default_tasks]
        for setting in sorted({differences(r) for r in runs}):
            mine = [r for r in runs if differences(r) == setting]
            label = setting if setting != "-" else f"{folder} (as the default)"
            if any((label, r["env"]) in seen for r in mine):
                raise SystemExit(f"settings folder {folder} repeats the setting {label!r} of another folder")
            seen |= {(label, r["env"]) for r in mine}
            groups.append((label, mine))
    tasks = {r["env"] for _, runs in groups[1:] for r in runs}
    return [(label, [r for r in runs if r["env"] in tasks]) for label, runs in groups if runs]


def settings_table(groups: list[tuple[str, list[dict]]], level: float, out: Path) -> str:
    """GTrXL under other settings (:func:`settings_groups`), each beside the default runs of the same task: the
    final return, the MMER, the environment steps of the runs and those at which the running return first reached
    ``level``, per seed."""
    if len(groups) < 2:
        return f"(no settings runs in `{out.as_posix()}`)\n"
    rows = ["| task | setting | seeds | final return | MMER | environment steps | environment steps to reach "
            f"{level} per seed |", "|---|---|---|---|---|---:|---|"]
    for env in sorted({r["env"] for _, runs in groups for r in runs}):
        for label, runs in groups:
            mine = sorted((r for r in runs if r["env"] == env), key=lambda r: r["seed"])
            if mine:
                steps = (first_reaching(r, level) for r in mine)
                reached = ", ".join("never" if s is None else f"{s:,}" for s in steps)
                rows.append(f"| {env} | {label} | {len(mine)} | {_spread([final_return(r) for r in mine])} "
                            f"| {_spread([mmer(r) for r in mine])} | {_steps(mine)} | {reached} |")
    return "\n".join([*rows, "", f"(mean ± sample deviation over seeds; files: `{out.as_posix()}/*/*.json`)"]) + "\n"


def speed_table(speed: dict) -> str:
    """Environment steps per second of each policy acting and learning (:func:`~transformer_xl.experiments.popgym.
    policy_speed`), and each as a ratio to the GRU's measured in the same run."""
    rows, m = speed["rows"], speed["machine"]
    gru = next((r for r in rows if r["policy"] == "gru"), rows[0])
    lines = [f"| policy | trunk parameters | acting (environment steps/s) | × {gru['policy']} | learning "
             f"(environment steps/s) | × {gru['policy']} |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['trunk_params']:,} | {r['acting_steps_per_s']:,.0f} "
                     f"| {r['acting_steps_per_s'] / gru['acting_steps_per_s']:.2f} | {r['learning_steps_per_s']:,.0f} "
                     f"| {r['learning_steps_per_s'] / gru['learning_steps_per_s']:.2f} |")
    r0 = rows[0]
    load = m.get("load_average")
    lines += ["", f"({m['cpu']}, {r0['threads']} thread(s), torch {m['torch']}, torchrl {m['torchrl']}; "
              f"{r0['envs']} environments per acting step, {r0['envs']} × {r0['horizon']} steps per learning pass; "
              + (f"load average {load:.2f} before the run; " if load is not None else "")
              + "the median of 10 timings after one untimed call)"]
    return "\n".join(lines) + "\n"


def curves(runs: list[dict]) -> dict[str, dict[str, tuple[list[int], list[float], list[float], list[float]]]]:
    """Per task and policy: environment steps, and the mean, least and largest running return over seeds at each
    (a seed without a batch there carries its last value forward; the steps every seed reached). A cell whose
    seeds share no such step is left out."""
    found: dict[str, dict] = {}
    for (env, policy), mine in _cells(runs).items():
        series = [dict(running_returns(r["curve"])) for r in mine]
        grid = sorted({f for s in series for f in s if f <= min(max(s) for s in series)})
        filled = []
        for s in series:
            last, values = None, []
            for f in grid:
                last = s.get(f, last)
                values.append(last)
            filled.append(values)
        keep = [i for i in range(len(grid)) if all(v[i] is not None for v in filled)]
        if keep:
            found.setdefault(env, {})[policy] = ([grid[i] for i in keep],
                                                 [statistics.mean(v[i] for v in filled) for i in keep],
                                                 [min(v[i] for v in filled) for i in keep],
                                                 [max(v[i] for v in filled) for i in keep])
    return found


def plot(runs: list[dict], path: Path, *, title: str = "") -> None:
    """One panel per task: each policy's running return against environment steps, the mean over seeds with the
    range of the seeds shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = curves(runs)
    cols = min(len(found), 2)
    rows = (len(found) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.6 * rows), squeeze=False)
    for ax, (env, policies) in zip(axes.flat, found.items()):
        for policy, (steps, mean, low, high) in policies.items():
            seeds = sum(1 for r in runs if r["env"] == env and r["policy"] == policy)
            ax.plot(steps, mean, label=f"{policy} ({seeds} seeds)")
            ax.fill_between(steps, low, high, alpha=0.2)
        ax.set_title(env)
        ax.set_xlabel("environment steps")
        ax.set_ylabel(f"mean return (latest ≥ {WINDOW} episodes)")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(found):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _marker(name: str) -> tuple[str, str]:
    return f"<!-- {name}: generated by benchmarks/popgym_ppo.py --docs -->", f"<!-- end of {name} -->"


def _speed_file(suite: Path) -> dict:
    files = sorted(suite.glob("*_speed.json"))
    if len(files) != 1:
        raise SystemExit(f"{len(files)} speed files (*_speed.json) in {suite}, one wanted: run popgym_ppo.py --speed "
                         "--out there once")
    try:
        speed = json.loads(files[0].read_text(encoding="utf-8"))
        if not speed["rows"] or not all({"policy", "acting_steps_per_s", "learning_steps_per_s"} <= set(r)
                                        for r in speed["rows"]):
            raise ValueError("no rows of policies and rates")
        speed["machine"]["cpu"]
    except (ValueError, TypeError, KeyError) as err:
        raise SystemExit(f"{files[0]}: not a speed file of popgym_ppo.py ({err})") from None
    return speed


def _inputs(root: Path) -> tuple[list[dict], dict, list[tuple[str, list[dict]]]]:
    """The suite's runs, its speed file and the settings groups under ``root``."""
    suite = load_runs(root / "suite")
    if not suite:
        raise SystemExit(f"no run files (*_seed*.json) in {root / 'suite'}")
    variants = {d.name: load_runs(d) for d in sorted((root / "settings").glob("*")) if d.is_dir()}
    return suite, _speed_file(root / "suite"), settings_groups(suite, variants)


def _blocks(suite: list[dict], speed: dict, groups: list[tuple[str, list[dict]]], shown: str) -> dict[str, str]:
    return {"popgym table": suite_table(suite, Path(shown) / "suite"), "popgym speed": speed_table(speed),
            "popgym settings": settings_table(groups, 0.9, Path(shown) / "settings")}


def blocks(root: Path, shown: str = "benchmarks/results/popgym") -> dict[str, str]:
    """The generated parts of the agents page, by marker name: the suite table (``root/suite``), the speed table
    (``root/suite/*_speed.json``) and the settings table (``root/settings/<name>`` beside the suite's GTrXL runs).
    ``shown`` is how the page names ``root``."""
    return _blocks(*_inputs(root), shown)


def write_docs(root: Path, doc: Path, shown: str = "benchmarks/results/popgym") -> None:
    """Replace the text between each marker pair of ``doc`` with its block of :func:`blocks`, and draw the curves
    beside it: ``popgym-suite.png`` (every task and policy) and ``popgym-settings.png`` (GTrXL's settings)."""
    suite, speed, groups = _inputs(root)  # the run files, read once for the tables and the figures
    page = doc.read_text(encoding="utf-8")
    for name, text in _blocks(suite, speed, groups, shown).items():
        start, end = _marker(name)
        if start + "\n" not in page or end not in page.split(start + "\n", 1)[1]:
            raise SystemExit(f"{doc} has no {start} line followed by {end}")
        head, rest = page.split(start + "\n", 1)
        page = head + start + "\n" + text + end + rest.split(end, 1)[1]
    doc.write_text(page, encoding="utf-8")
    plot(suite, doc.parent / "popgym-suite.png")
    if len(groups) > 1:
        plot([{**r, "policy": label} for label, runs in groups for r in runs], doc.parent / "popgym-settings.png",
             title="GTrXL under other settings")
