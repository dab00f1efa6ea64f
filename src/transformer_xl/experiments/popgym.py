"""The pieces of ``benchmarks/popgym_ppo.py`` (the ``rl`` extra): POPGym environments whose observations are one float
vector, the four policy trunks (GTrXL, TorchRL's GRU and LSTM, a memory-less MLP) at a matched parameter count, and
one PPO run.

Every trunk reads ``observation`` and writes ``features`` of ``d_model``; actor and critic are linear heads on them.
The recurrent trunks carry their state in the tensordict (a primer per environment, ``is_init`` from
``InitTracker``), and the learning pass runs each environment's ``horizon`` steps as one sequence in recurrent mode
from the state stored at its first step, which recomputes the acting-time outputs."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium.spaces.utils import flatten, flatten_space
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymWrapper, InitTracker, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import (
    GRUModule,
    LSTMModule,
    OneHotCategorical,
    ProbabilisticActor,
    ValueOperator,
    set_recurrent_mode,
)
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value.functional import vec_generalized_advantage_estimate

from transformer_xl import SequenceConfig
from transformer_xl.errors import ConfigError
from transformer_xl.integrations.rl import TransformerXLModule
from transformer_xl.model.gating import GATINGS

POLICIES = ("gtrxl", "gru", "lstm", "mlp")
GATES = {"gru": 3, "lstm": 4}  # weight blocks per recurrent layer (torch.nn.GRU / torch.nn.LSTM)


def add_ppo_arguments(parser: argparse.ArgumentParser) -> None:
    """The environment, policy, size and PPO options (the script adds its output options)."""
    parser.add_argument("--env", default="RepeatPreviousEasy")
    parser.add_argument("--policy", nargs="+", default=["gtrxl", "mlp"], choices=POLICIES)
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
    parser.add_argument("--gating", default="gru", choices=GATINGS, help="GTrXL's gate (residual: none)")
    parser.add_argument("--gate-bias", type=float, default=2.0, help="GTrXL's initial gate bias b_g")
    parser.add_argument("--no-reorder", action="store_true",
                        help="GTrXL without the identity-map reordering (post-LN; only with --gating residual)")
    parser.add_argument("--param-budget", type=float, default=0.05,
                        help="largest relative difference of a trunk's parameter count from the GTrXL trunk's")
    parser.add_argument("--mlp-hidden", type=int, default=None,
                        help="the MLP's width as given (default: matched to the GTrXL trunk's parameter count)")


def popgym_env(name: str) -> gym.Env:
    import popgym.envs as envs

    for module in vars(envs).values():
        if hasattr(module, name):
            return getattr(module, name)()
    raise SystemExit(f"no POPGym environment {name!r} in popgym.envs")


class FloatObservation(gym.ObservationWrapper):
    """Every observation as one float32 vector, whatever its space: gymnasium's ``flatten`` (Discrete and
    MultiDiscrete parts one-hot, MultiBinary parts 0/1, Box parts flattened, the parts of a Tuple or Dict
    concatenated in order), cast to float32, so that every policy reads the same ``[d]`` input."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        try:
            flat = flatten_space(env.observation_space)
        except NotImplementedError as err:
            raise SystemExit(f"cannot flatten the observation space {env.observation_space}: {err}") from None
        self.observation_space = gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32),
                                                dtype=np.float32)

    def observation(self, observation) -> np.ndarray:
        return np.asarray(flatten(self.env.observation_space, observation), dtype=np.float32)


def make_env(name: str, n_envs: int, seed: int) -> TransformedEnv:
    actions = popgym_env(name).action_space
    if not isinstance(actions, gym.spaces.Discrete):  # the actor is one categorical distribution
        raise SystemExit(f"{name}: only a Discrete action space is supported, got {actions}")
    env = TransformedEnv(SerialEnv(n_envs, lambda: GymWrapper(FloatObservation(popgym_env(name)))),
                         Compose(InitTracker(), RewardSum()))
    env.set_seed(seed)
    return env


