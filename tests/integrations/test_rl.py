"""The TorchRL module over the sequence module, through TorchRL's own environment wrapper, transforms and recurrent
mode, on a real POPGym environment: acting carries the memory, resets at episode starts are exact, and the learning
pass over a rollout's stored memories recomputes the acting-time outputs (and the gradient stops at the memory)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl")
popgym_repeat = pytest.importorskip("popgym.envs.repeat_previous")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule, TensorDictSequential  # noqa: E402
from torchrl.envs import Compose, GymWrapper, InitTracker, SerialEnv, TransformedEnv  # noqa: E402
from torchrl.modules import set_recurrent_mode  # noqa: E402

from transformer_xl import SequenceConfig  # noqa: E402
from transformer_xl.integrations.rl import MEMS, VALID, TransformerXLModule  # noqa: E402

CFG = SequenceConfig(d_in=4, n_layer=2, n_head=2, d_model=8, d_head=4, d_inner=16, mem_len=3, gate_bias=0.0)


class _Short(popgym_repeat.RepeatPreviousEasy):
    """RepeatPrevious with episodes of 7 steps, so that a short rollout crosses episode boundaries."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self._steps = getattr(self, "_steps", 0) + 1
        return obs, reward, terminated or self._steps % 7 == 0, truncated, info

    def reset(self, *args, **kwargs):
        self._steps = 0
        return super().reset(*args, **kwargs)


def _policy(seed: int = 0) -> tuple[TransformerXLModule, TensorDictSequential]:
    torch.manual_seed(seed)
    memory = TransformerXLModule(CFG, in_key="obs", out_key="features")
    head = torch.nn.Linear(CFG.d_model, 4)
    policy = TensorDictSequential(
        TensorDictModule(lambda o: o.float(), in_keys=["observation"], out_keys=["obs"]),
        memory,
        TensorDictModule(head, in_keys=["features"], out_keys=["logits"]),
        TensorDictModule(lambda logits: torch.nn.functional.one_hot(logits.argmax(-1), 4), in_keys=["logits"],
                         out_keys=["action"]),
    )
    return memory, policy


def _rollout(steps: int = 20, n_env: int = 2) -> tuple[TransformerXLModule, TensorDictSequential, TensorDict]:
    memory, policy = _policy()
    env = TransformedEnv(SerialEnv(n_env, lambda: GymWrapper(_Short())), Compose(InitTracker()))
    env.append_transform(memory.make_tensordict_primer())
    env.set_seed(0)
    with torch.no_grad():
        data = env.rollout(steps, policy, break_when_any_done=False)
    env.close()
    return memory, policy, data


def test_the_primer_gives_a_fresh_memory_and_acting_carries_it() -> None:
    _, _, data = _rollout()
    assert data.shape == (2, 20)
    assert data[MEMS].shape == (2, 20, CFG.n_layer, CFG.mem_len, CFG.d_model)
    assert not data[VALID][:, 0].any()  # the primer's zeros: no valid position at the start
    assert data["next", VALID][:, 0].tolist() == [[False, False, True]] * 2  # the first step is now in memory
    starts = data["is_init"].squeeze(-1)
    assert starts[:, 0].all() and starts[:, 7].all() and starts[:, 14].all() and starts.sum() == 6
    carried = ~starts[:, 1:]  # the collector moves "next" to the root, but a reset brings the primer's zeros
    torch.testing.assert_close(data[MEMS][:, 1:][carried], data["next", MEMS][:, :-1][carried])
    assert not data[MEMS][:, 1:][~carried].any() and not data[VALID][:, 1:][~carried].any()


def test_the_learning_pass_over_stored_memories_recomputes_acting() -> None:
    """Segments cut anywhere in the rollout (not at episode starts), each from the state stored at its first step:
    the recurrent-mode features equal those computed while acting."""
    _, policy, data = _rollout()
    for beg, end in [(0, 20), (5, 12), (9, 20)]:
        seg = data[:, beg:end].exclude("features", "logits").clone()
        with set_recurrent_mode(True):
            policy(seg)
        torch.testing.assert_close(seg["features"], data[:, beg:end]["features"], rtol=1e-5, atol=1e-6)


def test_a_reset_gives_the_outputs_of_a_fresh_run() -> None:
    """After the episode start at step 7 a row's features are those of a fresh memory run over that episode alone."""
    memory, _, data = _rollout()
    fresh = data[:, 7:14].exclude("features").clone()
    fresh[MEMS] = torch.zeros_like(fresh[MEMS])
    fresh[VALID] = torch.zeros_like(fresh[VALID])
    fresh["is_init"] = torch.zeros_like(fresh["is_init"])  # no reset needed: the memory is empty
    with set_recurrent_mode(True), torch.no_grad():
        memory(fresh)
    torch.testing.assert_close(fresh["features"], data[:, 7:14]["features"], rtol=1e-5, atol=1e-6)


def test_acting_step_by_step_equals_one_recurrent_segment() -> None:
    memory, _, data = _rollout(steps=10, n_env=1)
    seg = data.exclude("features").clone()
    with set_recurrent_mode(True), torch.no_grad():
        memory(seg)
    torch.testing.assert_close(seg["features"], data["features"], rtol=1e-5, atol=1e-6)


def test_the_gradient_stops_at_the_stored_memory() -> None:
    memory, _, data = _rollout()
    seg = data[:, 10:].exclude("features").clone()
    seg[MEMS] = seg[MEMS].clone().requires_grad_()
    seg["obs"] = seg["obs"].clone().requires_grad_()
    with set_recurrent_mode(True):
        memory(seg)
    seg["features"].sum().backward()
    assert seg["obs"].grad.abs().sum() > 0
    assert seg[MEMS].grad is None  # SG(m): the memory is read without a gradient
    assert all(p.grad is not None for p in memory.parameters() if p.requires_grad and p.dim() > 1)
