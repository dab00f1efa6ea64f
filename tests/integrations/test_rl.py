"""The TorchRL module over the sequence module, through TorchRL's own environment wrapper, transforms and recurrent
mode, on a real POPGym environment: acting carries the memory, resets at episode starts are exact, and the learning
pass over a rollout's stored memories recomputes the acting-time outputs (and the gradient stops at the memory)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl")
pytest.importorskip("popgym")

from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.envs import Compose, GymWrapper, InitTracker, SerialEnv, TransformedEnv
from torchrl.modules import set_recurrent_mode

from tests.integrations.popgym_envs import short_repeat_previous
from transformer_xl import ConfigError, SequenceConfig, SequenceState
from transformer_xl.integrations.rl import MEMS, VALID, TransformerXLModule

CFG = SequenceConfig(d_in=4, n_layer=2, n_head=2, d_model=8, d_head=4, d_inner=16, mem_len=3, gate_bias=0.0)


_Short = short_repeat_previous(7)  # episodes of 7 steps: a short rollout crosses their boundaries


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
    assert data[VALID].dtype == data["next", VALID].dtype == torch.bool  # as the module writes it
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


# ------------------------------------------------------------------------------------- tensordicts built by hand
def _steps(*batch: int, seed: int = 0) -> TensorDict:
    """Observations ``[*batch, d_in]`` under the default in_key, without state or is_init."""
    x = torch.randn(*batch, CFG.d_in, generator=torch.Generator().manual_seed(seed))
    return TensorDict({"embed": x}, batch_size=list(batch))


def _module(**kwargs) -> TransformerXLModule:
    torch.manual_seed(0)
    return TransformerXLModule(CFG, **kwargs).eval()


def test_acting_writes_the_declared_keys_of_any_batch_shape() -> None:
    """The default keys; the keys written are the declared ``out_keys``; a ``[2, 3]`` batch of independent steps
    gives what the same steps give as a ``[6]`` batch; no state and no ``is_init`` (no primer, no InitTracker): a
    fresh memory and no boundary."""
    module = _module()
    td = _steps(2, 3)
    with torch.no_grad():
        module(td)
        flat = module(_steps(2, 3).reshape(-1))
        y, nxt = module.memory.step(td["embed"].reshape(6, -1))
    assert set(td.keys(True, True)) - {"embed"} == {"features", ("next", MEMS), ("next", VALID)}
    assert module.out_keys == ["features", ("next", MEMS), ("next", VALID)]
    torch.testing.assert_close(td["features"].reshape(6, -1), flat["features"])
    torch.testing.assert_close(flat["features"], y)
    torch.testing.assert_close(flat["next", MEMS], nxt.mems)
    assert torch.equal(flat["next", VALID], nxt.valid)


def test_acting_with_is_init_starts_a_fresh_memory() -> None:
    """A step marked ``is_init`` ignores the state it carries (a collector without the primer's reset)."""
    module = _module()
    with torch.no_grad():
        first = module(_steps(2, seed=1))
        td = _steps(2, seed=2)
        td[MEMS], td[VALID] = first["next", MEMS], first["next", VALID]
        td["is_init"] = torch.tensor([[True], [False]])
        module(td)
        fresh = module(_steps(2, seed=2))
    torch.testing.assert_close(td["features"][0], fresh["features"][0])
    assert not torch.allclose(td["features"][1], fresh["features"][1])  # row 1 carries its memory on


@pytest.mark.parametrize("batch", [(5,), (2, 5), (1, 2, 5)])
def test_the_recurrent_mode_reads_the_last_dimension_as_time(batch: tuple[int, ...]) -> None:
    """A trajectory ``[T]``, rows ``[B, T]`` or ``[*batch, T]``: each row one segment from the state at its first
    step (fresh here: no state, no is_init), as the sequence module computes it; only the output is written."""
    module = _module()
    td = _steps(*batch)
    with set_recurrent_mode(True), torch.no_grad():
        module(td)
    x = td["embed"].reshape(-1, 5, CFG.d_in)
    with torch.no_grad():
        ref = module.memory(x).output
    torch.testing.assert_close(td["features"].reshape(-1, 5, CFG.d_model), ref)
    assert set(td.keys(True, True)) == {"embed", "features"}


def test_the_recurrent_mode_starts_from_the_stored_state_and_resets_at_is_init() -> None:
    module = _module()
    with torch.no_grad():
        state = module.memory(_steps(2, 4, seed=1)["embed"]).state
    td = _steps(2, 5, seed=2)
    td[MEMS] = state.mems[:, None].expand(2, 5, *state.mems.shape[1:]).clone()
    td[VALID] = state.valid[:, None].expand(2, 5, -1).clone()
    td["is_init"] = torch.zeros(2, 5, 1, dtype=torch.bool)
    td["is_init"][1, 2] = True
    td[MEMS][1, 2], td[VALID][1, 2] = 0.0, False  # collected data: the primer's zeros at an episode start
    with set_recurrent_mode(True), torch.no_grad():
        module(td)
        ref = module.memory(td["embed"], SequenceState(state.mems, state.valid), td["is_init"][..., 0]).output
    torch.testing.assert_close(td["features"], ref)


def test_the_default_recurrent_mode_and_its_override() -> None:
    """``default_recurrent_mode=True`` reads a tensordict as segments outside any context; ``set_recurrent_mode``
    overrides it either way."""
    learning, acting = _module(default_recurrent_mode=True), _module()
    assert learning.recurrent_mode and not acting.recurrent_mode
    with set_recurrent_mode(False):
        assert not learning.recurrent_mode
    with set_recurrent_mode(True):
        assert acting.recurrent_mode
    td = _steps(2, 5)
    with torch.no_grad():
        learning(td)
        ref = learning.memory(td["embed"]).output
    torch.testing.assert_close(td["features"], ref)  # a segment: the steps see each other


def test_the_recurrent_mode_needs_a_time_dimension() -> None:
    td = TensorDict({"embed": torch.zeros(CFG.d_in)}, batch_size=[])
    with set_recurrent_mode(True), pytest.raises(ConfigError) as info:
        _module()(td)
    assert str(info.value) == "recurrent mode needs a tensordict with a time dimension, got a 0-d one"


@pytest.mark.parametrize("keep", [MEMS, VALID])
def test_half_a_recurrent_state_is_refused_in_one_line(keep: str) -> None:
    """A tensordict with the memory but not its valid flags (or the other way round) is an error, not a fresh
    memory."""
    module = _module()
    td = _steps(3)
    with torch.no_grad():
        module(td)
    state = _steps(3)
    state[keep] = td["next", keep]
    with pytest.raises(ConfigError, match=r"has .* but no .*: a recurrent state needs both"):
        module(state)


def test_two_memories_with_their_own_state_keys_share_a_rollout() -> None:
    """An actor's and a critic's memory in one tensordict (``state_keys``, as ``LSTMModule``'s ``in_keys``): each
    carries its own state through the environment and recomputes its own acting outputs; the default keys are
    untouched."""
    torch.manual_seed(0)
    actor_memory, policy = _policy()
    keys = ("critic_mems", "critic_valid")
    critic_memory = TransformerXLModule(CFG, in_key="obs", out_key="critic_features", state_keys=keys)
    both = TensorDictSequential(policy.module[0], critic_memory, *policy.module[1:])
    env = TransformedEnv(SerialEnv(2, lambda: GymWrapper(_Short())), Compose(InitTracker()))
    env.append_transform(actor_memory.make_tensordict_primer())
    env.append_transform(critic_memory.make_tensordict_primer())
    env.set_seed(0)
    with torch.no_grad():
        data = env.rollout(12, both, break_when_any_done=False)
    env.close()
    assert data["critic_mems"].shape == data[MEMS].shape and data["next", "critic_valid"][:, 0].tolist() == \
        [[False, False, True]] * 2
    assert not torch.equal(data["critic_mems"][:, 3], data[MEMS][:, 3])  # two memories, not one written twice
    for module, out in ((actor_memory, "features"), (critic_memory, "critic_features")):
        seg = data[:, 4:12].exclude("features", "critic_features").clone()
        with set_recurrent_mode(True), torch.no_grad():
            module(seg)
        torch.testing.assert_close(seg[out], data[:, 4:12][out], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keys", [("a",), ("a", "a"), ("a", 3)])
def test_state_keys_must_be_two_different_names(keys) -> None:
    with pytest.raises(ConfigError, match="state_keys must be two different names"):
        TransformerXLModule(CFG, state_keys=keys)
