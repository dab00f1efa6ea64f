"""Reading a text line by line as it arrives, with a cap on a line's length: what ``txl score`` reads its input with.

:class:`LineReader` reads a binary stream (a file, standard input, a pipe) in chunks and gives its lines one at a
time, decoded from UTF-8 as :func:`transformer_xl.data.rawtext.decode_utf8` decodes (an invalid byte is a one-line
:class:`~transformer_xl.errors.DataError` naming its offset in the whole input, unless ``errors="replace"``), with
the line ends of a text-mode file: ``\\n``, ``\\r\\n`` and ``\\r`` (:func:`transformer_xl.inference.lines.split_lines`
splits a whole text the same way). It holds one line and one chunk at most: a line longer than ``max_bytes`` (the
bytes of ``/dev/zero``, a file with no line end) is a one-line error once that many bytes are read, not after the
whole input. :meth:`LineReader.waiting` says whether the next line has yet to arrive, so that a reader of a pipe
can write what it has before it blocks.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import select
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from transformer_xl.data.rawtext import decode_utf8
from transformer_xl.errors import DataError

__all__ = ["CHUNK", "LineReader", "open_lines"]

#: Bytes asked of the stream at a time (a pipe's read gives what it has, up to this).
CHUNK = 1 << 16
#: Where a line ends: ``\n``, ``\r\n`` or ``\r``.
_END = re.compile(rb"[\r\n]")


class LineReader:
    """The lines of ``stream`` (binary), one at a time (see the module docstring); ``name`` names it in errors.

    ``consumed`` is the number of bytes of the lines given so far (their line ends included), and ``size`` the
    stream's size when it is a regular file (else None): a progress bar's position and total."""

    def __init__(self, stream: BinaryIO, name: str, *, max_bytes: int, errors: str = "strict",
                 chunk: int = CHUNK) -> None:
        self.stream, self.name, self.max_bytes, self.errors, self.chunk = stream, name, max_bytes, errors, chunk
        self.buf = bytearray()
        self.start = 0  # where the next line begins in buf
        self.base = 0  # offset in the stream of buf[0]
        self.eof = False
        self.lines = 0  # lines given (or queued by has_text)
        self.queued: collections.deque[tuple[str, int]] = collections.deque()  # (line, consumed after it)
        self.consumed = 0
        self.size = _regular_size(stream)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self.queued:
            line, self.consumed = self.queued.popleft()
            return line
        line = self._read_line()
        if line is None:
            raise StopIteration
        self.consumed = self.base + self.start
        return line

    def has_text(self, look: int = 10_000) -> bool:
        """Whether the input holds a line with something besides whitespace, reading ahead (the lines read stay
        queued for iteration) until one is found, the input ends (False), or ``look`` lines were read (True: the
        rest is left to come)."""
        while len(self.queued) < look:
            line = self._read_line()
            if line is None:
                return False
            self.queued.append((line, self.base + self.start))
            if line.strip():
                return True
        return True

    def waiting(self) -> bool:
        """Whether the next line is neither read nor ready to be: a pipe or terminal whose writer has not written it
        yet (a regular file, or a stream that cannot tell, never waits)."""
        if self.queued or self.eof or _END.search(self.buf, self.start) is not None:
            return False
        try:
            ready, _, _ = select.select([self.stream.fileno()], [], [], 0)
        except (AttributeError, OSError, ValueError):  # no descriptor (BytesIO), or one select cannot watch
            return False
        return not ready

    def _read_line(self) -> str | None:
        """The next line (its end left out), or None at the end of the input."""
        scanned = 0  # bytes of the line searched already (the buffer may move under it)
        while True:
            found = _END.search(self.buf, self.start + scanned)
            end = found.start() if found is not None else len(self.buf)
            if end - self.start > self.max_bytes:
                raise DataError(f"{self.name}: line {self.lines + 1} is longer than {self.max_bytes:,} bytes (no "
                                "line end in them: not a text of lines?); split it, or raise the limit "
                                "(--max-document-tokens)")
            # a \r at the end of what was read may be the first half of \r\n: read on to know
            if found is not None and (end + 1 < len(self.buf) or self.buf[end] == 10 or self.eof):
                after = end + (2 if self.buf[end:end + 2] == b"\r\n" else 1)
                return self._take(end, after)
            if found is None and self.eof:
                return self._take(end, end) if end > self.start else None
            scanned = end - self.start
            self._fill()

    def _take(self, end: int, after: int) -> str:
        raw = bytes(self.buf[self.start:end])
        offset = self.base + self.start
        self.start = after
        self.lines += 1
        return decode_utf8(raw, self.name, offset=offset, errors=self.errors)

    def _fill(self) -> None:
        """Read the next chunk (the lines already given dropped from the buffer first)."""
        if self.start:
            del self.buf[:self.start]
            self.base += self.start
            self.start = 0
        read = getattr(self.stream, "read1", None) or self.stream.read  # read1: what a pipe has, without waiting
        try:
            data = read(self.chunk)
        except OSError as exc:  # EISDIR, EIO
            raise DataError(f"cannot read {self.name}: {exc.strerror or exc}") from None
        if not data:
            self.eof = True
        self.buf += data


def _regular_size(stream: BinaryIO) -> int | None:
    try:
        info = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@contextlib.contextmanager
def open_lines(source: str, *, max_bytes: int, errors: str = "strict") -> Iterator[LineReader]:
    """A :class:`LineReader` of the file ``source`` (``-``: standard input, left open), closed after the block; a
    one-line :class:`DataError` for a file that cannot be opened or read."""
    name = "standard input" if source == "-" else source
    try:
        stream = getattr(sys.stdin, "buffer", None) if source == "-" else open(Path(source), "rb")  # noqa: SIM115
    except OSError as exc:
        raise DataError(f"cannot read {name}: {exc.strerror or exc}") from None
    if stream is None:
        raise DataError("cannot read standard input: it is closed")
    try:
        yield LineReader(stream, name, max_bytes=max_bytes, errors=errors)
    finally:
        if source != "-":
            stream.close()
