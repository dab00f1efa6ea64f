"""The rules that differ between a CPU and a CUDA device (:mod:`transformer_xl.devices`), checked for both kinds on
the CPU: they decide from the device's name, no GPU needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_xl import devices


@pytest.mark.parametrize(("device", "backend", "where", "ids"), [
    ("cpu", "gloo", "cpu", None),
    ("cuda", "nccl", "cuda", [torch.device("cuda")]),
    ("cuda:1", "nccl", "cuda:1", [torch.device("cuda:1")]),
    (torch.device("cuda", 3), "nccl", "cuda:3", [torch.device("cuda:3")]),
])
def test_each_device_kind_gets_its_backend_collective_device_and_ddp_ids(device, backend, where, ids) -> None:
    """torchrun over GPUs: NCCL, collectives on the process's GPU, DDP given that one GPU; over CPUs: gloo, CPU
    tensors, no device ids (DDP refuses them for a CPU module)."""
    assert devices.process_group_backend(device) == backend
    assert devices.collective_device(device) == where
    assert devices.ddp_device_ids(device) == ids
    assert devices.is_cuda(device) == (backend == "nccl")


def test_cpu_synchronize_and_bind_do_nothing() -> None:
    devices.synchronize("cpu")
    devices.bind("cpu")


def test_to_device_moves_every_nested_tensor_and_keeps_the_rest() -> None:
    state = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.ones(1), 3)], "c": "x", "d": None}
    moved = devices.to_device(state, "meta")
    assert moved["a"].device.type == "meta" and moved["b"][0].device.type == "meta"
    assert isinstance(moved["b"][1], tuple) and moved["b"][1][0].device.type == "meta" and moved["b"][1][1] == 3
    assert moved["c"] == "x" and moved["d"] is None
    assert state["a"].device.type == "cpu"  # the input is left as it was


def test_float32_matmul_settings_report_tf32() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert devices.float32_matmul_settings()["cuda_matmul_tf32"] is False
        torch.set_float32_matmul_precision("high")
        got = devices.float32_matmul_settings()
        assert got["float32_matmul_precision"] == "high" and got["cuda_matmul_tf32"] is True
        assert set(got) == {"float32_matmul_precision", "cuda_matmul_tf32", "cudnn_tf32"}
    finally:
        torch.set_float32_matmul_precision(before)


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2000 kB\nMemFree:        1500 kB\nMemAvailable:   1000 kB\n")
    group = tmp_path / "cgroup"
    group.mkdir()
    assert devices.available_bytes("cpu", meminfo=meminfo, cgroup=group) == 1000 * 1024  # no limit files
    (group / "memory").mkdir()  # cgroup v1: "no limit" is a huge number
    (group / "memory" / "memory.limit_in_bytes").write_text(str(1 << 62))
    (group / "memory" / "memory.usage_in_bytes").write_text("1000\n")
    assert devices.available_bytes("cpu", meminfo=meminfo, cgroup=group) == 1000 * 1024
    (group / "memory" / "memory.limit_in_bytes").write_text("300000\n")
    assert devices.available_bytes("cpu", meminfo=meminfo, cgroup=group) == 300000 - 1000
    (group / "memory.max").write_text("max\n")  # cgroup v2 comes first
    (group / "memory.current").write_text("12345\n")
    assert devices.available_bytes("cpu", meminfo=meminfo, cgroup=group) == 1000 * 1024
    (group / "memory.max").write_text("500000\n")
    assert devices.available_bytes("cpu", meminfo=meminfo, cgroup=group) == 500000 - 12345
    assert devices.available_bytes("meta") is None
    real = devices.available_bytes("cpu")
    assert real is None or real > 0


def test_available_memory_of_cuda_is_its_free_memory(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 30, 80 << 30))
    assert devices.available_bytes("cuda:0") == 3 << 30
