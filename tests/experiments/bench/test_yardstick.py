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


def test_llc_reads_every_unit_and_keeps_the_largest_cache_of_the_highest_level(tmp_path: Path) -> None:
    def cache(name: str, level: str, size: str | None) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level)
        if size is not None:
            (tmp_path / name / "size").write_text(size)

    cache("index0", "1\n", "48K\n")
    cache("index1", "3", "16m")  # lower case
    cache("index2", "3", "32M")  # the same level, larger: kept
    cache("index3", "3", "8M")
    cache("index4", "x", "1G")  # a level that is not a number: skipped
    cache("index5", "4", None)  # no size: skipped
    assert Y.llc_bytes(tmp_path) == 32 * 2**20
    cache("index6", "4", "1G")
    assert Y.llc_bytes(tmp_path) == 2**30
    cache("index7", "5", "4096")  # bytes, no unit
    assert Y.llc_bytes(tmp_path) == 4096
    cache("index8", "6", "B")
    assert Y.llc_bytes(tmp_path) == 0


@pytest.mark.skipif(not Path("/sys/devices/system/cpu/cpu0/cache").is_dir(), reason="no sysfs cache listing")
def test_the_default_llc_is_cpu0s() -> None:
    assert Y.llc_bytes() == Y.llc_bytes("/sys/devices/system/cpu/cpu0/cache") > 0


def test_machine_records_the_cpu_its_flags_cache_threads_and_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Y, "cpu_model", lambda: "AMD EPYC 9R14")
    monkeypatch.setattr(Y, "cpu_flags", lambda wanted: [f for f in wanted if f != "fma"])
    monkeypatch.setattr(Y, "llc_bytes", lambda: 123)
    monkeypatch.setattr(Y.os, "getloadavg", lambda: (1.0, 0.25, 12.345))
    classed: list[list[str]] = []
    monkeypatch.setattr(Y, "cpu_class", lambda flags: classed.append(flags) or "avx512-bf16")
    assert Y.machine() == {"cpu": "AMD EPYC 9R14", "cpu_flags": [f for f in Y.FLAGS if f != "fma"], "llc_bytes": 123,
                           "cpu_class": "avx512-bf16", "threads": torch.get_num_threads(),
                           "load_average": "1.00 0.25 12.35"}
    assert classed == [[f for f in Y.FLAGS if f != "fma"]]  # the class from the flags read once

    def no_load() -> tuple:
        raise OSError("no load average")

    monkeypatch.setattr(Y.os, "getloadavg", no_load)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: f"GPU {d}")
    out = Y.machine("cuda:1")
    assert out["load_average"] == "unknown" and out["gpu"] == "GPU cuda:1"


def test_best_seconds_is_the_fastest_timed_pass_after_an_untimed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    durations, now, calls = iter([0.5, 0.2, 0.3]), [0.0], []

    def clock() -> float:
        now[0] += next(durations) if len(calls) % 2 else 0.0
        calls.append(now[0])
        return now[0]

    monkeypatch.setattr(Y.time, "perf_counter", clock)
    runs = []
    assert Y.best_seconds(lambda: runs.append(1), passes=3, device="cpu") == pytest.approx(0.2)
    assert len(runs) == 4 and len(calls) == 6


def test_the_read_buffer_is_max_of_8_llc_and_256_mib_and_lives_on_huge_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Y, "llc_bytes", lambda: 64 * 2**20)
    assert Y.read_buffer("meta").shape == (8 * 64 * 2**20 // 4,)
    monkeypatch.setattr(Y, "llc_bytes", lambda: 2**20)
    buf = Y.read_buffer("meta")
    assert buf.shape == (256 * 2**20 // 4,) and buf.dtype == torch.float32 and buf.device.type == "meta"
    assert Y.read_buffer("meta", nbytes=6).shape == (1,) and Y.read_buffer("meta", nbytes=0).shape == (1,)
    asked: list[int] = []
    monkeypatch.setattr(Y, "huge_page_buffer", lambda n: asked.append(n) or torch.zeros(n, dtype=torch.uint8))
    got = Y.read_buffer(nbytes=4099)
    assert asked == [4096] and got.dtype == torch.float32 and torch.equal(got, torch.ones(1024))
    assert Y.read_buffer(nbytes=4096, huge_pages=False).shape == (1024,) and asked == [4096]


def test_read_rate_is_the_buffers_bytes_over_its_best_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple] = []
    monkeypatch.setattr(Y, "best_seconds", lambda fn, passes, device: seen.append((fn(), passes, device)) or 0.5)
    rate = Y.read_rate(nbytes=4096, passes=7)
    assert rate == {"bytes_per_s": 8192.0, "buffer_bytes": 4096, "passes": 7,
                    "method": "Tensor.sum over a float32 buffer (huge pages), best pass"}
    assert float(seen[0][0]) == 1024.0 and seen[0][1:] == (7, "cpu")  # the pass sums the buffer
    assert Y.read_rate(nbytes=64, huge_pages=False)["passes"] == 5 and seen[-1][1] == 5


def test_chain_rates_are_the_weights_bytes_over_the_best_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple] = []
    monkeypatch.setattr(Y, "best_seconds", lambda fn, passes, device: seen.append((fn(), passes, device)) or 0.25)
    weights = [torch.randn(8, 4), torch.randn(4, 8), torch.randn(6, 3)]
    total = sum(w.nbytes for w in weights)
    assert Y.linear_chain_rate(weights, batch=2) == total * 4 and seen[-1][1:] == (5, "cpu")
    assert Y.mv_skeleton_rate(weights, passes=2) == total * 4 and seen[-1][1:] == (2, "cpu")


