"""The POPGym PPO harness (:mod:`transformer_xl.experiments.popgym`, run by ``benchmarks/popgym_ppo.py``): observations
of every space kind become one float vector, every policy (GTrXL, GRU, LSTM, MLP) runs a PPO iteration at a matched
parameter count, and the learning pass in recurrent mode recomputes the acting-time log-probabilities of the
collected actions."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")
pytest.importorskip("popgym")

from gymnasium import spaces
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss

from transformer_xl.experiments import popgym as H


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    H.add_ppo_arguments(parser)
    return parser.parse_args(["--d-model", "16", "--n-layer", "1", "--mem-len", "4", "--envs", "2", "--horizon", "30",
                              "--frames", "60", "--epochs", "1", *extra])


def _flat(space: spaces.Space, obs) -> list[float]:
    import gymnasium as gym

    env = gym.Env.__new__(gym.Env)
    env.observation_space, env.action_space = space, spaces.Discrete(2)
    wrapper = H.FloatObservation(env)
    out = wrapper.observation(obs)
    assert out.dtype == np.float32 and wrapper.observation_space.dtype == np.float32
    assert wrapper.observation_space.shape == out.shape
    return out.tolist()


def test_multidiscrete_parts_are_one_hot() -> None:
    assert _flat(spaces.MultiDiscrete([3, 2]), np.array([2, 1])) == [0, 0, 1, 0, 1]


def test_a_tuple_of_discrete_and_box_concatenates_one_hot_and_floats() -> None:
    space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,), dtype=np.float32)))
    assert _flat(space, (1, np.array([0.5, -0.25], dtype=np.float32))) == [0, 1, 0, 0.5, -0.25]


def test_discrete_multibinary_and_dict() -> None:
    assert _flat(spaces.Discrete(4, start=1), 3) == [0, 0, 1, 0]  # one-hot of value - start
    assert _flat(spaces.MultiBinary(3), np.array([1, 0, 1], dtype=np.int8)) == [1, 0, 1]
    space = spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(0, 9, (1,), dtype=np.int64)})
    assert _flat(space, {"a": 1, "b": np.array([7])}) == [0, 1, 7]


@pytest.mark.parametrize(("name", "dim", "parts"), [("RepeatPreviousEasy", 4, 1), ("CountRecallEasy", 4, 2),
                                                    ("AutoencodeEasy", 6, 2), ("HigherLowerEasy", 13, 1)])
def test_popgym_observations_become_float_vectors(name: str, dim: int, parts: int) -> None:
    """RepeatPrevious: Discrete(4); CountRecall: MultiDiscrete([2, 2]); Autoencode: Tuple(Discrete(2), Discrete(4));
    HigherLower: Discrete(13): each a float vector of one-hot parts, one 1 per discrete part."""
    env = H.make_env(name, 2, 0)
    assert env.observation_spec["observation"].shape[-1] == dim
    obs = env.reset()["observation"]
    assert obs.dtype == torch.float32 and obs.shape == (2, dim)
    assert set(obs.unique().tolist()) <= {0.0, 1.0} and obs.sum(-1).tolist() == [parts] * 2
    env.close()


def test_a_non_discrete_action_space_is_one_line() -> None:
    with pytest.raises(SystemExit, match=r"^MineSweeperEasy: only a Discrete action space is supported, got Multi"):
        H.make_env("MineSweeperEasy", 1, 0)


@pytest.mark.parametrize("policy", H.POLICIES)
def test_trunk_sizes_are_counted_and_matched(policy: str) -> None:
    """The closed-form count is the built trunk's, and every trunk lies within the budget of the GTrXL's."""
    args = _args()
    agent = H.make_agent(policy, 6, 4, args)
    assert agent.trunk_params == H.n_params(agent.trunk)
    if agent.hidden is not None:
        assert agent.trunk_params == H.trunk_size(policy, 6, agent.hidden, args.d_model)
    assert abs(agent.trunk_params - agent.target_params) <= args.param_budget * agent.target_params


def test_the_mlp_width_can_be_given() -> None:
    """``--mlp-hidden 64``: the MLP of the published RepeatPrevious rows, whatever the budget says."""
    agent = H.make_agent("mlp", 6, 4, _args("--mlp-hidden", "64"))
    assert agent.hidden == 64 and agent.trunk_params == H.trunk_size("mlp", 6, 64, 16)
    assert H.make_agent("mlp", 6, 4, _args()).hidden != 64  # by default sized to the GTrXL's count


def test_the_reports_defaults_are_the_harnesss() -> None:
    """A table row names the settings that differ from :data:`popgym_report.DEFAULTS`: they must be the parser's."""
    from transformer_xl.experiments.popgym_report import DEFAULTS, PPO_ARGS

    parser = argparse.ArgumentParser()
    H.add_ppo_arguments(parser)
    defaults = vars(parser.parse_args([]))
    assert {k: defaults[k] for k in DEFAULTS} == DEFAULTS
    assert set(PPO_ARGS) <= set(defaults)


def test_the_gtrxl_settings_reach_its_config() -> None:
    """``--gating``, ``--gate-bias`` and ``--no-reorder`` (the settings runs) build the GTrXL they name; a gate
    without the reordering is refused in one line."""
    cfg = H.make_agent("gtrxl", 6, 4, _args("--gating", "residual", "--gate-bias", "0", "--no-reorder")).trunk.config
    assert (cfg.gating, cfg.gate_bias, cfg.reorder, cfg.mem_len) == ("residual", 0.0, False, 4)
    cfg = H.make_agent("gtrxl", 6, 4, _args()).trunk.config
    assert (cfg.gating, cfg.gate_bias, cfg.reorder) == ("gru", 2.0, True)
    with pytest.raises(SystemExit, match="GTrXL settings: gating 'gru' needs reorder=True"):
        H.make_agent("gtrxl", 6, 4, _args("--no-reorder"))


