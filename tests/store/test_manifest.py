"""SHA-256 manifests: written over a directory's files, plain names only, every change refused in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from transformer_xl.errors import CheckpointError
from transformer_xl.store import manifest as manifest_module
from transformer_xl.store.manifest import (
    MANIFEST,
    is_plain_name,
    plain_files,
    read_manifest,
    verify_beside,
    verify_manifest,
    write_manifest,
)


def _dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.bin").write_bytes(bytes(range(200)))
    (root / "b.json").write_text('{"x": 1}\n')
    (root / ".a.bin.123.tmp").write_bytes(b"half-written")  # an atomic write's temporary file: not listed
    (root / "sub").mkdir(exist_ok=True)
    return root


def test_write_lists_every_plain_file_with_its_sha256_and_size(tmp_path) -> None:
    d = _dir(tmp_path / "d")
    write_manifest(d, step=7)
    doc = json.loads((d / MANIFEST).read_text())
    assert doc["step"] == 7 and sorted(doc["files"]) == ["a.bin", "b.json"] == plain_files(d)
    assert doc["files"]["a.bin"] == {"sha256": hashlib.sha256(bytes(range(200))).hexdigest(), "bytes": 200}
    assert verify_manifest(d) == doc
    write_manifest(d, ["b.json"])  # rewritten: only the named files
    assert list(json.loads((d / MANIFEST).read_text())["files"]) == ["b.json"]
    with pytest.raises(CheckpointError, match="only plain file names"):
        write_manifest(d, ["sub/x"])


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\\b", "/etc/passwd", "C:x", "nul\0"])
def test_a_name_that_is_not_a_plain_file_name_is_refused_before_any_file_is_opened(tmp_path, monkeypatch,
                                                                                    name) -> None:
    assert not is_plain_name(name)
    d = _dir(tmp_path / "d")
    write_manifest(d)
    doc = json.loads((d / MANIFEST).read_text())
    doc["files"][name] = doc["files"]["a.bin"]
    (d / MANIFEST).write_text(json.dumps(doc))
    opened: list[Path] = []
    monkeypatch.setattr(manifest_module, "sha256_file", lambda p: opened.append(p) or "0" * 64)
    with pytest.raises(CheckpointError, match="which is not a plain file name") as exc:
        verify_manifest(d)
    assert opened == [] and "\n" not in str(exc.value) and repr(name) in str(exc.value)


def test_plain_names_are_accepted() -> None:
    assert all(map(is_plain_name, ["model.safetensors", "MANIFEST.json", ".hidden", "a..b", "x y", "XX"]))
    assert not is_plain_name(3)


@pytest.mark.parametrize("damage", ["bit-flip", "truncated", "missing"])
def test_a_changed_file_is_refused_naming_it(tmp_path, damage) -> None:
    d = _dir(tmp_path / "d")
    write_manifest(d)
    blob = bytearray((d / "a.bin").read_bytes())
    if damage == "bit-flip":
        blob[100] ^= 0x10
        (d / "a.bin").write_bytes(bytes(blob))
    elif damage == "truncated":
        (d / "a.bin").write_bytes(bytes(blob[:150]))
    else:
        (d / "a.bin").unlink()
    message = {"bit-flip": r"a.bin does not match its SHA-256 in MANIFEST.json \(corrupt",
               "truncated": r"a.bin does not match its SHA-256 in MANIFEST.json: 150 bytes where 200 were written",
               "missing": r"lacks a.bin, which its MANIFEST.json lists"}[damage]
    with pytest.raises(CheckpointError, match=message) as exc:
        verify_manifest(d)
    assert "\n" not in str(exc.value)
    assert verify_manifest(d, names=["b.json"]) is not None  # only the named files are checked


def test_files_not_listed_are_not_checked_and_no_manifest_is_no_check(tmp_path) -> None:
    d = _dir(tmp_path / "d")
    assert read_manifest(d) is None and verify_manifest(d) is None
    for check in (read_manifest, verify_manifest):  # what it is not, by default: a directory
        with pytest.raises(CheckpointError, match=rf"^{d} is not a complete directory \(no MANIFEST.json\)$"):
            check(d, required=True)
    with pytest.raises(CheckpointError, match=r"is not a complete checkpoint \(no MANIFEST.json\)"):
        verify_manifest(d, required=True, what="checkpoint")
    write_manifest(d)
    (d / "vocab.json").write_text("{}")  # added later
    verify_manifest(d)


@pytest.mark.parametrize("doc", ['{"step": 1}', '{"files": {"a.bin": {"sha256": "x"}}}',
                                 '{"files": {"a.bin": {"bytes": 3}}}',
                                 '{"files": {"a.bin": {"sha256": "x", "bytes": true}}}', '{"files": []}', "[1]"])
def test_a_malformed_manifest_is_refused(tmp_path, doc) -> None:
    d = _dir(tmp_path / "d")
    (d / MANIFEST).write_text(doc)
    with pytest.raises(CheckpointError, match=r"unreadable|must be an object"):
        verify_manifest(d)


def test_verify_beside_checks_each_file_against_its_own_directory(tmp_path) -> None:
    d = _dir(tmp_path / "d")
    write_manifest(d, ["a.bin"])
    (tmp_path / "elsewhere.pt").write_bytes(b"no manifest here")
    verify_beside(d / "a.bin", d / "b.json", tmp_path / "elsewhere.pt")
    (d / "a.bin").write_bytes(b"changed")
    with pytest.raises(CheckpointError, match=r"a\.bin does not match"):
        verify_beside(d / "a.bin")
    verify_beside(d / "b.json")  # not listed: not checked


def test_every_file_named_is_checked_whatever_the_order(tmp_path) -> None:
    """``names`` skips the files it does not name and goes on to the next: the last one listed is checked too."""
    d = _dir(tmp_path / "d")
    write_manifest(d)
    (d / "b.json").write_text('{"x": 2}\n')  # listed after a.bin, which is not named
    with pytest.raises(CheckpointError, match=r"b\.json does not match its SHA-256 in MANIFEST.json \(corrupt or "
                       r"changed after it was written\)$"):
        verify_manifest(d, names=["b.json"])


def test_refusals_name_the_manifest_and_say_why(tmp_path) -> None:
    d = _dir(tmp_path / "d")
    (d / MANIFEST).write_text('{"files": {"../x": {"sha256": "x", "bytes": 1}}}')
    with pytest.raises(CheckpointError, match=rf"^{d / MANIFEST} lists '../x', which is not a plain file name of {d} "
                       r"\(a manifest names files inside its own directory only\)$"):
        read_manifest(d)
    (d / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match=rf"^manifest {d / MANIFEST} "):
        read_manifest(d)
