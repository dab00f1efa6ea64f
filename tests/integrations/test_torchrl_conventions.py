"""TorchRL's own conventions for recurrent modules, checked on :class:`TransformerXLModule` and, with the same test
body, on TorchRL's ``LSTMModule``: a convention both pass is TorchRL's, not a quirk of ours. Each test names the
TorchRL test or example it mirrors (``test/modules/test_rnn.py`` of pytorch/rl unless said otherwise); what
``tests/integrations/test_rl.py`` covers already (the primer's zeros, acting carrying the memory, the learning pass
over a rollout, the gradient stop) is not repeated."""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("torchrl")
pytest.importorskip("popgym")

from tensordict import TensorDict, pad
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymWrapper, InitTracker, SerialEnv, TensorDictPrimer, TransformedEnv
from torchrl.envs.utils import check_env_specs, step_mdp
from torchrl.modules import LSTMModule, ProbabilisticActor, QValueModule, set_recurrent_mode
from torchrl.modules.utils import get_env_transforms_from_module, get_primers_from_module
from torchrl.objectives import DQNLoss, SoftUpdate
from torchrl.objectives.value import GAE

from tests.integrations.popgym_envs import short_repeat_previous
from transformer_xl import SequenceConfig
from transformer_xl.integrations.rl import TransformerXLModule

CFG = SequenceConfig(d_in=4, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=4)
KINDS = ["txl", "lstm"]
TOL = {"rtol": 1e-5, "atol": 1e-5}


_Short = short_repeat_previous(5)  # episodes of 5 steps: a short rollout crosses their boundaries


def _memory(kind: str, **kwargs):
    """Ours or TorchRL's LSTM, ``obs [*, 4] -> features [*, 16]``, with their default state keys."""
    torch.manual_seed(0)
    if kind == "txl":
        return TransformerXLModule(CFG, in_key="obs", out_key="features", **kwargs)
    return LSTMModule(input_size=CFG.d_in, hidden_size=CFG.d_model, in_key="obs", out_key="features", **kwargs)


def _state_keys(memory) -> list[str]:
    """The keys a module carries from step to step: read at the root, written under ``"next"``."""
    return [key for key in memory.in_keys[1:] if key != "is_init"]


def _agent(memory) -> tuple[TensorDictSequential, TensorDictSequential]:
    """A critic (``observation -> state_value``) and a greedy policy sharing it (``-> logits -> action``)."""
    torch.manual_seed(1)
    cast = TensorDictModule(lambda o: o.float(), in_keys=["observation"], out_keys=["obs"])
    value = TensorDictModule(torch.nn.Linear(CFG.d_model, 1), in_keys=["features"], out_keys=["state_value"])
    critic = TensorDictSequential(cast, memory, value)
    logits = TensorDictModule(torch.nn.Linear(CFG.d_model, 4), in_keys=["features"], out_keys=["logits"])
    greedy = TensorDictModule(lambda x: torch.nn.functional.one_hot(x.argmax(-1), 4), in_keys=["logits"],
                              out_keys=["action"])
    return critic, TensorDictSequential(critic, logits, greedy)


def _env(memory, n_env: int = 2) -> TransformedEnv:
    env = TransformedEnv(SerialEnv(n_env, lambda: GymWrapper(_Short())), InitTracker())
    env.append_transform(memory.make_tensordict_primer())
    env.set_seed(0)
    return env


def _steps(shape: list[int], t: int | None = None, seed: int = 0) -> TensorDict:
    """Observations ``[*shape, (t,) 4]`` under ``obs`` with an all-False ``is_init``, no state (a fresh start)."""
    batch = [*shape] if t is None else [*shape, t]
    obs = torch.randn(*batch, CFG.d_in, generator=torch.Generator().manual_seed(seed))
    return TensorDict({"obs": obs, "is_init": torch.zeros(*batch, 1, dtype=torch.bool)}, batch)