def test_gemm_peak_is_the_best_size_of_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple] = []
    monkeypatch.setattr(Y, "matmul_rate", lambda device, dt, n, reps: asked.append((device, dt, n, reps)) or 1e15 / n)
    assert Y.gemm_peak("bf16") == 1e15 / 256
    assert asked == [("cpu", torch.bfloat16, n, 3) for n in (256, 1024, 2048)]
    asked.clear()
    assert Y.gemm_peak("fp32", "cuda:0", reps=2) == 1e15 / 8192 and asked == [("cuda:0", torch.float32, 8192, 2)]
    asked.clear()
    Y.gemm_peak("fp32", sizes=(32, 16))
    assert [a[2] for a in asked] == [16, 32]  # smallest first


@pytest.mark.parametrize("cpu_class, sizes", [("avx2", [256]), ("amx", [256, 1024, 2048])])
def test_gemm_peak_skips_the_sizes_a_slow_precision_cannot_run_within_its_budget(monkeypatch: pytest.MonkeyPatch,
                                                                                 cpu_class: str, sizes) -> None:
    """bf16 on a CPU without native bf16 products (1-2 GFLOP/s: a 2048^3 product alone takes 10 s) stops after the
    256^3 probe; where bf16 is native (AMX: 700-1,500 GFLOP/s) every size runs; fp32 runs every size on both."""
    bf16_rate = {"avx2": 2.4e9, "amx": 1.3e12}[cpu_class]
    asked: list[tuple] = []
    monkeypatch.setattr(Y, "matmul_rate", lambda device, dt, n, reps: asked.append((dt, n)) or (
        bf16_rate if dt is torch.bfloat16 else 55e9))
    assert Y.gemm_peak("bf16") == bf16_rate and [n for _, n in asked] == sizes
    asked.clear()
    assert Y.gemm_peak("fp32") == 55e9 and [n for _, n in asked] == [256, 1024, 2048]
    asked.clear()
    Y.gemm_peak("bf16", budget_s=1e9)  # no budget: every size
    assert [n for _, n in asked] == [256, 1024, 2048]


def test_gemm_peaks_measure_fp32_then_bf16_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple] = []
    monkeypatch.setattr(Y, "gemm_peak", lambda dtype, device: asked.append((dtype, device)) or 50.0)
    assert Y.gemm_peaks("cuda") == {"fp32": 50.0, "bf16": 50.0, "bf16_gemm": 50.0}
    assert asked == [("fp32", "cuda"), ("bf16", "cuda")]


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
    # the tied embedding is read whole as the softmax weights: its gathered rows are not counted again
    assert total == Y._union_bytes(reads.spans) + sum(n for ptr, n in reads.gathered.items() if ptr not in read)


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


def test_spans_are_the_contiguous_runs_of_a_view() -> None:
    base = torch.zeros(50, 6)
    ptr = base.untyped_storage().data_ptr()
    rows = base[2:42, 1:4]  # 40 runs of 3 floats, 6 apart, from element 13
    assert Y._spans(rows) == [(ptr, (13 + 6 * i) * 4, (16 + 6 * i) * 4) for i in range(40)]
    assert Y._spans(base[:, :1].t()) == [(ptr, 0 + 24 * i, 4 + 24 * i) for i in range(50)]  # one float per run
    dense = torch.zeros(3, 5)
    assert Y._spans(dense.t()) == [(dense.untyped_storage().data_ptr(), 0, 60)]  # transposed, still dense: one
    one = torch.zeros(4, 1, 3)[:, :, :2]  # a size-1 dimension does not split the runs
    assert Y._spans(one) == [(one.untyped_storage().data_ptr(), 12 * i, 12 * i + 8) for i in range(4)]
    assert Y._spans(torch.zeros(0, 3)) == []
    for n, many in ((2**16, True), (2**16 + 1, False)):  # past 2**16 runs: one range over the extent
        col = torch.zeros(n, 2)[:, :1]
        spans = Y._spans(col)
        assert (len(spans) == n) == many
        assert spans[-1][2] == (2 * (n - 1) + 1) * 4 and spans[0][1] == 0


