"""PPO on a POPGym memory task: GTrXL (``TransformerXLSequence`` through TorchRL) against TorchRL's GRU and LSTM
and a memory-less MLP policy, each trunk within ``--param-budget`` of the GTrXL trunk's parameter count.

Usage (``pip install -e '.[rl]'``)::

    OMP_NUM_THREADS=1 python benchmarks/popgym_ppo.py --env CountRecallEasy --policy gtrxl gru lstm mlp \\
        --seeds 0 1 2 --frames 250000 --out runs/popgym
    OMP_NUM_THREADS=1 python benchmarks/popgym_ppo.py --speed --policy gtrxl gru lstm mlp --out runs/popgym
    python benchmarks/popgym_ppo.py --docs benchmarks/results/popgym   # docs/agents.md's tables and figures

For each policy and seed: PPO built from TorchRL's pieces (``SerialEnv`` of POPGym environments with
``InitTracker`` and ``RewardSum``, the ``Collector``, ``ClipPPOLoss``, the functional GAE), ``--envs`` environments
stepped together for ``--horizon`` steps per batch. Observations of every space POPGym uses become one
float vector (discrete parts one-hot). The recurrent policies' state rides in the tensordict
(:mod:`transformer_xl.integrations.rl`, TorchRL's ``GRUModule``/``LSTMModule``, each with its primer); the learning pass
runs each environment's ``horizon`` steps as one sequence from the state stored at its first step (recurrent mode),
which recomputes the acting-time outputs. Actor and critic share the trunk. The pieces are in
:mod:`transformer_xl.experiments.popgym`.

Writes ``OUT/<env>_<policy>_seed<k>.json`` (mean return of the episodes finished in each batch against environment
steps, each trunk's parameter count, the arguments, wall time, CPU and package versions) and ``OUT/<env>.png``
(return against steps, mean over the seeds with their range, from every run of that environment in OUT: seeds
may run as separate processes). ``--docs ROOT`` makes the agents page's tables and figures from ``ROOT/suite`` (the
runs and one speed file) and ``ROOT/settings/<folder>`` (GTrXL's settings runs):
:mod:`transformer_xl.experiments.popgym_report`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from transformer_xl.experiments import popgym_report as report
from transformer_xl.experiments.popgym import add_ppo_arguments, policy_speed, train


def machine(load: float) -> dict:
    """The CPU (model and the flags that matter), threads, package versions, and ``load``: the 1-minute load
    average taken before the measurement (two runs at a time on two cores show about 2)."""
    import tensordict
    import torchrl

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    cpu += " (" + ", ".join(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_tile")) + ")"
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__, "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__, "python": platform.python_version(),
            "load_average": load}


DOC = Path(__file__).resolve().parents[1] / "docs" / "agents.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_ppo_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/popgym"))
    parser.add_argument("--table", action="store_true", help="print the table of the runs in --out and stop")
    parser.add_argument("--docs", type=Path, metavar="ROOT",
                        help="write the tables and figures of ROOT/suite, ROOT/settings/* and the speed file in "
                             "ROOT/suite into docs/agents.md and docs/, and stop")
    parser.add_argument("--speed", action="store_true",
                        help="time each policy's acting step and learning pass (no training); OUT/<env>_speed.json")
    args = parser.parse_args()
    if args.docs:
        report.write_docs(args.docs, DOC)
        return
    if args.table:
        runs = report.load_runs(args.out)
        if not runs:
            raise SystemExit(f"no run files (*_seed*.json) in {args.out}")
        print(report.suite_table(runs, args.out), end="")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.speed:
        load = os.getloadavg()[0]
        rows = [policy_speed(policy, args) for policy in args.policy]
        for r in rows:
            print(f"{r['policy']}: acting {r['acting_steps_per_s']:,.0f} env-steps/s, learning "
                  f"{r['learning_steps_per_s']:,.0f} env-steps/s ({r['trunk_params']:,} trunk parameters)")
        (args.out / f"{args.env}_speed.json").write_text(json.dumps({"rows": rows, "machine": machine(load)}, indent=1)
                                                         + "\n")
        return
    results = []
    for policy in args.policy:
        for seed in args.seeds:
            load = os.getloadavg()[0]
            result = {**train(policy, seed, args), "machine": machine(load)}
            result["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in result["args"].items()}
            path = args.out / f"{args.env}_{policy}_seed{seed}.json"
            path.with_suffix(".part").write_text(json.dumps(result, indent=1) + "\n")
            path.with_suffix(".part").replace(path)  # whole, for the other runs' plots reading OUT meanwhile
            results.append(result)
    every = [r for r in report.load_runs(args.out) if r["env"] == args.env]
    report.plot(every, args.out / f"{args.env}.png")  # every run of this env in OUT (seeds may run as processes)
    print(f"wrote {args.out}/{args.env}_*.json and {args.env}.png")


if __name__ == "__main__":
    main()
