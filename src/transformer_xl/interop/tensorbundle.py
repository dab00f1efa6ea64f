"""TensorFlow checkpoints (``tf.train.Saver``'s V2 format, "TensorBundle") read without TensorFlow.

A checkpoint ``PREFIX`` is ``PREFIX.index`` plus data shards ``PREFIX.data-SSSSS-of-NNNNN``. Written here from the
format's published definition (TensorFlow's ``core/util/tensor_bundle/tensor_bundle.proto`` and ``tensor_bundle.cc``,
and the LevelDB table format that ``core/lib/io/table`` keeps):

* ``.index`` is a sorted table: data blocks of key/value entries (each key stored as the bytes it shares with the
  previous key, then the rest), an index block of ``BlockHandle``s (varint offset, varint size) and a 48-byte footer
  (two handles, padding, the magic ``0xdb4775248b80fb57``). Every block is followed by a 1-byte compression type
  (0: none, which is what ``Saver`` writes) and the masked CRC-32C of the block and that byte.
* The key ``""`` holds a ``BundleHeaderProto`` (``num_shards``, ``endianness``); every other key is a variable's name
  and holds a ``BundleEntryProto``: ``dtype``, ``shape``, ``shard_id``, ``offset``, ``size`` and the masked CRC-32C
  of the tensor's bytes, which lie raw (row-major, little-endian) at ``offset`` of shard ``shard_id``.

Nothing is read before it is asked for: :meth:`TensorBundle.read` reads one tensor, checking its size and checksum
as it streams, so a checkpoint of any size converts holding one tensor at a time. A partitioned variable
(``tf.fixed_size_partitioner`` and the like) is joined from its slices, stored under keys that encode the name and
each slice's extent. The protobuf messages are decoded
by the few lines of wire format below (no generated code, no ``protobuf`` dependency); CRC-32C is Google's
``google-crc32c`` (its C implementation). Every flaw of a file (truncated, tampered, a checksum that fails, a type
that is not a number, slices that do not cover their variable) is a one-line
:class:`~transformer_xl.errors.CheckpointError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transformer_xl.errors import CheckpointError

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER = 5  # compression type (1 byte) + masked CRC-32C (4 bytes)
CHUNK = 8 << 20  # bytes read (and checksummed) at a time

#: TensorFlow ``DataType`` numbers of the types a model's variables can have -> numpy dtype (bfloat16 kept as raw
#: 16-bit words: :func:`as_torch` turns them into ``torch.bfloat16``).
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("u1"), 5: np.dtype("<i2"),
    6: np.dtype("i1"), 9: np.dtype("<i8"), 10: np.dtype("?"), 14: np.dtype("<u2"), 19: np.dtype("<f2"),
}
DTYPE_NAMES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
               9: "int64", 10: "bool", 14: "bfloat16", 19: "float16", 20: "resource", 21: "variant"}
BFLOAT16 = 14


def _crc():  # imported on use: only TensorFlow checkpoints need it
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - a core dependency
        raise CheckpointError("reading a TensorFlow checkpoint needs google-crc32c (pip install google-crc32c)") \
            from None
    return google_crc32c


def masked_crc32c(data: bytes | memoryview, crc: int | None = None) -> int:
    """TensorFlow's (and LevelDB's) masked CRC-32C of ``data``: ``rotr15(crc) + 0xa282ead8``."""
    c = _crc().value(bytes(data)) if crc is None else crc
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------- wire format
def _varint(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise CheckpointError(f"{what}: a number runs past its end (truncated or damaged)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, what: str) -> Iterator[tuple[int, int | bytes]]:
    """The ``(field number, value)`` pairs of a protobuf message: varints and fixed numbers as ints, the
    length-delimited fields as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, what)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, what)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise CheckpointError(f"{what}: a field runs past its end (truncated or damaged)")
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        elif wire == 2:
            size, pos = _varint(buf, pos, what)
            if pos + size > len(buf):
                raise CheckpointError(f"{what}: a field runs past its end (truncated or damaged)")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise CheckpointError(f"{what}: not a protobuf message (wire type {wire})")
        yield field, value


