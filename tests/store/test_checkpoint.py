"""Training checkpoints: step directories without pickle, SHA-256 manifests, corruption detected."""

from __future__ import annotations

import json
import re

import pytest
import torch

from transformer_xl.errors import CheckpointError
from transformer_xl.store.checkpoint import (
    join_tensors,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_checkpoint_meta,
    remove_stale_temporaries,
    save_checkpoint,
    split_tensors,
    verify_checkpoint,
)


def test_split_join_tensors_round_trip() -> None:
    state = {"a": torch.arange(3.0), "b": [torch.tensor(2.0), {"c": 1, 5: torch.ones(2, 2)}], "d": None}
    meta, tensors = split_tensors(state)
    json.dumps(meta)
    back = join_tensors(json.loads(json.dumps(meta)), tensors)
    assert back["b"][0].shape == () and back["b"][1][5].equal(torch.ones(2, 2)) and back["b"][1]["c"] == 1


def test_the_state_json_names_each_tensor_by_its_path() -> None:
    """Each tensor of the state is stored under its dotted path (a lone tensor as ``t``); a scalar as a tensor of
    one element (a shape every safetensors reader takes), flagged to be read back as a scalar."""
    meta, tensors = split_tensors({"opt": [{"m": torch.ones(2)}], 3: torch.tensor(1.5), "lr": 0.1})
    assert meta == {"opt": [{"m": {"__tensor__": ".opt.0.m", "scalar": False}}],
                    "__int__3": {"__tensor__": ".3", "scalar": True}, "lr": 0.1}
    assert sorted(tensors) == [".3", ".opt.0.m"] and tensors[".3"].shape == (1,) and tensors[".3"].item() == 1.5
    assert split_tensors(torch.zeros(3))[0] == {"__tensor__": "t", "scalar": False}


@pytest.mark.parametrize(("state", "message"), [
    ({"ok": 1, (1, 2): 3}, "cannot store a state key of type tuple"),
    ({"a": [1, object()]}, "cannot store a state value of type object at '.a.1'"),
    ({"b": {"c": {1, 2}}}, "cannot store a state value of type set at '.b.c'")])
def test_a_state_that_is_no_json_and_tensors_is_refused_naming_what(state, message) -> None:
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        split_tensors(state)


def _checkpoint(tmp_path, weights: dict | None = None):
    weights = weights if weights is not None else {"w": torch.randn(4, 4, generator=torch.Generator().manual_seed(0))}
    return save_checkpoint(tmp_path / "checkpoints", 3, weights, '{"n_token": 4}', {"step": 3, "m": torch.ones(2)})


def test_checkpoint_round_trip_and_its_manifest_lists_every_file(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path)
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    assert manifest["step"] == 3 and sorted(manifest["files"]) == [
        "config.json", "model.safetensors", "train_state.json", "train_state.safetensors"]
    config, weights, state = load_checkpoint(ckpt)
    assert config == {"n_token": 4} and weights["w"].shape == (4, 4) and state["m"].equal(torch.ones(2))


@pytest.mark.parametrize("damage", ["truncate", "bit-flip"])
@pytest.mark.parametrize("name", ["model.safetensors", "train_state.safetensors"])
def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path, damage, name) -> None:
    ckpt = _checkpoint(tmp_path)
    blob = bytearray((ckpt / name).read_bytes())
    if damage == "truncate":
        del blob[-3:]
    else:
        blob[-2] ^= 0x01
    (ckpt / name).write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=f"{name} does not match its SHA-256 in MANIFEST.json") as exc:
        load_checkpoint(ckpt)
    assert "\n" not in str(exc.value)


def test_a_checkpoint_manifest_naming_a_file_outside_is_refused(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "x").write_text("outside")
    doc = json.loads((ckpt / "MANIFEST.json").read_text())
    doc["files"]["../x"] = {"sha256": "0" * 64, "bytes": 7}
    (ckpt / "MANIFEST.json").write_text(json.dumps(doc))
    for read in (verify_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match=r"lists '\.\./x', which is not a plain file name"):
            read(ckpt)


def test_non_finite_checkpoint_weights_are_refused(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path, {"w": torch.tensor([[0.0, float("-inf")]])})
    with pytest.raises(CheckpointError, match=r"tensor 'w' holds non-finite values \(0 NaN, 1 inf\)"):
        load_checkpoint(ckpt)


def test_a_state_naming_a_tensor_the_checkpoint_lacks_is_one_line() -> None:
    with pytest.raises(CheckpointError, match=r"^checkpoint lacks the tensor 'opt\.m'$"):
        join_tensors({"m": {"__tensor__": "opt.m", "scalar": False}}, {})


def test_a_trainer_state_that_is_no_json_is_refused_naming_it(tmp_path) -> None:
    """A ``train_state.json`` torn before its manifest was written (the manifest agrees with it): one line."""
    from transformer_xl.store.manifest import write_manifest

    ckpt = _checkpoint(tmp_path)
    (ckpt / "train_state.json").write_text('{"step": 3, "m": {"__ten')
    (ckpt / "MANIFEST.json").unlink()
    write_manifest(ckpt, ["config.json", "model.safetensors", "train_state.json", "train_state.safetensors"], step=3)
    with pytest.raises(CheckpointError, match=rf"^checkpoint state {ckpt / 'train_state.json'} is not valid JSON: "):
        load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match=rf"^checkpoint state {ckpt / 'train_state.json'} is not valid JSON: "):
        read_checkpoint_meta(ckpt)
    (ckpt / "config.json").write_text("[4]")
    with pytest.raises(CheckpointError, match=rf"^checkpoint config {ckpt / 'config.json'} JSON must be an object$"):
        read_checkpoint_meta(ckpt)


