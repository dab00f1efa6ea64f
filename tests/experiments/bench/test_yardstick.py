"""The yardstick: shares refused above their limit, the machine's limits (structure only, tiny buffers), decode bytes
equal to what a step's operations read, FLOPs counted by hand."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_model
from transformer_xl.experiments.bench import yardstick as Y
from transformer_xl.inference.arena import HUGE_PAGE
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.inference.decode import step
from transformer_xl.inference.generate import stream
from transformer_xl.model import TXLConfig


def test_share_is_the_ratio_and_refuses_more_than_the_limit() -> None:
    assert Y.share(30.0, 40.0) == 0.75
    assert Y.share(1 + Y.SHARE_TOLERANCE, 1.0) == 1 + Y.SHARE_TOLERANCE  # timer noise: printed as measured
    with pytest.raises(Y.YardstickError, match="captured step: 150 % of its limit"):
        Y.share(3.0, 2.0, "captured step")
    with pytest.raises(Y.YardstickError, match="not a positive rate"):
        Y.share(1.0, 0.0)


def test_llc_is_the_highest_level_sysfs_lists(tmp_path: Path) -> None:
    for name, level, size in (("index0", 1, "32K"), ("index2", 2, "1024K"), ("index3", 3, "32768K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert Y.llc_bytes(tmp_path) == 32 * 2**20
    assert Y.llc_bytes(tmp_path / "missing") == 0


def test_limits_have_their_structure_on_tiny_buffers() -> None:
    rate = Y.read_rate(nbytes=4096, passes=2)
    assert rate["buffer_bytes"] == 4096 and rate["bytes_per_s"] > 0 and rate["passes"] == 2
    assert "huge pages" in rate["method"] and "default pages" in Y.read_rate(nbytes=64, huge_pages=False)["method"]
    for huge in (True, False):  # the read pass's buffer: ones (a sum of them is its length), on huge pages or not
        buf = Y.read_buffer(nbytes=4 * 2**20, huge_pages=huge)
        assert buf.dtype == torch.float32 and float(buf.sum()) == 2**20
        if huge and hasattr(mmap, "MADV_HUGEPAGE"):
            assert buf.data_ptr() % HUGE_PAGE == 0
    weights = [torch.randn(8, 4), torch.randn(4, 8), torch.randn(6, 3)]
    assert Y.linear_chain_rate(weights, batch=2, passes=1) > 0 and Y.mv_skeleton_rate(weights, passes=1) > 0
    assert Y.gemm_peak("fp32", sizes=(32,), reps=1) > 0
    machine = Y.machine()
    assert machine["cpu"] and isinstance(machine["cpu_flags"], list) and machine["threads"] >= 1


def test_bf16_is_measured_against_the_faster_of_the_two_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Y, "gemm_peak", lambda dtype, device="cpu": {"fp32": 100.0, "bf16": 60.0}[dtype])
    assert Y.gemm_peaks() == {"fp32": 100.0, "bf16": 100.0, "bf16_gemm": 60.0}


# ---------------------------------------------------------------------------------------------- bytes
def test_touched_bytes_counts_what_operations_read_of_existing_tensors() -> None:
    weight, table, x = torch.randn(5, 3), torch.randn(10, 3), torch.randn(2, 3)
    buf = torch.zeros(4, 6, 3)  # capacity 6 per row: a [:, :2] slice covers 4 runs of 2 x 3 floats
    idx = torch.tensor([1, 7])
    n_x, n_w, n_rows, n_slice = 2 * 3 * 4, 5 * 3 * 4, 2 * 3 * 4, 4 * 2 * 3 * 4

    def fn() -> None:
        F.linear(x, weight)
        F.linear(x, weight.t().t())  # the same memory again: once
        table[idx]  # indexed: only the rows gathered
        buf[:, :2].sum()  # a strided slice: its runs, not the gaps
        buf[:, 3].copy_(torch.ones(4, 3))  # a destination: written, not read

    assert Y.touched_bytes(fn) == n_x + n_w + idx.nbytes + n_rows + n_slice
    # a table also read whole (tied softmax weights) counts once
    assert Y.touched_bytes(lambda: (table[idx], F.linear(x, table))) == idx.nbytes + table.nbytes + n_x


@pytest.mark.parametrize(("overrides", "int8", "kv_dtype"), [
    ({"cutoffs": [20]}, False, "float32"), ({"cutoffs": [20]}, True, "bfloat16"),
    ({"cutoffs": [20], "div_val": 2}, False, "float32"), ({"cutoffs": [20], "div_val": 2}, True, "float32"),
    ({"untie_r": False}, False, "bfloat16")])
def test_step_bytes_are_the_bytes_a_captured_step_reads(overrides: dict, int8: bool, kv_dtype: str) -> None:
    model = tiny_model(**overrides)
    dec = CapturedDecoder(model, batch=2, mem_len=6, int8=int8, kv_dtype=kv_dtype, compile=False)
    first = next(stream(model, torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0)),
                        max_new_tokens=1, mem_len=6))
    dec.load(first.mems)
    counted = Y.step_bytes(dec)
    touched = Y.touched_bytes(lambda: step(dec.spec, dec.weights, first.tokens, dec.ks, dec.vs, dec.slot_pos,
                                           dec.cur, dec.pos_keys))
    assert counted["total"] + counted["padding"] == touched  # the zeros that pad packed matrices: read, not counted
    assert counted["ring"] == 2 * 2 * (2 * 2 * 7 * 8) * (4 if kv_dtype == "float32" else 2)  # L x (k, v) x B H C E
    if not int8 and "div_val" not in overrides:  # every parameter once (the tied embedding as the softmax), but W_kR
        assert counted["weights"] == sum(p.nbytes for n, p in model.named_parameters() if "r_net" not in n)


def test_a_plain_step_reads_no_w_kr_and_every_other_layer_weight() -> None:
    model = tiny_model(cutoffs=[20])
    first = next(stream(model, torch.randint(0, 50, (2, 6)), max_new_tokens=1, mem_len=6))
    reads = Y._Reads()
    steps = stream(model, first.tokens[:, None], mems=first.mems, max_new_tokens=3, mem_len=6)
    next(steps), next(steps)
    with reads:
        next(steps)
    read = {ptr for ptr, _, _ in reads.spans}
    for name, p in model.layers.named_parameters():
        assert (p.untyped_storage().data_ptr() in read) == ("r_net" not in name), name
    total = Y.plain_step_bytes(model, first.tokens, first.mems, mem_len=6)
    assert total == Y._union_bytes(reads.spans) + sum(reads.gathered.values())


# ---------------------------------------------------------------------------------------------- FLOPs
def test_visible_pairs_by_hand() -> None:
    # Q 2 after M 1: query 0 sees keys 0-1, query 1 keys 0-2
    assert Y.visible_pairs(qlen=2, mlen=1) == 5
    # same_length, Q 3 after M 2: every query sees mem_len = 2 keys, itself included
    assert Y.visible_pairs(qlen=3, mlen=2, same_length=True) == 6


def test_flops_by_hand() -> None:
    cfg = TXLConfig(n_token=10, n_layer=1, n_head=2, d_model=4, d_head=2, d_inner=8)
    b, q, m = 3, 5, 7
    n, pairs = b * q, q * m + q * (q + 1) // 2  # 35 + 15 visible of the 60 in the [Q, K] rectangle
    fwd = Y.forward_flops(cfg, batch=b, qlen=q, mlen=m)
    assert fwd["segment_qkv"] == 2 * n * 4 * 12 and fwd["memory_kv"] == 2 * b * m * 4 * 8
    assert fwd["position_keys"] == 2 * (q + m) * 4 * 4 and fwd["attention"] == 3 * 2 * b * pairs * 4
    assert fwd["output_ff"] == 2 * n * (4 * 4 + 2 * 4 * 8) and fwd["softmax"] == n * 2 * 4 * 10
    assert fwd["embedding"] == 0 and fwd["total"] == sum(v for k, v in fwd.items() if k != "total")
    stream_ = Y.forward_flops(cfg, batch=b, qlen=q, mlen=m, streaming=True)
    assert stream_["total"] == fwd["total"] - fwd["memory_kv"] - fwd["position_keys"]
    # the memory's K/V projections and W_kR R: forward and a weight gradient (2x), the rest 3x
    assert Y.train_flops(cfg, batch=b, qlen=q, mlen=m) == 3 * fwd["total"] - fwd["memory_kv"] - fwd["position_keys"]


def test_flops_of_adaptive_clusters_count_each_target_in_its_cluster() -> None:
    cfg = TXLConfig(n_token=30, n_layer=1, n_head=2, d_model=8, d_head=4, d_inner=8, cutoffs=[10], div_val=2)
    targets = torch.tensor([[1, 2, 15]])  # two in the head, one in the tail cluster (d_1 = 4, 20 words)
    fwd = Y.forward_flops(cfg, batch=1, qlen=3, mlen=0, targets=targets)
    head = 3 * (2 * 8 * 8 + 2 * 8 * 11)  # projection + [10 words; 1 cluster row] for every position
    tail = 1 * (2 * 8 * 4 + 2 * 4 * 20)
    assert fwd["softmax"] == head + tail
    assert fwd["embedding"] == 2 * 2 * 8 * 8 + 1 * 2 * 8 * 4


def test_int8_weights_count_as_their_values_scales_and_bias() -> None:
    from transformer_xl.model.int8 import int8_linear

    weight, bias, x = torch.randn(6, 4), torch.randn(6), torch.randn(3, 4)
    layer = int8_linear(weight, bias)
    # int8 rows (padded to the kernel's block), one bf16 scale per row, the float bias, and the input read; the
    # padded bf16 copy of the input is made by the step, not read from before it
    assert layer.weight.dtype == torch.int8 and layer.scale.dtype == torch.bfloat16
    expected = layer.weight.nbytes + layer.scale.nbytes + bias.nbytes + x.nbytes
    assert expected == 6 * 16 + 6 * 2 + 6 * 4 + 3 * 4 * 4
    assert Y.touched_bytes(lambda: layer(x)) == expected