def trunk_size(policy: str, obs_dim: int, hidden: int, d_model: int) -> int:
    """The parameter count of a GRU, LSTM or MLP trunk of width ``hidden`` (closed form: torch's GRU/LSTM have
    ``gates * hidden * (obs_dim + hidden + 2)`` parameters; the MLP's first layer ``hidden * (obs_dim + 1)``), each
    followed by the linear layer to ``d_model`` features."""
    head = hidden * d_model + d_model
    if policy in GATES:
        return GATES[policy] * hidden * (obs_dim + hidden + 2) + head
    return hidden * (obs_dim + 1) + head


def matched_hidden(policy: str, obs_dim: int, d_model: int, target: int) -> int:
    """The width whose trunk's parameter count is nearest ``target`` (the GTrXL trunk's)."""
    hi = 1
    while trunk_size(policy, obs_dim, hi, d_model) < target:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:  # the smallest width reaching target lies in (lo, hi]
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if trunk_size(policy, obs_dim, mid, d_model) < target else (lo, mid)
    return min((max(1, hi - 1), hi), key=lambda h: abs(trunk_size(policy, obs_dim, h, d_model) - target))


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@dataclass
class Agent:
    """``trunk`` writes ``features`` from ``observation``; ``recurrent`` is its module that needs a primer (None:
    the MLP); ``hidden`` the width chosen for the parameter budget (None: the GTrXL, whose size sets the budget)."""

    trunk: nn.Module
    recurrent: nn.Module | None
    actor: ProbabilisticActor
    critic: nn.Module
    hidden: int | None
    trunk_params: int
    target_params: int


def make_agent(policy: str, obs_dim: int, n_act: int, args: argparse.Namespace) -> Agent:
    d = args.d_model
    try:
        cfg = SequenceConfig(d_in=obs_dim, n_layer=args.n_layer, n_head=4, d_model=d, d_head=d // 4, d_inner=2 * d,
                             mem_len=args.mem_len, gating=getattr(args, "gating", "gru"),
                             gate_bias=getattr(args, "gate_bias", 2.0), reorder=not getattr(args, "no_reorder", False))
    except ConfigError as err:  # e.g. --no-reorder with a gate: one line, not a traceback
        raise SystemExit(f"GTrXL settings: {err}") from None
    gtrxl = TransformerXLModule(cfg, in_key="observation", out_key="features")
    target = n_params(gtrxl)
    hidden = None if policy == "gtrxl" else matched_hidden(policy, obs_dim, d, target)
    fixed = policy == "mlp" and getattr(args, "mlp_hidden", None) is not None
    hidden = args.mlp_hidden if fixed else hidden
    to_features = TensorDictModule(nn.Sequential(nn.Linear(hidden or d, d), nn.Tanh()), in_keys=["rnn"],
                                   out_keys=["features"])
    if policy == "gtrxl":
        trunk = recurrent = gtrxl
    elif policy in GATES:
        rnn = GRUModule if policy == "gru" else LSTMModule
        recurrent = rnn(input_size=obs_dim, hidden_size=hidden, in_key="observation", out_key="rnn")
        trunk = TensorDictSequential(recurrent, to_features)
    else:
        recurrent = None
        trunk = TensorDictModule(nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, d), nn.Tanh()),
                                 in_keys=["observation"], out_keys=["features"])
    head = TensorDictModule(nn.Linear(d, n_act), in_keys=["features"], out_keys=["logits"])
    actor = ProbabilisticActor(TensorDictSequential(trunk, head), in_keys=["logits"], out_keys=["action"],
                               distribution_class=OneHotCategorical, return_log_prob=True)
    critic = TensorDictSequential(trunk, ValueOperator(nn.Linear(d, 1), in_keys=["features"]))
    count = n_params(trunk)
    if not fixed and abs(count - target) > args.param_budget * target:
        raise SystemExit(f"{policy} trunk has {count} parameters, more than {args.param_budget:.0%} away from the "
                         f"GTrXL trunk's {target}")
    return Agent(trunk, recurrent, actor, critic, hidden, count, target)


