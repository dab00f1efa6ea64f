"""A POPGym environment with short episodes, for the TorchRL tests: a rollout of a few steps crosses episode
boundaries (the ``rl`` extra; import only after ``pytest.importorskip("popgym")``)."""

from __future__ import annotations

from popgym.envs.repeat_previous import RepeatPreviousEasy


def short_repeat_previous(length: int) -> type[RepeatPreviousEasy]:
    """RepeatPrevious (one-hot observations of 4 suits) whose episodes end after ``length`` steps."""

    class Short(RepeatPreviousEasy):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            self._steps = getattr(self, "_steps", 0) + 1
            return obs, reward, terminated or self._steps % length == 0, truncated, info

        def reset(self, *args, **kwargs):
            self._steps = 0
            return super().reset(*args, **kwargs)

    return Short