@dataclass(frozen=True)
class BundleEntry:
    """Where one tensor of a checkpoint lies, and what it is."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None
    slices: tuple[tuple[tuple[int, int], ...], ...] = ()  # a partitioned variable: each slice's (start, length)s

    @property
    def sliced(self) -> bool:
        return bool(self.slices)

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"type {self.dtype}")


def _entry(name: str, value: bytes) -> BundleEntry:
    what = f"checkpoint index entry {name!r}"
    dtype, shape, shard, offset, size, crc, slices = 0, [], 0, 0, 0, None, []
    for field, v in _fields(value, what):
        if field == 1 and isinstance(v, int):
            dtype = v
        elif field == 2 and isinstance(v, bytes):
            for f, dim in _fields(v, what):
                if f == 2 and isinstance(dim, bytes):
                    size_of = dict((k, x) for k, x in _fields(dim, what) if k == 1)
                    shape.append(int(size_of.get(1, 0)))
                elif f == 3 and v:
                    raise CheckpointError(f"{what} has an unknown rank")
        elif field == 3 and isinstance(v, int):
            shard = v
        elif field == 4 and isinstance(v, int):
            offset = v
        elif field == 5 and isinstance(v, int):
            size = v
        elif field == 6 and isinstance(v, int):
            crc = v
        elif field == 7 and isinstance(v, bytes):  # TensorSliceProto: extent {start, length (absent: all)}
            extents = []
            for f, ext in _fields(v, what):
                if f == 1 and isinstance(ext, bytes):
                    parts = dict((k, x) for k, x in _fields(ext, what) if isinstance(x, int))
                    extents.append((int(parts.get(1, 0)), int(parts.get(2, -1))))
            slices.append(tuple(extents))
    return BundleEntry(name, dtype, tuple(shape), shard, offset, size, crc, tuple(slices))


# ---------------------------------------------------------------------------------------------- the index table
def _block(data: bytes, offset: int, size: int, path: Path) -> bytes:
    """The contents of the table block at ``offset`` (``size`` bytes), its trailer checked."""
    end = offset + size
    if offset < 0 or end + BLOCK_TRAILER > len(data):
        raise CheckpointError(f"{path}: a block lies past the end of the file (truncated)")
    block, kind = data[offset:end], data[end]
    stored = int.from_bytes(data[end + 1:end + BLOCK_TRAILER], "little")
    if masked_crc32c(data[offset:end + 1]) != stored:
        raise CheckpointError(f"{path}: a block's checksum fails (the index is damaged)")
    if kind != 0:
        raise CheckpointError(f"{path}: a block is compressed (type {kind}); tf.train.Saver writes none")
    return block


def _entries(block: bytes, path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The key/value pairs of a table block (prefix-compressed keys; the restart array at the end is skipped)."""
    if len(block) < 4:
        raise CheckpointError(f"{path}: a block is too short")
    restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 - 4 * restarts
    if limit < 0:
        raise CheckpointError(f"{path}: a block's restart array is damaged")
    pos, key = 0, b""
    what = str(path)
    while pos < limit:
        shared, pos = _varint(block, pos, what)
        unshared, pos = _varint(block, pos, what)
        length, pos = _varint(block, pos, what)
        if shared > len(key) or pos + unshared + length > limit:
            raise CheckpointError(f"{path}: a key or value runs past its block (damaged)")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def _handle(buf: bytes, pos: int, path: Path) -> tuple[int, int, int]:
    offset, pos = _varint(buf, pos, str(path))
    size, pos = _varint(buf, pos, str(path))
    return offset, size, pos


