"""Output directories: written when new, empty or the command's own earlier output; anything else refused in one
line naming --force, which moves the old directory aside (never deletes it)."""

from __future__ import annotations

import json
import re

import pytest

from transformer_xl.errors import ConfigError
from transformer_xl.store.manifest import MANIFEST, write_manifest
from transformer_xl.store.outputs import (
    OUTPUT_KEY,
    backup_path,
    claim_output_dir,
    manifest_output,
    refusal,
    write_output_manifest,
)

KIND = "txl thing"


def _earlier_output(path, kind: str = KIND):
    path.mkdir(parents=True)
    (path / "a.bin").write_bytes(b"a")
    write_output_manifest(path, kind)
    return path


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_new_or_empty_directory_is_written_in_place(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty"):
        assert refusal(out, KIND) is None
        with claim_output_dir(out, KIND) as target:
            assert target == out
    assert not (tmp_path / "new").exists()  # the claim itself writes nothing


def test_the_commands_own_earlier_output_is_replaceable_and_nothing_else(tmp_path) -> None:
    out = _earlier_output(tmp_path / "out")
    assert json.loads((out / MANIFEST).read_text())[OUTPUT_KEY] == KIND
    assert manifest_output(KIND)(out) == {"a.bin", MANIFEST} and refusal(out, KIND) is None
    assert manifest_output("txl other")(out) is None
    assert refusal(out, "txl other") == f"{out} holds what txl other did not write (MANIFEST.json, a.bin)"
    (out / "notes.txt").write_text("mine")  # a file the manifest does not list: the user's
    assert refusal(out, KIND) == f"{out} holds what {KIND} did not write (notes.txt)"
    plain = tmp_path / "plain"  # a manifest without the output key: a model directory, say
    plain.mkdir()
    (plain / "a.bin").write_bytes(b"a")
    write_manifest(plain)
    assert manifest_output(KIND)(plain) is None and refusal(plain, KIND) is not None
    (plain / MANIFEST).write_text("{")  # unreadable: nothing proves it is the command's
    assert manifest_output(KIND)(plain) is None


def test_a_refusal_is_one_line_naming_force_and_touches_nothing(tmp_path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("b", "a", "c", "d", "e"):
        (out / name).write_text(name)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(out))} holds what {KIND} did not write \(a, b, c and 2 "
                       rf"more\): refusing to write there; give a new or empty directory, or --force to move it "
                       rf"aside to {re.escape(str(out))}\.old-1$"), claim_output_dir(out, KIND):
        pytest.fail("the block runs only when the directory may be written")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"file is a file, not a directory: refusing"), \
            claim_output_dir(tmp_path / "file", KIND):
        pass
    assert _tree(tmp_path) == {**before, "file": b"x"}


def test_the_input_a_directory_holding_it_or_one_inside_a_model_is_always_refused(tmp_path) -> None:
    """Even the command's own earlier output is refused when it is the input (or holds it)."""
    run = _earlier_output(tmp_path / "run")  # wholly the command's own
    assert refusal(run, KIND) is None
    assert refusal(run, KIND, protect=[run]) == f"{run} is {KIND}'s own input"
    inner = run / "a.bin"
    assert refusal(run, KIND, protect=[inner]) == f"{run} holds {KIND}'s input {inner}"
    assert refusal(tmp_path, KIND, protect=[inner]) == f"{tmp_path} holds {KIND}'s input {inner}"
    model = tmp_path / "model"
    model.mkdir()
    assert refusal(model / "onnx", KIND, sealed=[model]) == (f"{model / 'onnx'} lies inside the model directory "
                                                             f"{model}, which txl replaces as a whole")
    assert refusal(tmp_path / "other", KIND, protect=[model], sealed=[model]) is None
    assert refusal(run, KIND, protect=[tmp_path / "absent", "org/name"]) is None  # a Hub id, no such path
    linked = tmp_path / "link"
    linked.symlink_to(run)
    assert refusal(linked, KIND, protect=[run]) == f"{linked} is {KIND}'s own input"


def test_force_writes_beside_then_moves_the_old_directory_aside(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    notes: list[str] = []
    assert backup_path(out) == tmp_path / "out.old-1"
    with claim_output_dir(out, KIND, force=True, note=notes.append) as target:
        assert target.parent == tmp_path and target.name.startswith(".out.new-") and target.is_dir()
        assert (out / "notes.txt").read_text() == "mine"  # still in place while the block runs (it may be read)
        (target / "new.txt").write_text("new")
    assert _tree(tmp_path) == {"out/new.txt": b"new", "out.old-1/notes.txt": b"mine"}
    assert notes == [f"moved the old {out} aside to {tmp_path / 'out.old-1'} (--force)"]
    (out / "more.txt").write_text("again")
    with claim_output_dir(out, KIND, force=True) as target:
        (target / "third.txt").write_text("3")
    assert sorted(_tree(tmp_path)) == ["out.old-1/notes.txt", "out.old-2/more.txt", "out.old-2/new.txt",
                                       "out/third.txt"]


def test_force_keeps_the_old_directory_when_the_block_fails(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="boom"), claim_output_dir(out, KIND, force=True) as target:
        (target / "half.txt").write_text("half")
        raise RuntimeError("boom")
    assert _tree(tmp_path) == {"out/notes.txt": b"mine"} and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_force_where_nothing_exists_writes_in_place(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with claim_output_dir(model / "sub", KIND, force=True, sealed=[model]) as target:
        assert target == model / "sub"


def test_a_file_is_moved_aside_by_force_too(tmp_path) -> None:
    (tmp_path / "out").write_text("a file")
    with claim_output_dir(tmp_path / "out", KIND, force=True) as target:
        target.joinpath("x").write_text("x")
    assert _tree(tmp_path) == {"out.old-1": b"a file", "out/x": b"x"}


def test_an_earlier_output_is_replaced_but_a_file_added_meanwhile_is_kept(tmp_path) -> None:
    """The command's own earlier output is written beside and then replaced; a file of the user's that appears in it
    while the command writes (a long export) moves the old directory aside instead of being removed with it."""
    out = _earlier_output(tmp_path / "out")
    with claim_output_dir(out, KIND) as target:
        assert target != out and (out / "a.bin").exists()  # the old output stays while the new one is written
        (target / "new.bin").write_bytes(b"n")
    assert _tree(out) == {"new.bin": b"n"} and not list(tmp_path.glob(".out*")) and not backup_path(out).exists()
    out = _earlier_output(tmp_path / "again")
    notes: list[str] = []
    with claim_output_dir(out, KIND, note=notes.append) as target:
        (out / "mine.txt").write_text("mine")  # the user's, meanwhile
        (target / "new.bin").write_bytes(b"n")
    assert _tree(out) == {"new.bin": b"n"}
    assert (tmp_path / "again.old-1" / "mine.txt").read_text() == "mine"
    assert notes == [f"moved the old {out} aside to {tmp_path / 'again.old-1'} (files it did not write appeared in "
                     "it meanwhile)"]
