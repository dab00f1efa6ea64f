"""Raw corpus files: plain, gzip, xz and zip members, line-aligned chunks and strict UTF-8
(``transformer_xl.data.rawtext``)."""

from __future__ import annotations

import gzip
import io
import lzma
import zipfile
from pathlib import Path

import pytest

from transformer_xl.data.rawtext import (
    CHUNK_BYTES,
    decode_utf8,
    iter_line_chunks,
    iter_text_chunks,
    normalize_newlines,
    read_bytes,
    with_compressed_variants,
)
from transformer_xl.errors import DataError

DATA = "first line\nsecond ✓ line\n\nlast without newline".encode()


def _lines(data: bytes) -> list[bytes]:
    """``data`` cut after every ``\\n`` (the last piece may lack one)."""
    out, start = [], 0
    for i, b in enumerate(data):
        if b == 0x0A:
            out.append(data[start : i + 1])
            start = i + 1
    if start < len(data):
        out.append(data[start:])
    return out


def _reference_chunks(data: bytes, chunk_bytes: int) -> list[tuple[int, bytes]]:
    """Whole lines added to a chunk until it holds at least ``chunk_bytes`` bytes."""
    chunks, offset, current = [], 0, b""
    for line in _lines(data):
        current += line
        if len(current) >= chunk_bytes:
            chunks.append((offset, current))
            offset += len(current)
            current = b""
    if current:
        chunks.append((offset, current))
    return chunks


def test_read_bytes_plain_gzip_xz(tmp_path: Path) -> None:
    plain = tmp_path / "a.txt"
    plain.write_bytes(DATA)
    gz = tmp_path / "a.txt.gz"
    gz.write_bytes(gzip.compress(DATA))
    xz = tmp_path / "a.txt.xz"
    xz.write_bytes(lzma.compress(DATA))
    assert read_bytes(plain) == read_bytes(gz) == read_bytes(xz) == DATA
    assert gz.read_bytes() != DATA and xz.read_bytes() != DATA


def test_read_bytes_zip_member(tmp_path: Path) -> None:
    archive = tmp_path / "corpus.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("wiki/train.txt", DATA)
        zf.writestr("wiki/valid.txt", b"other\n")
    assert read_bytes(archive, "wiki/train.txt") == DATA
    assert read_bytes(archive, "wiki/valid.txt") == b"other\n"
    with pytest.raises(DataError, match=r"archive has no member 'wiki/test.txt'"):
        read_bytes(archive, "wiki/test.txt")