def test_stale_temporaries_of_a_killed_writer_are_removed_and_nothing_else(tmp_path) -> None:
    """``remove_stale_temporaries`` deletes the ``.step_*.tmp`` folders a killed writer left (with their files) and
    leaves finished checkpoints and other files alone."""
    stale = tmp_path / ".step_00000005.tmp"
    (stale / "inner").mkdir(parents=True)
    (stale / "inner" / "weights.safetensors").write_bytes(b"partial")
    (tmp_path / "step_00000004").mkdir()
    (tmp_path / "notes.tmp").write_text("mine")
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp", "step_00000004"]


def test_a_checkpoint_without_its_manifest_is_refused_as_incomplete(tmp_path) -> None:
    """The manifest is written last: a step directory without one is a save that did not finish."""
    ckpt = _checkpoint(tmp_path)
    (ckpt / "MANIFEST.json").unlink()
    for read in (verify_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(ckpt))} is not a complete checkpoint "
                                                  r"\(no MANIFEST\.json\)$"):
            read(ckpt)


def test_load_checkpoint_without_verify_hashes_nothing(tmp_path) -> None:
    """``verify=False`` (the caller has just verified) reads the files as they are: new weights written over the
    checkpoint's are loaded, not refused, whereas the default refuses them."""
    from transformer_xl.store.tensors import save_tensors

    ckpt = _checkpoint(tmp_path)
    save_tensors({"w": torch.full((4, 4), 2.0)}, ckpt / "model.safetensors")
    _, weights, state = load_checkpoint(ckpt, verify=False)
    assert weights["w"].equal(torch.full((4, 4), 2.0)) and state["m"].equal(torch.ones(2))
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match its SHA-256"):
        load_checkpoint(ckpt)


def test_pruning_keeps_the_newest_and_leaves_what_it_cannot_remove(tmp_path) -> None:
    """``prune_checkpoints`` deletes all but the newest ``keep``; a checkpoint it cannot remove (here a symbolic
    link to one kept elsewhere, which it does not follow) is left, and the pruning goes on past it."""
    root = tmp_path / "checkpoints"
    weights, state = {"w": torch.ones(2)}, {"step": 0}
    kept_elsewhere = save_checkpoint(tmp_path / "elsewhere", 1, weights, "{}", state)
    root.mkdir()
    (root / "step_00000001").symlink_to(kept_elsewhere, target_is_directory=True)
    for step in (2, 3, 4):
        save_checkpoint(root, step, weights, "{}", state)
    prune_checkpoints(root, keep=2)
    assert [p.name for p in list_checkpoints(root)] == ["step_00000001", "step_00000003", "step_00000004"]
    verify_checkpoint(kept_elsewhere)  # the link's target untouched
    prune_checkpoints(root, keep=5)
    assert len(list_checkpoints(root)) == 3


def test_a_linked_temporary_is_not_followed(tmp_path) -> None:
    """A ``.step_*.tmp`` that is a symbolic link is left with its target's files: only a writer's own folders
    are removed, and the other stale ones still are."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / ".step_00000002.tmp").symlink_to(target, target_is_directory=True)
    (root / ".step_00000003.tmp").mkdir()
    remove_stale_temporaries(root)
    assert sorted(p.name for p in root.iterdir()) == [".step_00000002.tmp"]
    assert (target / "keep.txt").read_text() == "mine"


def _steps(root) -> list[int]:
    return [int(p.name[5:]) for p in list_checkpoints(root)]


@pytest.mark.parametrize(("present", "keep", "kept"), [
    (1, 3, [1]), (2, 3, [1, 2]), (3, 3, [1, 2, 3]), (4, 3, [2, 3, 4]), (5, 2, [4, 5]), (3, 1, [3]), (1, 1, [1])])
def test_pruning_deletes_exactly_the_oldest_beyond_keep_and_nothing_when_fewer(tmp_path, present, keep, kept) -> None:
    """Keep N of fewer than N present: nothing is deleted (the oldest included); of more: exactly the oldest beyond
    the newest N, each directory whole."""
    root = tmp_path / "checkpoints"
    for step in range(1, present + 1):
        save_checkpoint(root, step, {"w": torch.ones(2)}, "{}", {"step": step})
    prune_checkpoints(root, keep=keep)
    assert _steps(root) == kept and sorted(p.name for p in root.iterdir()) == [f"step_{s:08d}" for s in kept]
    for ckpt in list_checkpoints(root):
        verify_checkpoint(ckpt)


def test_a_step_directory_without_its_manifest_is_no_checkpoint_listed_counted_or_pruned(tmp_path) -> None:
    """A step directory whose manifest is missing (a save cut short, a copy in progress) is not listed as a
    checkpoint, not counted by pruning (which keeps the newest complete ones), and not deleted by it."""
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(root, step, {"w": torch.ones(2)}, "{}", {"step": step})
    (save_checkpoint(root, 5, {"w": torch.ones(2)}, "{}", {"step": 5}) / "MANIFEST.json").unlink()
    (root / "step_00000004").mkdir()  # an empty one
    assert _steps(root) == [1, 2, 3]
    prune_checkpoints(root, keep=2)
    assert _steps(root) == [2, 3]
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000003", "step_00000004",
                                                     "step_00000005"]
