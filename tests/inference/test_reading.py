"""Reading a text line by line as it arrives: the lines a text-mode file has, UTF-8 errors at their offset in the
whole input, a cap on a line's bytes checked as it is read, and whether the next line has yet to arrive."""

from __future__ import annotations

import io
import os
import random

import pytest

from transformer_xl.errors import DataError
from transformer_xl.inference.lines import split_lines
from transformer_xl.inference.reading import CHUNK, LineReader, open_lines


class Counted(io.RawIOBase):
    """``size`` bytes of ``fill`` read through a counter (``/dev/zero`` with an end, or any long line)."""

    def __init__(self, size: int, fill: bytes = b"\0") -> None:
        self.left, self.fill, self.read_bytes = size, fill, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = self.fill * n
        self.left -= n
        self.read_bytes += n
        return n


def _lines(data: bytes, chunk: int, **kw) -> list[str]:
    return list(LineReader(io.BytesIO(data), "t", max_bytes=1 << 20, chunk=chunk, **kw))


def test_the_lines_of_a_text_mode_file_whatever_the_chunks() -> None:
    """``\\n``, ``\\r\\n`` and ``\\r`` end lines, a final line end starts no line: :func:`split_lines` of the whole
    text, also when a chunk ends between ``\\r`` and ``\\n``."""
    rng = random.Random(0)
    pieces = ["a", "bc", " ", "é", "\n", "\r\n", "\r", "\r\r\n", "\n\n"]
    texts = ["", "\n", "\r", "\r\n", "a", "a\r", "a\r\n", "a\rb", "\r\r\n\n"]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(200)]
    for text in texts:
        for chunk in (1, 2, 3, 7, CHUNK):
            assert _lines(text.encode(), chunk) == split_lines(text), (text, chunk)


def test_invalid_utf8_is_named_at_its_offset_in_the_input() -> None:
    data = b"first line\nthe cat \xff sat\n"
    for chunk in (1, 5, CHUNK):
        with pytest.raises(DataError, match=r"^t: invalid UTF-8 at byte offset 19; fix the file or pass --errors"):
            _lines(data, chunk)
    assert _lines(data, 4, errors="replace") == ["first line", "the cat \ufffd sat"]


def test_a_line_longer_than_the_cap_is_refused_once_that_much_is_read() -> None:
    for chunk in (4096, CHUNK):
        stream = Counted(64 << 20)
        reader = LineReader(io.BufferedReader(stream), "/dev/zero", max_bytes=10_000, chunk=chunk)
        with pytest.raises(DataError, match=r"^/dev/zero: line 1 is longer than 10,000 bytes \(no line end in them"):
            next(reader)
        assert stream.read_bytes <= 10_000 + chunk + io.DEFAULT_BUFFER_SIZE
    reader = LineReader(io.BytesIO(b"short\n" + b"x" * 101 + b"\nnext\n"), "t", max_bytes=100, chunk=3)
    assert next(reader) == "short"
    with pytest.raises(DataError, match="line 2 is longer than 100 bytes"):
        next(reader)
    assert list(LineReader(io.BytesIO(b"x" * 100 + b"\r\n"), "t", max_bytes=100)) == ["x" * 100]


def test_has_text_reads_ahead_and_keeps_the_lines() -> None:
    reader = LineReader(io.BytesIO(b" \n\t\nword\nmore\n"), "t", max_bytes=100, chunk=2)
    assert reader.has_text() and reader.size is None
    assert reader.consumed == 0 and list(reader) == [" ", "\t", "word", "more"] and reader.consumed == 14
    assert not LineReader(io.BytesIO(b" \n\r\n\x0c\n"), "t", max_bytes=100).has_text()
    assert LineReader(io.BytesIO(b"\n" * 50), "t", max_bytes=100).has_text(look=10)  # the rest is left to come


def test_waiting_means_the_next_line_has_not_arrived(tmp_path) -> None:
    r, w = os.pipe()
    with open(r, "rb") as pipe, open(w, "wb", buffering=0) as writer:
        reader = LineReader(pipe, "pipe", max_bytes=100)
        assert reader.waiting()  # nothing written yet
        writer.write(b"one\ntw")
        assert not reader.waiting() and next(reader) == "one"
        assert reader.waiting()  # "tw" is not a line yet
        writer.write(b"o\n")
        assert not reader.waiting() and next(reader) == "two"
        writer.close()
        assert not reader.waiting() and list(reader) == [] and not reader.waiting()
    (tmp_path / "f.txt").write_bytes(b"a\nb")
    with open_lines(str(tmp_path / "f.txt"), max_bytes=10) as reader:
        assert not reader.waiting() and reader.size == 3 and list(reader) == ["a", "b"] and reader.consumed == 3
    assert not LineReader(io.BytesIO(b"a"), "t", max_bytes=10).waiting()  # no descriptor: never waits


def test_open_lines_refuses_what_it_cannot_read_in_one_line(tmp_path) -> None:
    with pytest.raises(DataError, match=r"^cannot read .*missing.txt: No such file or directory$"), \
            open_lines(str(tmp_path / "missing.txt"), max_bytes=10):
        pass
    with pytest.raises(DataError, match=r"^cannot read .*: Is a directory$"), \
            open_lines(str(tmp_path), max_bytes=10) as reader:
        next(reader)