# ------------------------------------------------------------------------------------------ environments, primer
def _batched_rollouts(kind: str, within: bool) -> list[TensorDict]:
    memory = _memory(kind)
    cast = TensorDictModule(lambda o: o.float(), in_keys=["observation"], out_keys=["obs"])
    torch.manual_seed(1)
    logits = TensorDictModule(torch.nn.Linear(CFG.d_model, 4), in_keys=["features"], out_keys=["logits"])
    actor = ProbabilisticActor(TensorDictSequential(cast, memory, logits), in_keys=["logits"], out_keys=["action"],
                               distribution_class=torch.distributions.OneHotCategorical, return_log_prob=True)

    def make() -> TransformedEnv:
        env = TransformedEnv(GymWrapper(_Short()), InitTracker())
        if within:
            env.append_transform(memory.make_tensordict_primer())
        return env

    env = SerialEnv(3, make)
    if not within:
        env = TransformedEnv(env, InitTracker())
        env.append_transform(memory.make_tensordict_primer())
    out = []
    for break_when_any_done in (False, True):
        env.set_seed(0)
        torch.manual_seed(2)
        with torch.no_grad():
            data = env.rollout(8, actor, break_when_any_done=break_when_any_done)
        for key in _state_keys(memory):
            stepped = data["next", key].flatten(data.ndim)
            assert stepped.ne(0).any(-1).all()  # every step wrote a state
            assert data[key].ne(0).any()  # and the batched env carried it to the next step
        out.append(data)
    env.close()
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_a_batched_env_carries_the_state_with_the_primer_inside_or_outside(kind: str) -> None:
    """Mirrors ``TestLSTMModule.test_lstm_parallel_env`` and ``test_lstm_parallel_within`` (SerialEnv only: no
    subprocesses here): the primer in every sub-environment or once on the batched one gives the same rollouts,
    with and without ``break_when_any_done``, through a ``ProbabilisticActor``."""
    inside, outside = _batched_rollouts(kind, True), _batched_rollouts(kind, False)
    assert inside[0].shape == (3, 8) and inside[1].shape == (3, 5)  # the episodes are 5 steps long
    for a, b in zip(inside, outside):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            torch.testing.assert_close(a[key], b[key])


@pytest.mark.parametrize("kind", KINDS)
def test_the_primer_declares_the_state_in_the_specs_of_the_batch(kind: str) -> None:
    """Mirrors the note of ``LSTMModule.make_tensordict_primer`` (the state keys must be in the environment's specs
    for ``step_mdp`` and batched environments to move them) and TorchRL's ``check_env_specs``."""
    memory = _memory(kind)
    env = _env(memory)
    reset = env.reset()
    for key in _state_keys(memory):
        spec = env.full_state_spec[key]
        assert spec.shape[0] == 2 and spec.shape == reset[key].shape  # expanded to the batch of 2
        assert key in env.observation_spec
        assert not reset[key].any()
    check_env_specs(env)
    env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_torchrl_finds_the_primer_inside_a_policy_and_a_collector_adds_it(kind: str) -> None:
    """Mirrors ``test_get_primers_from_module``, ``test_get_env_transforms_from_module_lstm`` and
    ``test_collector_adds_recurrent_env_transforms``: the module nested in a policy is found, and a collector over a
    bare environment adds ``InitTracker`` and the primer itself, then carries the state."""
    memory = _memory(kind)
    _, policy = _agent(memory)
    primer = get_primers_from_module(policy)
    assert isinstance(primer, TensorDictPrimer)
    assert set(primer.primers.keys()) == set(_state_keys(memory))
    transforms = get_env_transforms_from_module(policy)
    assert [type(t) for t in transforms] == [InitTracker, TensorDictPrimer]
    collector = Collector(GymWrapper(_Short()), policy, frames_per_batch=12, total_frames=12,
                          auto_register_policy_transforms=True)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    starts = batch["is_init"].squeeze(-1)
    assert starts.tolist() == [i % 5 == 0 for i in range(12)]
    for key in _state_keys(memory):
        carried = ~starts[1:]
        assert batch["next", key].flatten(1).ne(0).any(-1).all()  # every step wrote a state
        torch.testing.assert_close(batch[key][1:][carried], batch["next", key][:-1][carried])
        assert not batch[key][starts].any()


# ------------------------------------------------------------------------------------------ steps and segments
@pytest.mark.parametrize("shape", [[], [2], [2, 3]])
@pytest.mark.parametrize("kind", KINDS)
def test_a_single_step_then_step_mdp_moves_the_state_on(kind: str, shape: list[int]) -> None:
    """Mirrors ``TestLSTMModule.test_single_step``: any batch shape (a 0-d tensordict too), no state in the first
    tensordict (a fresh start); ``step_mdp`` moves the written state to the root and the next call reads it."""
    memory = _memory(kind)
    td = memory(_steps(shape, seed=1))
    nxt = step_mdp(td, keep_other=True)
    nxt["obs"] = _steps(shape, seed=2)["obs"]
    nxt = memory(nxt)
    assert nxt["features"].shape == (*shape, CFG.d_model)
    for key in memory.out_keys[1:]:
        assert td[key].shape[: len(shape)] == tuple(shape)
        assert not torch.equal(nxt[key], td[key])
    fresh = memory(_steps(shape, seed=2))  # the same observation without the state read
    assert not torch.allclose(nxt["features"], fresh["features"])


