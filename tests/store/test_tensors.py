"""Safetensors state dicts: round trip, tied names stored once, unreadable files refused
(``transformer_xl.store.tensors``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from transformer_xl.errors import CheckpointError
from transformer_xl.store.tensors import FORMAT_VERSION, load_tensors, save_tensors


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 4, generator=g),
        "b": torch.randn(4, generator=g).to(torch.float16),
        "ids": torch.arange(5, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "t": torch.randn(4, 3, generator=g).t(),  # not contiguous
    }


def _stored_keys(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_round_trip_keeps_names_dtypes_shapes_and_values(tmp_path: Path) -> None:
    state = _state()
    path = save_tensors(state, tmp_path / "sub" / "w.safetensors")
    assert path == tmp_path / "sub" / "w.safetensors" and [p.name for p in path.parent.iterdir()] == [path.name]
    back = load_tensors(path)
    assert set(back) == set(state)
    for name, t in state.items():
        assert back[name].dtype == t.dtype and back[name].device.type == "cpu"
        assert torch.equal(back[name], t)


def test_tied_names_are_stored_once_and_restored_as_aliases(tmp_path: Path) -> None:
    w = torch.nn.Parameter(torch.randn(5, 2))
    other = torch.randn(5, 2)
    state = {"emb.weight": w, "out.weight": w, "proj": other, "proj_tied": other, "free": w.detach().clone()}
    path = save_tensors(state, tmp_path / "w.safetensors")
    assert _stored_keys(path) == {"emb.weight", "proj", "free"}  # the first name of each storage
    assert json.loads(_metadata(path)["txl_aliases"]) == {"out.weight": "emb.weight", "proj_tied": "proj"}
    back = load_tensors(path)
    assert set(back) == set(state)
    assert back["out.weight"] is back["emb.weight"] and back["proj_tied"] is back["proj"]
    assert back["free"] is not back["emb.weight"]
    assert torch.equal(back["out.weight"], w.detach())
    assert torch.equal(back["proj_tied"], other)


def test_parameters_are_saved_without_autograd(tmp_path: Path) -> None:
    lin = torch.nn.Linear(3, 2)
    back = load_tensors(save_tensors(dict(lin.state_dict(keep_vars=True)), tmp_path / "w.safetensors"))
    assert not back["weight"].requires_grad
    assert torch.equal(back["weight"], lin.weight.detach())


def test_a_transposed_view_of_the_same_storage_is_not_an_alias(tmp_path: Path) -> None:
    a = torch.arange(4.0).view(2, 2)
    back = load_tensors(save_tensors({"a": a, "a_t": a.t(), "bits": a.view(torch.int32)}, tmp_path / "w.safetensors"))
    assert torch.equal(back["a_t"], a.t()) and torch.equal(back["bits"], a.view(torch.int32))


def test_overlapping_views_are_saved_as_copies(tmp_path: Path) -> None:
    a = torch.arange(6.0)
    back = load_tensors(save_tensors({"a": a, "tail": a[2:]}, tmp_path / "w.safetensors"))
    assert torch.equal(back["tail"], a[2:]) and torch.equal(back["a"], a)


def test_metadata_entries_are_kept(tmp_path: Path) -> None:
    path = save_tensors({"x": torch.ones(2)}, tmp_path / "w.safetensors", metadata={"step": "12", "note": "é"})
    meta = _metadata(path)
    assert meta["step"] == "12" and meta["note"] == "é"
    assert meta["format"] == "pt" and meta["txl_format_version"] == FORMAT_VERSION
    assert json.loads(meta["txl_aliases"]) == {}
    assert set(load_tensors(path)) == {"x"}  # metadata entries are not tensors


def test_saving_replaces_an_existing_file_atomically(tmp_path: Path) -> None:
    path = save_tensors({"x": torch.ones(2)}, tmp_path / "w.safetensors")
    save_tensors({"y": torch.zeros(3)}, path)
    assert set(load_tensors(path)) == {"y"} and [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


def test_missing_file_gives_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="weights file not found"):
        load_tensors(tmp_path / "absent.safetensors")
    with pytest.raises(CheckpointError, match="weights file not found"):
        load_tensors(tmp_path)  # a directory is not a weights file


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_unreadable_file_gives_checkpoint_error(tmp_path: Path, damage: str) -> None:
    path = save_tensors({"w": torch.randn(16, 16)}, tmp_path / "w.safetensors")
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x00garbage" * 20, "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="is not a readable safetensors file") as exc:
        load_tensors(path)
    assert str(path) in str(exc.value)


def test_bad_alias_metadata_gives_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(2)}, str(path), metadata={"txl_aliases": json.dumps({"v": "missing"})})
    with pytest.raises(CheckpointError, match="alias 'v' names a missing tensor 'missing'"):
        load_tensors(path)
    save_file({"w": torch.ones(2)}, str(path), metadata={"txl_aliases": "{not json"})
    with pytest.raises(CheckpointError, match="unreadable alias metadata"):
        load_tensors(path)


def test_plain_safetensors_file_without_txl_metadata_loads(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.arange(3.0)}, str(path))
    back = load_tensors(path)
    assert set(back) == {"w"} and back["w"].equal(torch.arange(3.0))


def test_read_header_gives_names_shapes_and_dtypes_without_reading_tensors(tmp_path: Path) -> None:
    from transformer_xl.store.tensors import TensorInfo, read_header

    w = torch.randn(5, 2)
    path = save_tensors({"w": w, "tied": w, "h": torch.ones(3, dtype=torch.bfloat16), "ids": torch.arange(4)},
                        tmp_path / "w.safetensors")
    header = read_header(path)
    assert header == {"w": TensorInfo((5, 2), "F32"), "tied": TensorInfo((5, 2), "F32"),
                      "h": TensorInfo((3,), "BF16"), "ids": TensorInfo((4,), "I64")}
    assert header["w"].numel == 10 and header["h"].floating and not header["ids"].floating
    path.write_bytes(path.read_bytes()[:-4])  # the header now claims more bytes than the file holds
    with pytest.raises(CheckpointError, match="is not a readable safetensors file") as exc:
        read_header(path)
    assert "\n" not in str(exc.value)
    save_file({"w": torch.ones(2)}, str(path), metadata={"txl_aliases": json.dumps({"v": "missing"})})
    with pytest.raises(CheckpointError, match="alias 'v' names a missing tensor 'missing'"):
        read_header(path)


def test_check_finite_names_the_first_non_finite_floating_tensor() -> None:
    from transformer_xl.store.tensors import check_finite

    check_finite({"ids": torch.arange(3), "w": torch.ones(2, dtype=torch.float16)}, "f")
    bad = torch.tensor([1.0, float("nan"), float("inf"), float("-inf")])
    with pytest.raises(CheckpointError, match=r"f: tensor 'b' holds non-finite values \(1 NaN, 2 inf\)"):
        check_finite({"a": torch.zeros(2), "b": bad, "c": bad}, "f")


def test_the_same_tensors_and_metadata_in_any_order_give_the_same_bytes(tmp_path: Path) -> None:
    """safetensors writes the metadata from a Rust HashMap (its order changes from one call to the next): the header
    is rewritten with sorted keys, so equal weights have equal SHA-256 and manifests. Tensors already come in a
    fixed order (dtype, then name)."""
    meta = {f"key{i}": f"value {i}" for i in range(10)} | {"odd": 'é ☃ \u2028 "q" \\ / \t\n\x01\x7f'}
    state = _state()
    paths = []
    for n in range(6):
        keys = sorted(meta, reverse=n % 2 == 1) if n < 2 else list(meta)[n:] + list(meta)[:n]
        names = list(state) if n % 2 else list(reversed(state))
        paths.append(save_tensors({k: state[k] for k in names}, tmp_path / f"{n}.safetensors",
                                  metadata={k: meta[k] for k in keys}))
    data = [p.read_bytes() for p in paths]
    assert all(d == data[0] for d in data[1:])
    size = int.from_bytes(data[0][:8], "little")
    assert size % 8 == 0  # the header keeps safetensors' alignment (padded with spaces)
    written = json.loads(data[0][8:8 + size])["__metadata__"]
    assert list(written) == sorted(written) and {k: written[k] for k in meta} == meta
    assert _metadata(paths[0]) == written  # safetensors reads it back
    assert all(torch.equal(load_tensors(paths[0])[k], t) for k, t in state.items())


def test_two_identical_training_runs_write_files_of_equal_sha256(tmp_path: Path) -> None:
    """Two runs of the same config write the same weights files, bit for bit (the models', the checkpoints' model
    and tensor state), so the manifests of best/ and final/ agree (a checkpoint's also holds its run's wall time)."""
    import dataclasses

    from tests.helpers import corpus_dir, tiny_train_config
    from transformer_xl.store.files import sha256_file
    from transformer_xl.train import Trainer

    cfg = tiny_train_config(tmp_path / "x", dataset=str(corpus_dir(tmp_path)), max_step=4)
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        Trainer(dataclasses.replace(cfg, out_dir=str(run))).fit()
    files = sorted(p.relative_to(runs[0]) for p in runs[0].rglob("*.safetensors"))
    assert len(files) >= 4 and files == sorted(p.relative_to(runs[1]) for p in runs[1].rglob("*.safetensors"))
    for name in [*files, Path("best/MANIFEST.json"), Path("final/MANIFEST.json")]:
        assert sha256_file(runs[0] / name) == sha256_file(runs[1] / name), name