def read_index(path: str | Path) -> tuple[dict[str, int], dict[str, BundleEntry]]:
    """``(header fields, name -> entry)`` of a checkpoint's ``.index`` file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found (a TensorFlow checkpoint PREFIX needs PREFIX.index)") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) < FOOTER_SIZE or int.from_bytes(data[-8:], "little") != TABLE_MAGIC:
        raise CheckpointError(f"{path} is not a TensorFlow checkpoint index (no table footer; truncated?)")
    footer = data[-FOOTER_SIZE:]
    _, _, pos = _handle(footer, 0, path)  # the meta-index block: empty in a checkpoint
    index_offset, index_size, _ = _handle(footer, pos, path)
    header: dict[str, int] | None = None
    entries: dict[str, BundleEntry] = {}
    for _, handle in _entries(_block(data, index_offset, index_size, path), path):
        offset, size, _ = _handle(handle, 0, path)
        for key, value in _entries(_block(data, offset, size, path), path):
            if key == b"":
                header = {"num_shards": 1, "endianness": 0}
                for field, v in _fields(value, f"{path} header"):
                    if field == 1 and isinstance(v, int):
                        header["num_shards"] = v
                    elif field == 2 and isinstance(v, int):
                        header["endianness"] = v
                continue
            if key.startswith(b"\x00"):  # a slice of a partitioned variable: its key encodes name and extent
                name = key.decode("latin-1")
            else:
                try:
                    name = key.decode("utf-8")
                except UnicodeDecodeError:
                    raise CheckpointError(f"{path}: a variable name is not UTF-8 (damaged)") from None
            entries[name] = _entry(name, value)
    if header is None:
        raise CheckpointError(f"{path} has no bundle header (not a tf.train.Saver V2 checkpoint)")
    if header["endianness"] != 0:
        raise CheckpointError(f"{path} was written big-endian; only little-endian checkpoints are read")
    return header, entries


# ---------------------------------------------------------------------------------------------- the bundle
class TensorBundle:
    """A TensorFlow V2 checkpoint ``prefix``: its entries from the index, tensors read one at a time."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        self.header, self.entries = read_index(f"{self.prefix}.index")
        n = self.header["num_shards"]
        if not 1 <= n <= 100_000:
            raise CheckpointError(f"{self.prefix}.index names {n} data shards (damaged)")
        self.shards = [Path(f"{self.prefix}.data-{i:05d}-of-{n:05d}") for i in range(n)]
        for i, shard in enumerate(self.shards):  # a shard shorter than its entries say: truncated (whatever is cut)
            need = max((e.offset + e.size for e in self.entries.values() if e.shard == i), default=0)
            try:
                have = shard.stat().st_size
            except FileNotFoundError:
                raise CheckpointError(f"data shard {shard} not found (a checkpoint is PREFIX.index and its "
                                      "PREFIX.data-* files)") from None
            if have < need:
                raise CheckpointError(f"{shard} is {have:,} bytes but its index places tensors up to byte {need:,}: "
                                      "the shard is truncated")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Variable name -> shape, from the index alone (a partitioned variable under its own name, its slices'
        entries left out)."""
        return {name: e.shape for name, e in self.entries.items() if not name.startswith("\x00")}

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy array (bfloat16 as ``uint16`` words), its size and CRC-32C checked while
        it streams from its shard."""
        e = self.entries.get(name)
        if e is None:
            raise CheckpointError(f"{self.prefix} has no variable {name!r}")
        if e.sliced:
            return self._join(e)
        return self._read(e)

    def _join(self, e: BundleEntry) -> np.ndarray:
        """A partitioned variable from its slices. A slice's key encodes the name, then each dimension's start and
        length as order-preserving numbers, so the slices' keys sort as their starts do: they are matched to the
        index's extents in that order, each checked to have its extent's shape, and together to cover the whole."""
        escaped = b"".join({0: b"\x00\xff", 255: b"\xff\x00"}.get(c, bytes([c])) for c in e.name.encode("utf-8"))
        prefix = (b"\x00" + escaped + b"\x00\x01").decode("latin-1")  # OrderedCode: 0, then the name
        keys = sorted((n for n in self.entries if n.startswith(prefix)), key=lambda n: n.encode("latin-1"))
        extents = sorted(tuple((start, e.shape[d] if length < 0 else length) for d, (start, length) in enumerate(x))
                         for x in e.slices)
        if len(keys) != len(extents) or any(len(x) != len(e.shape) for x in extents):
            raise CheckpointError(f"{self.prefix}: {e.name} is partitioned into {len(extents)} slices but the index "
                                  f"holds {len(keys)} of them (damaged)")
        out, covered = None, 0
        for key, extent in zip(keys, extents):
            part = self._read(self.entries[key], what=e.name)
            if part.shape != tuple(length for _, length in extent) or any(
                    start + length > size for (start, length), size in zip(extent, e.shape)):
                raise CheckpointError(f"{self.prefix}: a slice of {e.name} does not fit its extent (damaged)")
            if out is None:
                out = np.zeros(e.shape, dtype=part.dtype)
            out[tuple(slice(start, start + length) for start, length in extent)] = part
            covered += part.size
        if out is None or covered != out.size:
            raise CheckpointError(f"{self.prefix}: the slices of {e.name} do not cover it (damaged)")
        return out

    def _read(self, e: BundleEntry, what: str | None = None) -> np.ndarray:
        name = what or e.name
        dtype = DTYPES.get(e.dtype)
        if dtype is None:
            raise CheckpointError(f"{self.prefix}: {name} is of type {e.dtype_name}, not a number type")
        count = int(np.prod(e.shape, dtype=np.int64)) if e.shape else 1
        if count * dtype.itemsize != e.size or e.shard >= len(self.shards):
            raise CheckpointError(f"{self.prefix}: the index entry of {name} is inconsistent ({e.size} bytes for "
                                  f"{e.dtype_name} {list(e.shape)}, shard {e.shard}); the index is damaged")
        out = np.empty(count, dtype=dtype)
        octets = out.view(np.uint8)
        raw = memoryview(octets)
        shard = self.shards[e.shard]
        crc = _crc()
        value = 0
        try:
            with open(shard, "rb") as f:
                f.seek(e.offset)
                done = 0
                while done < e.size:
                    got = f.readinto(raw[done:done + CHUNK])
                    if not got:
                        raise CheckpointError(f"{shard} ends inside {name} (at byte {e.offset + done}; the shard is "
                                              "truncated)")
                    value = crc.extend(value, octets[done:done + got])
                    done += got
        except FileNotFoundError:
            raise CheckpointError(f"data shard {shard} not found (a checkpoint is PREFIX.index and its "
                                  "PREFIX.data-* files)") from None
        except OSError as exc:
            raise CheckpointError(f"cannot read {shard}: {exc.strerror or exc}") from None
        if e.crc32c is not None and masked_crc32c(b"", crc=value) != e.crc32c:
            raise CheckpointError(f"{shard}: the bytes of {name} fail their checksum (the shard is damaged)")
        return out.reshape(e.shape)