def test_touched_bytes_leaves_out_scalars_and_counts_gathered_rows_each_time() -> None:
    """``F.embedding(indices, weight)`` dispatches ``embedding(weight, indices)``: the table is its first input, as
    for ``index`` and ``index_select`` (the whole table was counted, and the indices as gathered rows)."""
    table, idx, x = torch.randn(10, 4), torch.tensor([1, 7, 7]), torch.randn(6)
    two = torch.tensor(2.0)
    assert Y.touched_bytes(lambda: x * two) == x.nbytes  # a 0-dim tensor: not counted
    assert Y.touched_bytes(lambda: (torch.nn.functional.embedding(idx, table),
                                    torch.nn.functional.embedding(idx[:2], table))) == (3 + 2) * 16 + idx.nbytes


def test_counts_are_integers_and_same_length_counts_its_own_mask() -> None:
    assert isinstance(Y.visible_pairs(qlen=3, mlen=2), int)
    cfg = TXLConfig(n_token=10, n_layer=1, n_head=2, d_model=4, d_head=2, d_inner=8)
    same = TXLConfig(n_token=10, n_layer=1, n_head=2, d_model=4, d_head=2, d_inner=8, same_length=True)
    plain, short = (Y.forward_flops(c, batch=1, qlen=3, mlen=2)["attention"] for c in (cfg, same))
    assert (plain, short) == (3 * 2 * 12 * 4, 3 * 2 * 6 * 4)  # 3 x 2 + 3 x 4 / 2 pairs; 6 with same_length
    with pytest.raises(Y.YardstickError, match=r"^share: 300 % of its limit"):
        Y.share(3.0, 1.0)


def test_the_read_buffer_on_a_gpu_is_max_of_8_l2_and_1_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    class Props:
        L2_cache_size = 200 * 2**20

    asked, made = [], []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: asked.append(d) or Props())
    monkeypatch.setattr(torch, "ones", lambda n, dtype=None, device=None: made.append((n, dtype, device)))
    Y.read_buffer("cuda:1")
    Props.L2_cache_size = 2**20
    Y.read_buffer("cuda")
    assert asked == [torch.device("cuda:1"), torch.device("cuda")]
    assert made == [(8 * 200 * 2**20 // 4, torch.float32, "cuda:1"), (2**30 // 4, torch.float32, "cuda")]
    del Props.L2_cache_size  # a device that does not say: 1 GiB
    Y.read_buffer("cuda")
    assert made[-1][0] == 2**30 // 4


def test_the_chains_multiply_every_weight_by_inputs_of_its_type_and_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple] = []
    monkeypatch.setattr(Y, "best_seconds", lambda fn, passes, device: seen.append((passes, device)) or fn() or 1.0)
    weights = [torch.randn(8, 4, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64),
               torch.randn(6, 5, dtype=torch.float64)]
    real_mv, mvs = torch.mv, []
    monkeypatch.setattr(torch, "mv", lambda w, x: mvs.append((w, x.clone())) or real_mv(w, x))
    Y.mv_skeleton_rate(weights)
    assert seen[-1] == (5, "cpu") and [w.shape for w, _ in mvs] == [w.shape for w in weights]
    ones = torch.ones(4, dtype=torch.float64)
    assert torch.equal(mvs[0][1], ones) and torch.equal(mvs[1][1], weights[0] @ ones)  # chained where shapes chain
    assert torch.equal(mvs[2][1], torch.ones(5, dtype=torch.float64))  # a fresh input where they do not
    lins: list[tuple] = []
    monkeypatch.setattr(Y.F, "linear", lambda x, w: lins.append((x.shape, x.dtype, x.device, w.shape)))
    Y.linear_chain_rate(weights, batch=3, passes=2)
    assert seen[-1] == (2, "cpu")
    assert lins == [((3, w.size(1)), torch.float64, torch.device("cpu"), w.shape) for w in weights]
    lins.clear()
    Y.linear_chain_rate(weights[:1])
    assert lins[0][0] == (1, 4)  # one row by default
