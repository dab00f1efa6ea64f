"""PPO on a POPGym memory task: GTrXL (``TransformerXLSequence`` through TorchRL) against a memory-less MLP policy.

Usage (``pip install -e '.[rl]'``)::

    python benchmarks/popgym_ppo.py --env RepeatPreviousEasy --policy gtrxl mlp --seeds 0 1 2 \\
        --frames 500000 --out benchmarks/results/popgym

For each policy and seed: PPO built from TorchRL's pieces (``SerialEnv`` of POPGym environments with
``InitTracker`` and ``RewardSum``, the ``Collector``, ``ClipPPOLoss``, the functional GAE), ``--envs`` environments
stepped together for ``--horizon`` steps per batch. The GTrXL policy's memory rides in the tensordict
(:mod:`transformer_xl.integrations.rl`); the learning pass runs each environment's ``horizon`` steps as one segment
from the memory stored at its first step (recurrent mode), which recomputes the acting-time outputs exactly. Actor and
critic share the trunk (the memory, or the MLP).

Writes ``OUT/<env>_<policy>_seed<k>.json`` (mean return of the episodes finished in each batch against environment
steps, the arguments, wall time, CPU and package versions) and ``OUT/<env>.png`` (return against steps, mean over the
seeds with their range, from every run of that environment in OUT: seeds may run as separate processes).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymWrapper, InitTracker, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator, set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value.functional import vec_generalized_advantage_estimate

from transformer_xl import SequenceConfig
from transformer_xl.integrations.rl import TransformerXLModule


def popgym_env(name: str):  # -> a gymnasium.Env
    import popgym.envs as envs

    for module in vars(envs).values():
        if hasattr(module, name):
            return getattr(module, name)()
    raise SystemExit(f"no POPGym environment {name!r} in popgym.envs")


def make_env(name: str, n_envs: int, seed: int) -> TransformedEnv:
    env = TransformedEnv(SerialEnv(n_envs, lambda: GymWrapper(popgym_env(name))),
                         Compose(InitTracker(), RewardSum()))
    env.set_seed(seed)
    return env


def make_agent(policy: str, obs_dim: int, n_act: int, args: argparse.Namespace) -> tuple[nn.Module, ...]:
    """``(trunk, actor, critic)``: the trunk writes ``features`` from the float observation ``obs``."""
    to_float = TensorDictModule(lambda o: o.float(), in_keys=["observation"],
                                out_keys=["obs"])
    if policy == "gtrxl":
        cfg = SequenceConfig(d_in=obs_dim, n_layer=args.n_layer, n_head=4, d_model=args.d_model,
                             d_head=args.d_model // 4, d_inner=2 * args.d_model, mem_len=args.mem_len,
                             gating="gru", gate_bias=2.0)
        core = TransformerXLModule(cfg, in_key="obs", out_key="features")
    else:
        mlp = nn.Sequential(nn.Linear(obs_dim, args.d_model), nn.Tanh(), nn.Linear(args.d_model, args.d_model),
                            nn.Tanh())
        core = TensorDictModule(mlp, in_keys=["obs"], out_keys=["features"])
    trunk = TensorDictSequential(to_float, core)
    head = TensorDictModule(nn.Linear(args.d_model, n_act), in_keys=["features"], out_keys=["logits"])
    actor = ProbabilisticActor(TensorDictSequential(trunk, head), in_keys=["logits"], out_keys=["action"],
                               distribution_class=OneHotCategorical, return_log_prob=True)
    critic = TensorDictSequential(trunk, ValueOperator(nn.Linear(args.d_model, 1), in_keys=["features"]))
    return trunk, actor, critic


def advantages(data, critic: nn.Module, args: argparse.Namespace) -> None:  # data: an [envs, T] TensorDict
    """GAE over each environment's ``T`` steps: the critic in recurrent mode over the segment, and one more step
    (acting mode, from the stored next memory) for the value after the last step."""
    with torch.no_grad():
        with set_recurrent_mode(True):
            values = critic(data.select(*critic.in_keys, strict=False).clone())["state_value"]  # [E, T, 1]
        last = data[:, -1]["next"].select(*critic.in_keys, strict=False).clone()
        if "recurrent_state_mems" in last:
            last["is_init"] = torch.zeros_like(data[:, -1]["is_init"])
        last_value = critic(last)["state_value"]  # [E, 1]
    next_values = torch.cat([values[:, 1:], last_value[:, None]], dim=1)
    adv, target = vec_generalized_advantage_estimate(
        args.gamma, args.lmbda, values, next_values, data["next", "reward"], data["next", "done"],
        data["next", "terminated"], time_dim=-2)
    data.set("advantage", adv)
    data.set("value_target", target)


def train(policy: str, seed: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(seed)
    env = make_env(args.env, args.envs, seed)
    obs_dim = env.observation_spec["observation"].shape[-1]
    n_act = env.action_spec.shape[-1]
    trunk, actor, critic = make_agent(policy, obs_dim, n_act, args)
    core = trunk[1]
    if isinstance(core, TransformerXLModule):
        env.append_transform(core.make_tensordict_primer())
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=args.entropy, normalize_advantage=True)
    optim = torch.optim.Adam(loss.parameters(), lr=args.lr)
    collector = Collector(env, actor, frames_per_batch=args.envs * args.horizon, total_frames=args.frames)
    curve: list[dict] = []
    start = time.perf_counter()
    frames = 0
    for data in collector:  # [envs, horizon]
        frames += data.numel()
        advantages(data, critic, args)
        for _ in range(args.epochs):
            for rows in data.split(max(1, args.envs // args.minibatches), dim=0):
                with set_recurrent_mode(True):
                    out = loss(rows.clone())
                total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(loss.parameters(), 0.5)
                optim.step()
        collector.update_policy_weights_()
        done = data["next", "done"].squeeze(-1)
        if done.any():
            ret = data["next", "episode_reward"].squeeze(-1)[done]
            curve.append({"frames": frames, "mean_return": ret.mean().item(), "episodes": int(done.sum())})
            print(f"{policy} seed {seed} frames {frames} return {ret.mean().item():+.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    collector.shutdown()
    return {"env": args.env, "policy": policy, "seed": seed, "curve": curve,
            "wall_s": time.perf_counter() - start, "args": vars(args)}


def machine() -> dict:
    import tensordict
    import torchrl

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    cpu += " (" + ", ".join(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_tile")) + ")"
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__, "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__, "python": platform.python_version()}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in sorted({r["policy"] for r in results}):
        runs = [r["curve"] for r in results if r["policy"] == policy and r["curve"]]
        if not runs:
            continue
        n = min(len(c) for c in runs)
        steps = [runs[0][i]["frames"] for i in range(n)]
        vals = torch.tensor([[c[i]["mean_return"] for i in range(n)] for c in runs])  # [seeds, n]
        ax.plot(steps, vals.mean(0), label=f"{policy} ({len(runs)} seeds)")
        ax.fill_between(steps, vals.min(0).values, vals.max(0).values, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(results[0]["env"])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


DOC = Path(__file__).resolve().parents[1] / "docs" / "agents.md"
START, END = "<!-- popgym table: generated by benchmarks/popgym_ppo.py --docs -->", "<!-- end of popgym table -->"
LAST = 10  # the final score of a run: the mean return of its last LAST batches


def _smoothed(values: list[float]) -> list[float]:
    """The mean of each value and the LAST - 1 before it."""
    return [sum(values[max(0, i - LAST + 1):i + 1]) / len(values[max(0, i - LAST + 1):i + 1])
            for i in range(len(values))]


def table(out: Path) -> str:
    """A Markdown table of every run in ``out``: per environment and policy, the final mean return of each seed
    (its last LAST batches), the environment steps at which that mean first reached 0.9, and the time per run."""
    runs = [json.loads(f.read_text()) for f in sorted(out.glob("*_seed*.json"))]
    if not runs:
        raise SystemExit(f"no run files (*_seed*.json) in {out}")
    rows = [f"| environment | policy | seeds | final mean return per seed (last {LAST} batches) | environment steps "
            "to reach 0.9 | environment steps | wall time per run (s) |", "|---|---|---|---|---|---:|---|"]
    for env, policy in sorted({(r["env"], r["policy"]) for r in runs}):
        mine = sorted((r for r in runs if r["env"] == env and r["policy"] == policy), key=lambda r: r["seed"])
        finals, reached = [], []
        for r in mine:
            smooth = _smoothed([p["mean_return"] for p in r["curve"]])
            finals.append(f"{smooth[-1]:+.2f}")
            first = next((r["curve"][i]["frames"] for i, v in enumerate(smooth) if v >= 0.9), None)
            reached.append("never" if first is None else f"{first:,}")
        rows.append(f"| {env} | {policy} | {', '.join(str(r['seed']) for r in mine)} | {', '.join(finals)} "
                    f"| {', '.join(reached)} | {max(r['curve'][-1]['frames'] for r in mine):,} "
                    f"| {', '.join(str(round(r['wall_s'])) for r in mine)} |")
    m, args = runs[-1]["machine"], runs[-1]["args"]
    rows += ["", f"({m['cpu']}, {m['threads']} thread(s) per run, torch {m['torch']}, torchrl {m['torchrl']}; "
             f"{args['envs']} environments × {args['horizon']} steps per batch, d_model {args['d_model']}, "
             f"{args['n_layer']} layers, mem_len {args['mem_len']}; files: `{out.as_posix()}/*.json`)"]
    return "\n".join(rows) + "\n"


def write_docs(out: Path) -> None:
    """Replace the table between the markers of ``docs/agents.md`` with :func:`table`."""
    head, rest = DOC.read_text(encoding="utf-8").split(START + "\n", 1)
    DOC.write_text(head + START + "\n" + table(out) + END + rest.split(END, 1)[1], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="RepeatPreviousEasy")
    parser.add_argument("--policy", nargs="+", default=["gtrxl", "mlp"], choices=["gtrxl", "mlp"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--frames", type=int, default=200_000, help="environment steps per run")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--horizon", type=int, default=64, help="steps per environment per batch (one segment)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=2, help="of environments (rows), per epoch")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--lmbda", type=float, default=0.95)
    parser.add_argument("--entropy", type=float, default=0.01)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--mem-len", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/popgym"))
    parser.add_argument("--table", action="store_true", help="print the table of the runs in --out and stop")
    parser.add_argument("--docs", action="store_true", help="write that table into docs/agents.md and stop")
    args = parser.parse_args()
    if args.table or args.docs:
        write_docs(args.out) if args.docs else print(table(args.out), end="")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for policy in args.policy:
        for seed in args.seeds:
            result = {**train(policy, seed, args), "machine": machine()}
            result["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in result["args"].items()}
            (args.out / f"{args.env}_{policy}_seed{seed}.json").write_text(json.dumps(result, indent=1) + "\n")
            results.append(result)
    every = [json.loads(f.read_text()) for f in sorted(args.out.glob(f"{args.env}_*_seed*.json"))]
    plot(every, args.out / f"{args.env}.png")  # every run of this env in OUT (seeds may run as separate processes)
    print(f"wrote {args.out}/{args.env}_*.json and {args.env}.png")


if __name__ == "__main__":
    main()
