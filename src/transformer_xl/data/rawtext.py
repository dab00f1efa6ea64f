"""Reading raw corpus files: plain, gzip, xz or a zip member, and strict UTF-8 decoding in chunks."""

from __future__ import annotations

import gzip
import lzma
import zipfile
from collections.abc import Iterator
from pathlib import Path

from transformer_xl.errors import DataError

COMPRESSED_SUFFIXES = (".gz", ".xz")
CHUNK_BYTES = 8 << 20
PROGRESS_AFTER_S = 5.0  # quiet below: small corpora prepare without progress


def with_compressed_variants(path: Path) -> list[Path]:
    """``path`` followed by its ``.gz`` and ``.xz`` variants (the order in which they are looked up)."""
    return [path] + [path.with_name(path.name + s) for s in COMPRESSED_SUFFIXES]


def read_bytes(path: Path, member: str | None = None) -> bytes:
    """All (decompressed) bytes of ``path``; ``member`` names a file inside a zip archive."""
    try:
        if member is not None:
            with zipfile.ZipFile(path) as zf:
                return zf.read(member)
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        if path.suffix == ".xz":
            with lzma.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except KeyError as exc:
        raise DataError(f"{path}: archive has no member {member!r}") from exc
    except (OSError, EOFError, zipfile.BadZipFile, lzma.LZMAError) as exc:
        raise DataError(f"{path}: cannot read ({exc}); the file is corrupt or truncated, fetch it again") from exc


def iter_line_chunks(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """Split ``data`` into ``(byte_offset, chunk)`` pieces of about ``chunk_bytes`` ending after a newline."""
    pos, n = 0, len(data)
    while pos < n:
        end = data.find(b"\n", min(pos + chunk_bytes, n) - 1)
        end = n if end < 0 else end + 1
        yield pos, data[pos:end]
        pos = end


def decode_utf8(chunk: bytes, source: str, offset: int = 0, errors: str = "strict") -> str:
    """Decode UTF-8, turning a decoding error into a :class:`DataError` naming the file and byte offset."""
    try:
        return chunk.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{source}: invalid UTF-8 at byte offset {offset + exc.start}; "
            "fix the file or pass --errors replace (errors='replace')"
        ) from None


def normalize_newlines(text: str) -> str:
    """Universal newlines, as text-mode ``open`` reads a file: ``\\r\\n`` and ``\\r`` become ``\\n``."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def iter_text_chunks(data: bytes, source: str, errors: str = "strict") -> Iterator[str]:
    """Decoded, newline-normalized text of ``data`` in chunks that end at line boundaries.

    The preparation of a large file (more than one chunk) shows its progress on stderr once it lasts
    :data:`PROGRESS_AFTER_S` seconds: a bar on a terminal, else a line every ~10 %
    (:mod:`transformer_xl.data.progress`)."""
    from transformer_xl.data.progress import Progress

    chunks = -(-len(data) // CHUNK_BYTES)
    mode = "auto" if chunks > 1 else "off"
    name = Path(source).name or source
    with Progress(chunks, desc=f"prepare {name}: chunk", unit="chunk", mode=mode, min_seconds=PROGRESS_AFTER_S,
                  rate_unit="MB") as bar:
        for offset, chunk in iter_line_chunks(data, CHUNK_BYTES):
            yield normalize_newlines(decode_utf8(chunk, source, offset, errors))
            bar.update(1, amount=len(chunk) / (1 << 20))
