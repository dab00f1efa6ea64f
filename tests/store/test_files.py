"""Atomic files and directories, SHA-256 of files, and JSON read with one-line errors
(``transformer_xl.store.files``)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from transformer_xl.errors import ConfigError, DataError
from transformer_xl.store.files import (
    atomic_dir,
    atomic_path,
    atomic_write,
    parse_json_object,
    read_json,
    sha256_file,
    write_json,
    write_text,
)


class Boom(Exception):
    """Raised by a writer that fails half way."""


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_path_renames_the_temporary_file_over_the_target(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.bin"  # parent directories are created
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target and not target.exists()
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and not tmp.exists()
    assert _names(target.parent) == ["out.bin"]


def test_atomic_path_failure_keeps_old_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(Boom), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise Boom
    assert target.read_bytes() == b"old" and _names(tmp_path) == ["out.bin"]


def test_atomic_write_failure_keeps_old_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_text(target, "old")

    def writer(f) -> None:
        f.write(b"partial")
        raise Boom

    with pytest.raises(Boom):
        atomic_write(target, writer)
    assert target.read_text() == "old" and _names(tmp_path) == ["out.txt"]
    # a failing first write leaves no file at all
    with pytest.raises(Boom):
        atomic_write(tmp_path / "fresh.txt", writer)
    assert _names(tmp_path) == ["out.txt"]


def test_atomic_write_creates_parents_and_returns_the_path(tmp_path: Path) -> None:
    target = tmp_path / "x" / "y" / "z.bin"
    assert atomic_write(str(target), lambda f: f.write(b"\x00\x01")) == target
    assert target.read_bytes() == b"\x00\x01"
    assert atomic_write(target, lambda f: f.write(b"2")) == target and target.read_bytes() == b"2"  # replaced


def test_write_text_is_utf8(tmp_path: Path) -> None:
    path = write_text(tmp_path / "t.txt", "héllo ✓\n")
    assert path.read_bytes() == "héllo ✓\n".encode()


def test_write_json_sorts_keys_indents_and_converts_numpy_floats(tmp_path: Path) -> None:
    obj = {"b": np.float32(0.5), "a": [np.float64(1.25)], "c": {"z": 1, "y": None}}
    text = write_json(tmp_path / "o.json", obj).read_text(encoding="utf-8")
    assert text.endswith("}\n") and text.index('"a"') < text.index('"b"') < text.index('"c"')
    assert text.index('"y"') < text.index('"z"') and '\n  "a": [' in text  # indent 2
    back = json.loads(text)
    assert back == {"a": [1.25], "b": 0.5, "c": {"y": None, "z": 1}} and isinstance(back["b"], float)
    unsorted = write_json(tmp_path / "u.json", {"b": 1, "a": 2}, sort_keys=False, indent=0).read_text()
    assert unsorted.index('"b"') < unsorted.index('"a"')
    assert list(json.loads(unsorted)) == ["b", "a"]


def test_write_json_still_refuses_objects_that_are_not_numbers(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_json(tmp_path / "o.json", {"x": object()})
    assert not (tmp_path / "o.json").exists() and _names(tmp_path) == []


def test_atomic_dir_appears_whole(tmp_path: Path) -> None:
    final = tmp_path / "parent" / "model"
    with atomic_dir(final) as tmp:
        assert tmp.parent == final.parent and tmp.name.startswith(".")
        (tmp / "a.txt").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
        assert not final.exists()  # nothing visible under the final name while it is being built
    assert _names(final) == ["a.txt", "sub"] and (final / "sub" / "b.txt").read_text() == "b"
    assert _names(final.parent) == ["model"]  # no temporary directory left


def test_atomic_dir_without_replace_never_moves_a_published_directory(tmp_path: Path) -> None:
    final = tmp_path / "d"
    final.mkdir()
    (final / "theirs").write_text("1")
    inode = final.stat().st_ino
    with pytest.raises(OSError) as err, atomic_dir(final, replace=False) as tmp:
        (tmp / "ours").write_text("2")
    assert err.value.errno in (errno.ENOTEMPTY, errno.EEXIST)
    assert final.stat().st_ino == inode and sorted(p.name for p in final.iterdir()) == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # the temporary is gone


def test_atomic_dir_replaces_an_existing_directory(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "stale.txt").write_text("stale")
    (final / "keep.txt").write_text("old")
    with atomic_dir(final) as tmp:
        (tmp / "keep.txt").write_text("new")
        assert (final / "keep.txt").read_text() == "old"  # the old one is intact until the end
    assert _names(final) == ["keep.txt"] and (final / "keep.txt").read_text() == "new"
    assert _names(tmp_path) == ["ckpt"]  # neither the temporary nor the moved-aside old directory remains


def test_atomic_dir_failure_keeps_the_old_directory_and_removes_the_temporary_one(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "keep.txt").write_text("old")
    with pytest.raises(Boom), atomic_dir(final) as tmp:
        (tmp / "keep.txt").write_text("new")
        (tmp / "extra.txt").write_text("x")
        raise Boom
    assert _names(final) == ["keep.txt"] and (final / "keep.txt").read_text() == "old"
    assert _names(tmp_path) == ["ckpt"]
    with pytest.raises(Boom), atomic_dir(tmp_path / "never") as tmp:
        (tmp / "a").write_text("a")
        raise Boom
    assert _names(tmp_path) == ["ckpt"]


@pytest.mark.parametrize("size", [0, 1, 4097, 10_000])
def test_sha256_file_matches_hashlib(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_file(path) == expected
    assert sha256_file(str(path), chunk=1000) == expected  # several chunks


def test_sha256_file_is_content_sensitive(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    (tmp_path / "b").write_bytes(b"abd")
    assert sha256_file(tmp_path / "a") != sha256_file(tmp_path / "b")


def test_parse_json_object() -> None:
    assert parse_json_object('{"a": [1, 2]}', "config") == {"a": [1, 2]}
    with pytest.raises(ConfigError, match=r"^config is not valid JSON: ") as exc:
        parse_json_object('{"a": ', "config")
    assert "\n" not in str(exc.value)
    for text in ("[1, 2]", "3", '"s"', "null"):
        with pytest.raises(ConfigError, match=r"^config JSON must be an object$"):
            parse_json_object(text, "config")
    with pytest.raises(DataError, match="manifest JSON must be an object"):
        parse_json_object("[]", "manifest", DataError)
    with pytest.raises(DataError, match="manifest is not valid JSON"):
        parse_json_object("nope", "manifest", DataError)


def test_read_json_reads_an_object(tmp_path: Path) -> None:
    path = write_json(tmp_path / "c.json", {"n": 1, "s": "é"})
    assert read_json(path) == {"n": 1, "s": "é"} and read_json(str(path), "the config") == {"n": 1, "s": "é"}


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (None, r"not found: "),
        (b'{"a": 1', r"is not valid JSON: "),
        (b"[1, 2, 3]", r"JSON must be an object$"),
        (b'{"a": "\xff\xfe"}', r"cannot be read \("),
    ],
    ids=["missing", "invalid-json", "not-an-object", "bad-utf8"],
)
def test_read_json_errors_are_one_line(tmp_path: Path, content: bytes | None, pattern: str) -> None:
    path = tmp_path / "c.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=pattern) as exc:
        read_json(path)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(str(path))
    with pytest.raises(DataError, match=r"^the manifest " + pattern) as exc:
        read_json(path, "the manifest", DataError)
    assert "\n" not in str(exc.value)
    assert not isinstance(exc.value, ConfigError)


def test_written_files_and_directories_follow_the_umask(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "a.txt", "x")
        with atomic_dir(tmp_path / "d") as d:
            (d / "f").write_text("y")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


def test_a_failed_rename_puts_the_old_directory_back(tmp_path, monkeypatch) -> None:
    final = tmp_path / "best"
    with atomic_dir(final) as d:
        (d / "v").write_text("old")
    real = os.replace

    def failing(src, dst):
        if Path(dst) == final and ".tmp" in Path(src).name:
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="disk full"), atomic_dir(final) as d:
        (d / "v").write_text("new")
    assert (final / "v").read_text() == "old"
    assert not list(tmp_path.glob(".best*"))


def test_check_plain_name() -> None:
    from transformer_xl.store.files import check_plain_name

    assert check_plain_name("train.npy", "m") == "train.npy"
    for bad in ("../x", "..", ".", "", "/etc/passwd", "a/b", "a\\b", "a\0b", None, 3):
        with pytest.raises(DataError, match="not a plain file name"):
            check_plain_name(bad, "manifest m")


def test_an_os_error_while_writing_names_the_target(tmp_path: Path, monkeypatch) -> None:
    import errno

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        write_text(tmp_path / "a.txt", "x")
    assert info.value.filename == str(tmp_path / "a.txt") and not list(tmp_path.iterdir())
    with pytest.raises(OSError) as info, atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("x")
    assert info.value.filename == str(tmp_path / "d") and not list(tmp_path.iterdir())