@pytest.mark.parametrize("shape", [[], [2], [2, 3]])
@pytest.mark.parametrize("kind", KINDS)
def test_consecutive_steps_give_the_recurrent_mode_outputs(kind: str, shape: list[int]) -> None:
    """Mirrors ``TestLSTMModule.test_multi_consecutive`` (``is_init`` at step 13 of the first row, 20 steps: longer
    than our memory) but compares every step, not only the last: acting step by step with ``step_mdp`` gives what
    one recurrent-mode call over ``[*shape, T]`` gives."""
    memory = _memory(kind)
    seq = _steps(shape, t=20)
    seq["is_init"][(0,) * len(shape) + (13,)] = True
    with set_recurrent_mode(True), torch.no_grad():
        memory(seq)
    td = _steps(shape)
    outs = []
    with torch.no_grad():
        for t in range(20):
            td["obs"] = seq["obs"][..., t, :]
            td["is_init"] = seq["is_init"][..., t, :]
            outs.append(memory(td)["features"])
            td = step_mdp(td, keep_other=True)
    torch.testing.assert_close(torch.stack(outs, -2), seq["features"], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_and_non_contiguous_tensordicts(kind: str) -> None:
    """Mirrors ``TestLSTMModule.test_noncontiguous`` (a tensordict padded by ``tensordict.pad``) and
    ``test_lstm_module_backends_non_contiguous_recurrent_inputs`` (time-major storage read as ``[B, T]`` through a
    transpose): same outputs as contiguous copies."""
    memory = _memory(kind)
    padded = pad(_steps([3]), [0, 5])
    with torch.no_grad():
        out = memory(padded)
        ref = memory(padded.contiguous().clone())
    assert out["features"].shape == (8, CFG.d_model)
    torch.testing.assert_close(out["features"], ref["features"])
    time_major = _steps([6], t=4)  # [T=6, B=4] storage
    seq = TensorDict({"obs": time_major["obs"].transpose(0, 1), "is_init": time_major["is_init"].transpose(0, 1)},
                     [4, 6])
    seq["is_init"][1, 2] = True
    assert not seq["obs"].is_contiguous()
    with set_recurrent_mode(True), torch.no_grad():
        memory(seq)
        ref = memory(seq.contiguous().clone())
    torch.testing.assert_close(seq["features"], ref["features"])


@pytest.mark.parametrize("default", [False, True, None])
@pytest.mark.parametrize("kind", KINDS)
def test_set_recurrent_mode_nests_and_stays_in_its_thread(kind: str, default: bool | None) -> None:
    """Mirrors ``TestLSTMModule.test_set_recurrent_mode`` (``default_recurrent_mode`` of None reads as False;
    nested contexts, by bool or by name) and ``test_set_recurrent_mode_is_thread_local``."""
    memory = _memory(kind, default_recurrent_mode=default)
    assert memory.recurrent_mode is bool(default)
    with set_recurrent_mode(True):
        assert memory.recurrent_mode
        with set_recurrent_mode("sequential"):
            assert not memory.recurrent_mode
            with set_recurrent_mode("recurrent"):
                assert memory.recurrent_mode
            assert not memory.recurrent_mode
        seen = []
        thread = threading.Thread(target=lambda: seen.append(memory.recurrent_mode))
        thread.start()
        thread.join()
        assert seen == [bool(default)]
    assert memory.recurrent_mode is bool(default)


# ------------------------------------------------------------------------------------------ learning pipelines
@pytest.mark.parametrize("layout", ["flat", "rows"])
@pytest.mark.parametrize("kind", KINDS)
def test_slices_of_a_replay_buffer_recompute_the_acting_outputs(kind: str, layout: str) -> None:
    """Mirrors ``TestLSTMRecurrentStateLifecycle.test_lstm_collector_replay_mid_batch_done_resets_hidden_state``
    (collector -> replay buffer with ``SliceSampler`` -> recurrent mode) with slices that start mid-episode:
    ``SliceSampler`` marks every slice start with ``is_init`` so that a recurrent module restarts there from the
    state stored at that step (``SliceSampler._maybe_emit_init_marker``). The sample is read as TorchRL suggests
    (``flat``: the concatenated slices as one sequence) and as its lifecycle test does (``rows``: reshaped
    ``[slices, len]``); the gradient reaches the module's weights."""
    memory = _memory(kind)
    _, policy = _agent(memory)
    env = TransformedEnv(GymWrapper(_Short()), InitTracker())
    env.append_transform(memory.make_tensordict_primer())
    env.set_seed(0)
    collector = Collector(env, policy, frames_per_batch=30, total_frames=30)
    try:
        data = next(iter(collector))
    finally:
        collector.shutdown()
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=SliceSampler(
        slice_len=3, traj_key=("collector", "traj_ids"), strict_length=True))
    buffer.extend(data)
    torch.manual_seed(3)
    sample = buffer.sample(24)  # 8 slices of 3 steps, concatenated
    stored = sample[_state_keys(memory)[0]].reshape(8, 3, -1)[:, 0]
    assert sample["is_init"].reshape(8, 3)[:, 0].all()  # the sampler's marks
    assert stored.ne(0).any(-1).sum() >= 2  # some slices start mid-episode, from a stored state
    acting = sample["features"].clone()
    seg = sample.exclude("features") if layout == "flat" else sample.exclude("features").reshape(8, 3)
    with set_recurrent_mode(True):
        memory(seg)
    torch.testing.assert_close(seg["features"].reshape(24, -1).detach(), acting, **TOL)
    seg["features"].square().sum().backward()  # the pieces train the module
    assert all(p.grad is not None for p in memory.parameters() if p.dim() > 1)