def test_missing_file_gives_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read"):
        read_bytes(tmp_path / "absent.txt")
    with pytest.raises(DataError, match="cannot read"):
        read_bytes(tmp_path / "absent.zip", "x.txt")


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("a.txt.gz", lambda: gzip.compress(DATA * 50)[:-30]),  # truncated stream
        ("a.txt.gz", lambda: b"this is not gzip data at all"),
        ("a.txt.xz", lambda: lzma.compress(DATA * 50)[:-30]),
        ("a.txt.xz", lambda: b"this is not xz data at all"),
        ("a.zip", lambda: b"PK\x03\x04 this is not a zip"),
    ],
    ids=["gz-truncated", "gz-garbage", "xz-truncated", "xz-garbage", "zip-garbage"],
)
def test_corrupt_or_truncated_compressed_file_gives_data_error(tmp_path: Path, name: str, damage) -> None:
    path = tmp_path / name
    path.write_bytes(damage())
    member = "a.txt" if name.endswith(".zip") else None
    with pytest.raises(DataError, match="corrupt or truncated") as exc:
        read_bytes(path, member)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_truncated_zip_gives_data_error(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.txt", DATA * 20)
    path = tmp_path / "a.zip"
    path.write_bytes(buf.getvalue()[:-40])  # the central directory is cut off
    with pytest.raises(DataError, match="corrupt or truncated"):
        read_bytes(path, "a.txt")


@pytest.mark.parametrize("chunk_bytes", [1, 2, 5, 11, 12, 13, 30, 1000])
@pytest.mark.parametrize(
    "data",
    [DATA, b"", b"\n", b"\n\n\n", b"no newline at all", b"a\nbb\nccc\ndddd\n", b"x" * 40 + b"\n" + b"y\n" * 7],
)
def test_iter_line_chunks_matches_whole_line_reference(data: bytes, chunk_bytes: int) -> None:
    chunks = list(iter_line_chunks(data, chunk_bytes))
    assert chunks == _reference_chunks(data, chunk_bytes)
    assert b"".join(c for _, c in chunks) == data
    for offset, chunk in chunks:
        assert chunk and data[offset : offset + len(chunk)] == chunk
    for _, chunk in chunks[:-1]:
        assert chunk.endswith(b"\n") and len(chunk) >= chunk_bytes


def test_iter_line_chunks_of_one_byte_are_single_lines() -> None:
    assert [c for _, c in iter_line_chunks(DATA, 1)] == _lines(DATA) == DATA.splitlines(keepends=True)


def test_decode_utf8_valid_and_invalid() -> None:
    assert decode_utf8("héllo ✓".encode(), "f.txt") == "héllo ✓"
    bad = b"abc\n" + b"d\xffe"
    with pytest.raises(DataError, match=r"^f\.txt: invalid UTF-8 at byte offset 5; ") as exc:
        decode_utf8(bad, "f.txt")
    assert "errors='replace'" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(DataError, match="byte offset 105;"):
        decode_utf8(bad, "f.txt", offset=100)  # the chunk's offset in the file is added
    with pytest.raises(DataError, match="byte offset 3;"):
        decode_utf8("abc✓".encode()[:-1], "f.txt")  # a character cut at the end
    assert decode_utf8(bad, "f.txt", errors="replace") == "abc\nd\ufffde"


def test_iter_text_chunks_decodes_and_normalizes() -> None:
    data = "a\r\nb\rc\n✓\n".encode()
    assert "".join(iter_text_chunks(data, "f")) == "a\nb\nc\n✓\n"
    with pytest.raises(DataError, match="f: invalid UTF-8 at byte offset 2"):
        list(iter_text_chunks(b"ab\xff\n", "f"))
    assert list(iter_text_chunks(b"ab\xff\n", "f", errors="replace")) == ["ab\ufffd\n"]
    assert list(iter_text_chunks(b"", "f")) == [] and CHUNK_BYTES >= 1 << 20


@pytest.mark.parametrize("text", ["", "plain\n", "a\r\nb\rc\n", "\r\r\n\n\r", "x\r", "\r\n\r\n", "no\nCR\u2028here"])
def test_normalize_newlines_matches_universal_newlines(text: str) -> None:
    expected = io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8", newline=None).read()
    assert normalize_newlines(text) == expected
    assert "\r" not in normalize_newlines(text)


def test_with_compressed_variants_order() -> None:
    p = Path("data") / "ptb.train.txt"
    assert with_compressed_variants(p) == [p, Path("data/ptb.train.txt.gz"), Path("data/ptb.train.txt.xz")]


def test_preparing_a_large_file_reports_its_chunks_on_stderr(monkeypatch, capsys) -> None:
    from transformer_xl.data import rawtext

    data = b"".join(f"line {i}\n".encode() for i in range(40))  # 40 lines of 7-8 bytes
    assert "".join(iter_text_chunks(data, "small.txt")) == data.decode()  # one chunk: never a progress
    monkeypatch.setattr(rawtext, "CHUNK_BYTES", 30)
    monkeypatch.setattr(rawtext, "PROGRESS_AFTER_S", 0.0)
    assert "".join(iter_text_chunks(data, "/some/big.txt")) == data.decode()
    captured = capsys.readouterr()
    lines = captured.err.splitlines()  # not a terminal: plain lines, about every 10 %
    assert captured.out == "" and 5 <= len(lines) <= 11, lines
    assert all(ln.startswith("prepare big.txt: chunk ") and " MB/s | ETA " in ln for ln in lines)
