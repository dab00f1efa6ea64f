"""The TensorBundle reader on a checkpoint TensorFlow wrote (tests/assets/tf_tiny), and on that checkpoint damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.interop.tf_files import tf_tiny
from transformer_xl.errors import CheckpointError
from transformer_xl.interop.tensorbundle import TensorBundle, find_prefix, masked_crc32c


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return tf_tiny(tmp_path / "tiny") / "model" / "model.ckpt-0"


def test_every_variable_tensorflow_wrote_reads_with_its_checksum(ckpt: Path) -> None:
    bundle = TensorBundle(ckpt)
    assert bundle.header == {"num_shards": 1, "endianness": 0}
    shapes = bundle.shapes()
    assert shapes["transformer/r_w_bias"] == (2, 2, 4)
    assert shapes["transformer/layer_1/rel_attn/qkv/kernel"] == (8, 24)
    assert "transformer/layer_0/ff/layer_1/kernel/Adam_1" in shapes and shapes["global_step"] == ()
    for name in bundle.entries:  # every checksum of the file passes
        array = bundle.read(name)
        assert array.shape == shapes[name]
    assert bundle.read("global_step").dtype == np.int64
    assert np.isfinite(bundle.read("transformer/adaptive_embed/cutoff_0/lookup_table")).all()


def test_masked_crc32c_is_tensorflows() -> None:
    # crc32c("123456789") = 0xE3069283 (the standard check value), masked as TensorFlow's crc32c::Mask does
    c = 0xE3069283
    assert masked_crc32c(b"123456789") == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_a_truncated_data_shard_is_one_line(ckpt: Path) -> None:
    shard = Path(f"{ckpt}.data-00000-of-00001")
    shard.write_bytes(shard.read_bytes()[:-100])  # the last bytes are an optimizer slot's: refused all the same
    with pytest.raises(CheckpointError, match="the shard is truncated"):
        TensorBundle(ckpt)


def test_a_flipped_byte_of_a_tensor_fails_its_checksum(ckpt: Path) -> None:
    bundle = TensorBundle(ckpt)
    entry = bundle.entries["transformer/layer_0/rel_attn/o/kernel"]
    shard = Path(f"{ckpt}.data-00000-of-00001")
    blob = bytearray(shard.read_bytes())
    blob[entry.offset + 5] ^= 0x10
    shard.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="fail their checksum"):
        bundle.read(entry.name)


@pytest.mark.parametrize("damage", ["missing", "truncated", "block", "magic"])
def test_a_damaged_or_missing_index_is_one_line(ckpt: Path, damage: str) -> None:
    index = Path(f"{ckpt}.index")
    blob = bytearray(index.read_bytes())
    if damage == "missing":
        index.unlink()
    elif damage == "truncated":
        index.write_bytes(bytes(blob[: len(blob) // 2]))
    elif damage == "block":  # a byte inside the first data block: its CRC fails
        blob[20] ^= 0x01
        index.write_bytes(bytes(blob))
    else:
        blob[-1] ^= 0xFF
        index.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError) as info:
        TensorBundle(ckpt)
    assert "\n" not in str(info.value)
    assert {"missing": "not found", "truncated": "no table footer", "block": "checksum fails",
            "magic": "no table footer"}[damage] in str(info.value)


def test_a_missing_shard_is_one_line(ckpt: Path) -> None:
    Path(f"{ckpt}.data-00000-of-00001").unlink()
    with pytest.raises(CheckpointError, match=r"data shard .* not found"):
        TensorBundle(ckpt)


def test_the_prefix_is_found_from_a_directory_its_index_or_the_released_layout(ckpt: Path) -> None:
    for src in (ckpt, Path(f"{ckpt}.index"), Path(f"{ckpt}.data-00000-of-00001"), ckpt.parent, ckpt.parent.parent):
        assert find_prefix(src) == ckpt


def test_a_checkpoint_file_written_on_another_machine_is_followed_to_the_file_beside_it(ckpt: Path) -> None:
    (ckpt.parent / "checkpoint").write_text('model_checkpoint_path: "/home/someone/xl/model/model.ckpt-0"\n')
    assert find_prefix(ckpt.parent) == ckpt


def test_two_checkpoints_and_a_checkpoint_file_naming_neither_are_refused(ckpt: Path) -> None:
    for suffix in (".index", ".data-00000-of-00001"):
        Path(f"{ckpt.parent / 'model.ckpt-7'}{suffix}").write_bytes(Path(f"{ckpt}{suffix}").read_bytes())
    (ckpt.parent / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-9"\n')
    with pytest.raises(CheckpointError, match=r"names model\.ckpt-9, which is not in"):
        find_prefix(ckpt.parent)
    (ckpt.parent / "checkpoint").unlink()
    with pytest.raises(CheckpointError, match="holds 2 checkpoints"):
        find_prefix(ckpt.parent)
    assert find_prefix(ckpt.parent / "model.ckpt-7") == ckpt.parent / "model.ckpt-7"


def test_nothing_there_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint"):
        find_prefix(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"no TensorFlow checkpoint \(\*.index\)"):
        find_prefix(tmp_path)


def test_partitioned_variables_are_joined_from_their_slices() -> None:
    """tests/assets/tf_partitioned: TensorFlow's Saver with a variable split by rows (fixed_size_partitioner(2): 3 + 2
    rows) and one split by columns, each slice with distinct values, beside a plain variable; values.json holds
    what TensorFlow gave for the whole variables (tf.concat of the parts)."""
    import json

    from tests.helpers import REPO

    root = REPO / "tests" / "assets" / "tf_partitioned"
    bundle = TensorBundle(root / "model.ckpt-0")
    assert bundle.shapes() == {"part": (5, 3), "cols": (2, 4), "plain": (2,)}  # the slices' own keys left out
    want = json.loads((root / "values.json").read_text())
    assert bundle.read("part").tolist() == want["part"]
    assert bundle.read("cols").tolist() == want["cols"]
    assert bundle.read("plain").tolist() == [1.0, 2.0]


def test_a_missing_slice_is_one_line(tmp_path: Path) -> None:
    """The index with one slice's entry dropped (its key renamed so that it belongs to no variable)."""
    from tests.helpers import REPO

    root = REPO / "tests" / "assets" / "tf_partitioned"
    for name in ("model.ckpt-0.index", "model.ckpt-0.data-00000-of-00001"):
        (tmp_path / name).write_bytes((root / name).read_bytes())
    bundle = TensorBundle(tmp_path / "model.ckpt-0")
    key = next(n for n in bundle.entries if n.startswith("\x00part"))
    bundle.entries["\x00gone"] = bundle.entries.pop(key)
    with pytest.raises(CheckpointError, match="partitioned into 2 slices but the index holds 1"):
        bundle.read("part")