@pytest.mark.parametrize("kind", KINDS)
def test_gae_over_a_recurrent_critic_recomputes_the_acting_values(kind: str) -> None:
    """Mirrors ``test_lstm_module_three_backends_ppo_advantage_parity`` (GAE over a recurrent critic) and the note of
    ``torchrl.objectives.value.GAE`` on recurrent value networks: with ``shifted=False`` the ``"next"`` row is read
    with the root's ``is_init`` as boundaries, where the state stored under ``"next"`` restarts it; the values and
    the next values equal those the critic gave while acting."""
    memory = _memory(kind)
    critic, policy = _agent(memory)
    env = _env(memory)
    with torch.no_grad():
        data = env.rollout(12, policy, break_when_any_done=False)
    env.close()
    acting = data["state_value"].clone()
    gae = GAE(gamma=0.9, lmbda=0.9, value_network=critic, shifted=False, deactivate_vmap=True)
    learn = data.exclude("state_value", "features", "logits")
    with set_recurrent_mode(True), torch.no_grad():
        gae(learn)
    torch.testing.assert_close(learn["state_value"], acting, **TOL)
    follows = ~data["next", "done"][:, :-1]  # the next observation of step t is the observation of step t + 1
    assert data["is_init"][:, :-1][follows].any()  # including the first step of an episode (next: the second)
    torch.testing.assert_close(learn["next", "state_value"][:, :-1][follows], acting[:, 1:][follows], **TOL)
    assert learn["advantage"].isfinite().all()


@pytest.mark.parametrize("kind", KINDS)
def test_a_dqn_loss_runs_the_module_in_recurrent_mode_itself(kind: str) -> None:
    """Mirrors TorchRL's tutorial ``tutorials/sphinx-tutorials/dqn_with_rnn.py`` (the same Q-network acting in a
    collector and inside ``DQNLoss`` with a target copy, ``delay_value=True``) and ``LossModule``'s
    ``set_recurrent_mode(True)`` around ``forward``: no context needed by the caller; the loss trains the module."""
    memory = _memory(kind)
    cast = TensorDictModule(lambda o: o.float(), in_keys=["observation"], out_keys=["obs"])
    head = TensorDictModule(torch.nn.Linear(CFG.d_model, 4), in_keys=["features"], out_keys=["action_value"])
    env = _env(memory)
    qnet = TensorDictSequential(cast, memory, head, QValueModule(spec=env.action_spec_unbatched))
    with torch.no_grad():
        data = env.rollout(10, qnet, break_when_any_done=False)
    env.close()
    loss_fn = DQNLoss(qnet, action_space=env.action_spec_unbatched, delay_value=True)
    updater = SoftUpdate(loss_fn, eps=0.95)
    modes = []
    memory.register_forward_pre_hook(lambda module, args: modes.append(module.recurrent_mode))
    loss = loss_fn(data[:, 3:9].exclude("features", "action_value", "chosen_action_value"))["loss"]
    assert modes and all(modes)  # the value and the target network, both in recurrent mode
    loss.backward()
    assert loss.isfinite()
    assert all(p.grad is not None for p in memory.parameters() if p.dim() > 1)
    updater.step()  # the target copy of the module's parameters follows
