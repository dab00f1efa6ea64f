"""The fuzz campaign over every reader (tests/fuzz/campaign.py): a fast subset in every run, thousands of cases
per reader as ``slow``, and the campaign's own checks shown to fail on a reader that misbehaves."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import campaign
from tests.helpers import REPO, subprocess_env


def _run_campaign(tmp_path: Path, examples: int, timeout: int) -> dict[str, tuple[int, int, int]]:
    """The campaign in a child process (its own memory bound); ``{reader: (cases, loaded, refused)}``."""
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz.campaign", "--examples", str(examples)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env=subprocess_env(tmp_path, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert proc.stdout.startswith("fuzz seed 24, "), proc.stdout  # the seed is recorded with the counts
    counts = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in re.finditer(
        r"^([a-z-]+): (\d+) cases, (\d+) loaded, (\d+) refused in one line", proc.stdout, re.M)}
    assert set(counts) == set(campaign.READERS), proc.stdout
    for name, (cases, loaded, refused) in counts.items():
        assert cases >= examples and cases == loaded + refused, (name, proc.stdout)
    return counts


@pytest.mark.integration
def test_every_reader_survives_a_fast_fuzz_subset(tmp_path) -> None:
    counts = _run_campaign(tmp_path, examples=25, timeout=600)
    refused = sum(r for _, _, r in counts.values())
    assert refused > 100  # the mutations do reach the readers' refusals
    assert counts["model-dir-rehashed"][1] > 0  # and some mutated inputs still load (a value changed, still valid)


@pytest.mark.slow
@pytest.mark.longest  # about 6 minutes on one core of a Zen 3
def test_every_reader_survives_thousands_of_cases(tmp_path) -> None:
    counts = _run_campaign(tmp_path, examples=2000, timeout=3600)
    print(counts)


# ---------------------------------------------------------------------------------------------- the checks
def _reader(load, make=lambda root: (root / "f.json").write_text("{}")) -> campaign.Reader:
    return campaign.Reader("probe", make, load, ("f.json",), json_targets=("f.json",))


def _case(reader: campaign.Reader, tmp_path: Path) -> None:
    reader.make(tmp_path)
    campaign.check_case(reader, tmp_path, ("json", (0, ([0], 1, False))))


def test_a_traceback_a_multi_line_error_and_a_hang_fail_the_case(tmp_path, monkeypatch) -> None:
    from transformer_xl.errors import DataError

    with pytest.raises(AssertionError, match="IndexError escaped"):
        _case(_reader(lambda root: [][0]), tmp_path)

    def multi(root: Path) -> None:
        raise DataError("first\nsecond")

    with pytest.raises(AssertionError, match="a multi-line error"):
        _case(_reader(multi), tmp_path)
    monkeypatch.setattr(campaign, "CASE_SECONDS", 1)

    def hang(root: Path) -> None:
        while True:
            pass

    with pytest.raises(AssertionError, match="no answer within 1 s"):
        _case(_reader(hang), tmp_path)

    def refuse(root: Path) -> None:
        raise DataError("one line")

    reader = _reader(refuse)
    _case(reader, tmp_path)
    assert reader.counts == {"cases": 1, "ok": 0, "refused": 1}


def test_the_pickle_payload_would_run_code_and_its_mark_is_seen(tmp_path) -> None:
    campaign.MARKER.unlink(missing_ok=True)
    try:
        pickle.loads(campaign.pickle_payload("bare"))  # what an unrestricted unpickler does with it
        assert campaign.MARKER.exists()
        with pytest.raises(AssertionError, match="a pickle's REDUCE ran"):
            _case(_reader(lambda root: pickle.loads(campaign.pickle_payload("bare"))), tmp_path)
    finally:
        campaign.MARKER.unlink(missing_ok=True)


def test_mutations_change_bytes_and_json_where_asked() -> None:
    assert campaign.mutate_bytes(b"abcdef", [("flip", 1, 1)]) == b"accdef"
    assert campaign.mutate_bytes(b"abcdef", [("cut", 3)]) == b"abc"
    assert campaign.mutate_bytes(b"abcdef", [("insert", 9, b"X")]) == b"abXcdef"  # positions modulo len + 1
    assert campaign.mutate_bytes(b"abcdef", [("delete", 0, 2), ("splice", 0, b"--")]) == b"--ef"
    doc = {"a": 1, "b": {"c": [1, 2]}}
    assert campaign.mutate_json(doc, [1, 0], None, False) == {"a": 1, "b": {"c": None}}
    assert campaign.mutate_json(doc, [0], None, True) == {"b": {"c": [1, 2]}}
    assert doc == {"a": 1, "b": {"c": [1, 2]}}  # the seed is not changed