# ---------------------------------------------------------------------------------------------- finding a checkpoint
_CHECKPOINT_LINE = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"\s*$', re.M)


def find_prefix(src: str | Path) -> Path:
    """The checkpoint prefix that ``src`` names: a prefix itself (``.../model.ckpt-0``, its ``.index`` or a data
    shard), a directory whose ``checkpoint`` file names one (a path recorded on another machine is looked for beside
    it) or that holds exactly one ``*.index``, or a released model directory holding ``model/``."""
    src = Path(src)
    if src.name.endswith(".index") and src.is_file():
        return src.with_name(src.name[: -len(".index")])
    shard = re.fullmatch(r"(.+)\.data-\d{5}-of-\d{5}", src.name)
    if shard and src.is_file():  # a data shard: its checkpoint's prefix
        return find_prefix(src.with_name(shard.group(1)))
    if Path(f"{src}.index").is_file():
        return src
    if not src.is_dir():
        raise CheckpointError(f"{src} is not a TensorFlow checkpoint: no {src}.index and no such directory")
    if (src / "model").is_dir() and not any(src.glob("*.index")):
        return find_prefix(src / "model")
    indexes = sorted(p.name[: -len(".index")] for p in src.glob("*.index"))
    listed = src / "checkpoint"
    if listed.is_file():
        try:
            m = _CHECKPOINT_LINE.search(listed.read_text(encoding="utf-8", errors="replace"))
        except OSError as exc:
            raise CheckpointError(f"cannot read {listed}: {exc.strerror or exc}") from None
        if m:
            named = Path(m.group(1).encode().decode("unicode_escape"))
            for candidate in (named if named.is_absolute() else src / named, src / named.name):
                if Path(f"{candidate}.index").is_file():
                    return candidate
            raise CheckpointError(f"{listed} names {named}, which is not in {src} (its .index is missing); "
                                  f"checkpoints there: {', '.join(indexes) or 'none'}")
    if len(indexes) == 1:
        return src / indexes[0]
    if not indexes:
        raise CheckpointError(f"no TensorFlow checkpoint (*.index) in {src}")
    raise CheckpointError(f"{src} holds {len(indexes)} checkpoints ({', '.join(indexes[:4])}) and no checkpoint "
                          "file naming one: give the prefix, e.g. " + str(src / indexes[-1]))