def advantages(data, critic: nn.Module, args: argparse.Namespace) -> None:  # data: an [envs, T] TensorDict
    """GAE over each environment's ``T`` steps: the critic in recurrent mode over the segment, and one more step
    (acting mode, from the stored next state) for the value after the last step."""
    with torch.no_grad():
        with set_recurrent_mode(True):
            values = critic(data.select(*critic.in_keys, strict=False).clone())["state_value"]  # [E, T, 1]
        last = data[:, -1]["next"].select(*critic.in_keys, strict=False).clone()
        # the step after the batch continues its episode (where the episode ended, GAE masks its value by done)
        last["is_init"] = torch.zeros_like(data[:, -1]["is_init"])
        last_value = critic(last)["state_value"]  # [E, 1]
    next_values = torch.cat([values[:, 1:], last_value[:, None]], dim=1)
    adv, target = vec_generalized_advantage_estimate(
        args.gamma, args.lmbda, values, next_values, data["next", "reward"], data["next", "done"],
        data["next", "terminated"], time_dim=-2)
    data.set("advantage", adv)
    data.set("value_target", target)


def learning_loss(loss: ClipPPOLoss, rows):
    """The PPO loss over ``rows`` (``[envs, T]``), each row one sequence in recurrent mode from the state stored at
    its first step (TorchRL's losses enter recurrent mode themselves; the context says so here as well)."""
    with set_recurrent_mode(True):
        return loss(rows.clone())


def setup(policy: str, seed: int, args: argparse.Namespace) -> tuple[TransformedEnv, Agent]:
    """The seeded environments and agent, with the primer of the agent's recurrent module (if any) appended."""
    torch.manual_seed(seed)
    env = make_env(args.env, args.envs, seed)
    agent = make_agent(policy, env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1], args)
    if agent.recurrent is not None:
        env.append_transform(agent.recurrent.make_tensordict_primer())
    return env, agent


def train(policy: str, seed: int, args: argparse.Namespace) -> dict:
    env, agent = setup(policy, seed, args)
    print(f"{policy}: trunk of {agent.trunk_params} parameters (GTrXL {agent.target_params}), width {agent.hidden}",
          flush=True)
    loss = ClipPPOLoss(agent.actor, agent.critic, clip_epsilon=0.2, entropy_coeff=args.entropy,
                       normalize_advantage=True)
    optim = torch.optim.Adam(loss.parameters(), lr=args.lr)
    collector = Collector(env, agent.actor, frames_per_batch=args.envs * args.horizon, total_frames=args.frames)
    curve: list[dict] = []
    start = time.perf_counter()
    frames = 0
    for data in collector:  # [envs, horizon]
        frames += data.numel()
        advantages(data, agent.critic, args)
        for _ in range(args.epochs):
            for rows in data.split(max(1, args.envs // args.minibatches), dim=0):
                out = learning_loss(loss, rows)
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
    return {"env": args.env, "policy": policy, "seed": seed, "curve": curve, "frames": frames,
            "trunk_params": agent.trunk_params, "gtrxl_trunk_params": agent.target_params, "hidden": agent.hidden,
            "params": n_params(loss), "wall_s": time.perf_counter() - start, "args": vars(args)}


def policy_speed(policy: str, args: argparse.Namespace, *, repeats: int = 10) -> dict:
    """What the memory costs, the environments left out: environment steps per second of the policy **acting** (one
    step of ``args.envs`` environments, no gradient, in acting mode from the stored state, as the collector calls
    it) and **learning** (the PPO loss forward and backward over one collected ``[envs, horizon]`` batch in
    recurrent mode, as :func:`train` runs it). The median of ``repeats`` timings of each, after one untimed call."""
    env, agent = setup(policy, 0, args)
    loss = ClipPPOLoss(agent.actor, agent.critic, clip_epsilon=0.2, entropy_coeff=args.entropy,
                       normalize_advantage=True)
    collector = Collector(env, agent.actor, frames_per_batch=args.envs * args.horizon,
                          total_frames=args.envs * args.horizon)
    data = next(iter(collector))
    collector.shutdown()
    advantages(data, agent.critic, args)
    step = data[:, -1].exclude("next", "action", "sample_log_prob", "logits", "features")

    def act() -> None:
        with torch.no_grad():
            agent.actor(step.clone())

    def learn() -> None:
        out = learning_loss(loss, data)
        loss.zero_grad(set_to_none=True)
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()

    def median_seconds(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    acting, learning = median_seconds(act), median_seconds(learn)
    return {"env": args.env, "policy": policy, "envs": args.envs, "horizon": args.horizon,
            "threads": torch.get_num_threads(), "trunk_params": agent.trunk_params,
            "acting_steps_per_s": args.envs / acting, "learning_steps_per_s": args.envs * args.horizon / learning}
