"""The GPU check's options: caps, budget, validation, and the round trip to a part's process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from transformer_xl.experiments.gpucheck.options import (
    DEFAULT_CAPS,
    FULL_BUDGET_S,
    PARTS,
    TINY_CAPS,
    CheckOptions,
)


def test_caps_default_by_size_and_can_be_overridden() -> None:
    assert CheckOptions(device="cpu", tiny=True).cap("a") == TINY_CAPS["a"]
    assert CheckOptions().cap("b") == DEFAULT_CAPS["b"]
    assert CheckOptions(caps={"b": 7}).cap("b") == 7.0
    with pytest.raises(ValueError, match="unknown part 'z'"):
        CheckOptions().cap("z")


def test_the_full_check_fits_eight_minutes() -> None:
    """Every part at its cap, and the whole run at its budget, stay under 8 minutes with room for the start."""
    assert set(DEFAULT_CAPS) == set(TINY_CAPS) == set(PARTS)
    assert sum(DEFAULT_CAPS.values()) <= FULL_BUDGET_S <= 8 * 60 - 10
    assert CheckOptions().budget == FULL_BUDGET_S and CheckOptions(budget_s=30).budget == 30.0


@pytest.mark.parametrize("kw, message", [
    ({"parts": ("a", "g")}, "unknown part"), ({"caps": {"x": 1}}, "unknown part"),
    ({"caps": {"a": 0}}, "positive"), ({"device": "mps"}, "'cuda'"), ({"budget_s": -1.0}, "budget must be a positive")])
def test_bad_options_are_one_line_errors(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckOptions(**kw)


def test_compile_defaults_to_full_sizes_only() -> None:
    assert CheckOptions().use_compile and not CheckOptions(tiny=True).use_compile
    assert CheckOptions(tiny=True, compile=True).use_compile and not CheckOptions(compile=False).use_compile


def test_device_type_and_cuda() -> None:
    opts = CheckOptions(device="cuda:1")
    assert opts.cuda and opts.device_type == "cuda"
    assert not CheckOptions(device="cpu").cuda


def test_time_left_counts_down_to_the_deadline() -> None:
    assert CheckOptions().time_left() == float("inf")
    left = CheckOptions(deadline=time.monotonic() + 10).time_left()
    assert 9 < left <= 10


def test_options_travel_to_a_part_and_back(tmp_path: Path) -> None:
    lines = []
    opts = CheckOptions(device="cpu", tiny=True, out_dir=tmp_path, parts=("a", "c"), seed=3, caps={"c": 4.0},
                        budget_s=50, compile=True, command="cmd", deadline=123.0)
    back = CheckOptions.from_dict(opts.to_dict(), log=lines.append)
    assert back.to_dict() == opts.to_dict() and back.out_dir == tmp_path and back.parts == ("a", "c")
    back.log("hello")
    assert lines == ["hello"]