@pytest.mark.parametrize("env", ["RepeatPreviousEasy", "CountRecallEasy"])
@pytest.mark.parametrize("policy", H.POLICIES)
def test_one_ppo_iteration_runs(policy: str, env: str) -> None:
    torch.set_num_threads(1)
    result = H.train(policy, 0, _args("--env", env))
    assert result["frames"] == 60 and result["policy"] == policy
    assert result["trunk_params"] > 0 and result["params"] > result["trunk_params"]


@pytest.mark.parametrize("policy", ["gtrxl", "gru", "lstm"])
def test_the_learning_pass_recomputes_the_acting_log_probs(policy: str) -> None:
    """Two batches of 30 steps from episodes of 51 (so a row of the second batch starts from a carried state and
    crosses an episode start): in recurrent mode, from the state stored at each row's first step only (the stored
    states of the later steps are replaced by noise, except at episode starts), the actor gives the collected actions
    their acting-time log-probabilities, and the harness's PPO loss sees a ratio of 1."""
    args = _args("--env", "CountRecallEasy")
    env, agent = H.setup(policy, 0, args)
    collector = Collector(env, agent.actor, frames_per_batch=60, total_frames=120)
    data = list(collector)[-1].clone()
    collector.shutdown()
    assert data["is_init"][:, 1:].any()
    states = [k for k in data.keys() if isinstance(k, str) and k.startswith("recurrent_state")]  # noqa: SIM118
    assert states
    keep = data["is_init"].squeeze(-1).clone()
    keep[:, 0] = True
    seg = data.clone()
    for key in states:
        noisy = torch.rand_like(seg[key].float()).to(seg[key].dtype)
        mask = keep.reshape(*keep.shape, *[1] * (seg[key].ndim - 2))
        seg[key] = torch.where(mask, seg[key], noisy)
    assert not torch.equal(seg[states[0]], data[states[0]])
    with set_recurrent_mode(True), torch.no_grad():
        dist = agent.actor.get_dist(seg.exclude("logits", "features").clone())
    torch.testing.assert_close(dist.log_prob(data["action"]), data["action_log_prob"], rtol=1e-4, atol=1e-5)
    H.advantages(seg, agent.critic, args)
    loss = ClipPPOLoss(agent.actor, agent.critic, clip_epsilon=0.2, normalize_advantage=True)
    with torch.no_grad():
        out = H.learning_loss(loss, seg)
    # every ratio 1: the GTrXL's gates (bias 2) make a fresh memory's effect small, so the bounds are tight
    assert abs(out["kl_approx"].item()) < 1e-6 and abs(out["max_ratio"].item() - 1) < 1e-5
    assert out["clip_fraction"].item() == 0


@pytest.mark.parametrize("policy", ["gtrxl", "gru", "lstm"])
def test_the_value_after_a_batch_comes_from_the_episodes_memory(policy: str) -> None:
    """GAE's targets against a hand computation: every step's value from the state stored at it (acting mode), and
    the value after the batch from the state the next batch starts from -- the episode's memory, not a fresh one
    (episodes of 51 steps, batches of 30: the first batch's episodes go on)."""
    args = _args("--env", "CountRecallEasy")
    env, agent = H.setup(policy, 0, args)
    collector = Collector(env, agent.actor, frames_per_batch=60, total_frames=120)
    first, second = (b.clone() for b in collector)
    collector.shutdown()
    assert not first["next", "done"][:, -1].any() and not second["is_init"][:, 0].any()
    torch.testing.assert_close(second["observation"][:, 0], first["next", "observation"][:, -1])
    H.advantages(first, agent.critic, args)

    def value(steps, fresh: bool = False):
        steps = steps.select(*agent.critic.in_keys, strict=False).clone()
        if fresh:
            steps["is_init"] = torch.ones_like(steps["is_init"])
        with torch.no_grad(), set_recurrent_mode(False):
            return agent.critic(steps)["state_value"].squeeze(-1)

    values = value(first)
    reward, done, terminated = (first["next", k].squeeze(-1).double() for k in ("reward", "done", "terminated"))

    def targets(after):  # GAE (Schulman et al., 2016), step by step
        v, nxt = values.double(), torch.cat([values[:, 1:], after[:, None]], 1).double()
        advantage, running = torch.zeros_like(v), torch.zeros_like(v[:, 0])
        for t in reversed(range(v.shape[1])):
            delta = reward[:, t] + args.gamma * nxt[:, t] * (1 - terminated[:, t]) - v[:, t]
            running = delta + args.gamma * args.lmbda * (1 - done[:, t]) * running
            advantage[:, t] = running
        return advantage + v

    got = first["value_target"].squeeze(-1).double()
    torch.testing.assert_close(got, targets(value(second[:, 0])), rtol=1e-5, atol=1e-6)
    # from a fresh memory the targets differ by more than that tolerance (the GTrXL's gates make it ~3e-5)
    assert not torch.allclose(got, targets(value(second[:, 0], fresh=True)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("policy", H.POLICIES)
def test_policy_speed_times_acting_and_learning(policy: str) -> None:
    """``--speed``: environment steps per second of one acting step of every environment and of the learning pass
    over a collected batch, the environments left out."""
    torch.set_num_threads(1)
    r = H.policy_speed(policy, _args(), repeats=2)
    assert r["policy"] == policy and r["envs"] == 2 and r["horizon"] == 30 and r["trunk_params"] > 0
    assert r["acting_steps_per_s"] > 0 and r["learning_steps_per_s"] > 0
