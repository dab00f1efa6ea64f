"""``txl convert --from tf`` on a multi-GB TensorFlow checkpoint: time, MB/s and peak memory.

Usage::

    python benchmarks/bench_tf_convert.py [--model wt103] [--slots 2] [--json benchmarks/results/tf_convert_wt103.json]

A checkpoint of the released model's real shape (``transformer_xl.interop.tf.RELEASED``: every variable
``tf/model.py`` makes for it, random values) is written in TensorFlow's V2 format by :func:`write_bundle` below,
with ``--slots`` optimizer slots per variable beside it (Adam's ``/Adam`` and ``/Adam_1``, as a training run leaves
them): the WikiText-103 model and two slots make a 3.4 GB bundle. Then ``txl convert --from tf`` runs on it in a
process of its own, and the figures are:

* wall time, and the model's bytes read per second, beside a plain streaming read of the same data shard (8 MiB
  ``readinto`` a reused buffer) measured in the same run: both from the page cache, the shard having just been
  written (the conversion also transposes, checksums, writes and hashes its output);
* a plain write of the model's size (8 MiB at a time, then fsync, as txl's atomic writes end), and the share of the
  conversion's time that reading the model and writing it once at those rates would take;
* the conversion's peak resident memory (``ru_maxrss``) against the output's size and the largest tensor, less the
  process's own footprint (the same command on the tests' tiny checkpoint): a converter that held the bundle, or the
  model twice, would show it.

The writer follows the format's published definition (a LevelDB table of ``BundleEntryProto``s, masked CRC-32C);
the reader is tested on checkpoints TensorFlow itself wrote (``tests/assets/tf_tiny``, ``make test-tf``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from transformer_xl.interop.tensorbundle import TABLE_MAGIC, masked_crc32c
from transformer_xl.interop.tf import tf_shapes
from transformer_xl.interop.tf_released import PROJ_SAME_DIM, RELEASED

REPO = Path(__file__).resolve().parents[1]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _entry(shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    dims = b"".join(_field(2, _varint(1 << 3) + _varint(d)) for d in shape)
    return (_varint(1 << 3) + _varint(1) + _field(2, dims) + _varint(4 << 3) + _varint(offset) +
            _varint(5 << 3) + _varint(size) + _varint(6 << 3 | 5) + crc.to_bytes(4, "little"))


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    return body + (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart point, at 0


def write_bundle(prefix: Path, tensors: dict[str, tuple[int, ...]], fill) -> int:
    """A V2 checkpoint ``prefix`` of float32 ``tensors`` (name -> shape), each filled by ``fill(name, shape)``;
    returns the data shard's size."""
    entries: list[tuple[bytes, bytes]] = [(b"", _varint(1 << 3) + _varint(1) + _field(3, _varint(1 << 3) +
                                                                                      _varint(1)))]
    offset = 0
    with open(f"{prefix}.data-00000-of-00001", "wb") as f:
        for name in sorted(tensors):
            data = np.ascontiguousarray(fill(name, tensors[name]), dtype="<f4")
            f.write(data.tobytes())
            entries.append((name.encode(), _entry(tensors[name], offset, data.nbytes, masked_crc32c(data))))
            offset += data.nbytes
    index = bytearray()

    def put(block: bytes) -> tuple[int, int]:
        at = len(index)
        index.extend(block + b"\x00" + masked_crc32c(block + b"\x00").to_bytes(4, "little"))
        return at, len(block)

    data_handle = put(_block(entries))
    meta_handle = put(_block([]))
    index_handle = put(_block([(entries[-1][0], _varint(data_handle[0]) + _varint(data_handle[1]))]))
    footer = _varint(meta_handle[0]) + _varint(meta_handle[1]) + _varint(index_handle[0]) + _varint(index_handle[1])
    index.extend(footer.ljust(40, b"\x00") + TABLE_MAGIC.to_bytes(8, "little"))
    Path(f"{prefix}.index").write_bytes(bytes(index))
    return offset


def plain_read_rate(path: Path) -> float:
    """MB/s of reading ``path`` whole, 8 MiB at a time into one buffer."""
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    start, done = time.perf_counter(), 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            done += n
    return done / (time.perf_counter() - start) / 1e6


def plain_write_rate(path: Path, n_bytes: int) -> float:
    """MB/s of writing ``n_bytes`` to ``path`` 8 MiB at a time, then fsync (as txl's atomic writes end)."""
    chunk = np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(0, n_bytes, len(chunk)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    rate = n_bytes / (time.perf_counter() - start) / 1e6
    path.unlink()
    return rate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(RELEASED), default="wt103")
    p.add_argument("--slots", type=int, default=2, help="optimizer slots per variable (Adam: 2)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cfg = RELEASED[args.model].config()
    shapes = tf_shapes(cfg, PROJ_SAME_DIM[args.model])
    model_bytes = sum(4 * int(np.prod(s)) for s in shapes.values())
    largest = max(4 * int(np.prod(s)) for s in shapes.values())
    tensors = dict(shapes)
    for name, shape in shapes.items():
        for slot in ("Adam", "Adam_1")[: args.slots]:
            tensors[f"{name}/{slot}"] = shape
    tensors["global_step"] = ()
    rng = np.random.default_rng(0)

    def fill(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if "/Adam" in name or name == "global_step":
            return np.full(shape, 1e-3, dtype=np.float32)
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    with tempfile.TemporaryDirectory(dir=os.environ.get("TXL_BENCH_TMP")) as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        t0 = time.perf_counter()
        shard = write_bundle(root / "model" / "model.ckpt-0", tensors, fill)
        written = time.perf_counter() - t0
        shard_path = root / "model" / "model.ckpt-0.data-00000-of-00001"
        read_rate = plain_read_rate(shard_path)
        write_rate = plain_write_rate(root / "yardstick.bin", model_bytes)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "transformer_xl", "convert", "--from", "tf", str(root / "model"),
                               "--preset", args.model, "--out", str(root / "out")], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        # the process's own footprint (python, torch, txl's CLI): the same command on the tiny TF-written checkpoint
        # of the tests, in a process of its own measured through a wrapper
        probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
        base = int(subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "transformer_xl", "convert",
                                   "--from", "tf", str(REPO / "tests" / "assets" / "tf_tiny"), "--out",
                                   str(root / "tiny")], capture_output=True, text=True, check=True).stdout)
        out_bytes = sum(f.stat().st_size for f in (root / "out").iterdir())
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result = {
        "command": "python benchmarks/bench_tf_convert.py " + shlex.join(sys.argv[1:]), "model": args.model,
        "bundle_bytes": shard, "model_bytes": model_bytes, "largest_tensor_bytes": largest,
        "output_bytes": out_bytes, "write_seconds": round(written, 2), "convert_seconds": round(seconds, 2),
        "convert_model_mb_per_s": round(model_bytes / seconds / 1e6, 1),
        "convert_bundle_mb_per_s": round(shard / seconds / 1e6, 1),
        "plain_read_mb_per_s": round(read_rate, 1), "plain_write_mb_per_s": round(write_rate, 1),
        "convert_share_of_read_then_write": round((model_bytes / read_rate + model_bytes / write_rate) / 1e6
                                                  / seconds, 3),
        "peak_rss_bytes": peak,
        "baseline_rss_bytes": base, "peak_over_output": round(peak / out_bytes, 3),
        "peak_less_baseline_over_output_plus_largest": round((peak - base) / (out_bytes + largest), 3),
        "peak_over_bundle": round(peak / shard, 3),
        "cpu": cpu, "cores": os.cpu_count(), "load_average": os.getloadavg()[0],
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
