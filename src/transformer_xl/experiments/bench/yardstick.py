"""The yardstick of every speed figure the benchmarks print: the machine's limits, and the work measured against them.

* **Streaming bandwidth** (:func:`read_rate`): the best of several passes of a plain reduction (``Tensor.sum``)
  over a float32 buffer at least 8x the last-level cache and 256 MiB, so that it comes from DRAM, on huge pages
  (a core reads 4 KiB pages far more slowly: the page walks, and prefetchers that stop at page boundaries). It is
  the limit of a decoding step, which reads every byte it uses once. Beside it, for comparison only:
  :func:`linear_chain_rate`, the rate of ``F.linear`` passes over a model's weights (the limit the generation bench
  used before, a BLAS kernel's speed, not the machine's) and :func:`mv_skeleton_rate`, the bare chain of one
  ``torch.mv`` per weight matrix of a step in step order (the practical ceiling of a step made of BLAS calls).
* **Compute peak** (:func:`gemm_peak`): the best large square GEMM of a precision (sizes a precision cannot run
  within :data:`PEAK_BUDGET_S` skipped). A bf16 run is measured against
  the larger of the bf16 and fp32 peaks (:func:`gemm_peaks`): where bf16 is not native it is slower than fp32, and
  a run could always have chosen fp32.
* **Decode bytes** (:func:`step_bytes`): what one captured step reads, from the objects it uses: the packed
  weights as packed (int8 bytes and their scales, or float), less the zeros that pad a packed matrix to whole
  blocks (read, but not needed: reported apart, not counted in the limit), the key/value ring at its dtype, the
  position-key table, the slot positions; the embedding tables only by the rows a step gathers (the tied embedding
  is read in full once, as the softmax weights). ``W_kR`` is not read: the table replaces it. For any step (the
  plain one included) :func:`touched_bytes` counts the bytes of the tensors that existed before it and that its
  operations read, under a ``TorchDispatchMode``; ``tests/experiments/bench/test_yardstick.py`` checks that both
  agree (with the padding).
* **Training FLOPs, strictly** (:func:`forward_flops`, :func:`train_flops`): matmul FLOPs (2 per multiply-add) of
  the model's math. The attention's three ``[Q, K]`` products (scores ``a + c``, position scores ``b + d``, the
  values) are counted over the **visible** query-key pairs only (the causal mask's unmasked entries), not the
  rectangle an implementation computes. Training is forward + backward with both gradients (input and weight),
  except where no input gradient exists: the memory's key/value projections (the memory is detached) and
  ``W_kR R`` (``R`` is a constant) get the weight gradient only. Streaming evaluation projects only the segment's
  keys/values and no ``W_kR R`` (the inference cache keeps both from earlier segments).
* **GEMM skeleton** (:mod:`.skeleton`): the matrix products of one training step replayed back to back without
  the rest of the step: how close a step built from these BLAS calls could come to the GEMM peak.
* **Shares** (:func:`share`): a value over its limit, refused (:class:`YardstickError`) above
  ``1 +`` :data:`SHARE_TOLERANCE`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from transformer_xl.devices import is_cuda, synchronize
from transformer_xl.errors import TXLError
from transformer_xl.inference.arena import huge_page_buffer
from transformer_xl.inference.packing import Linear
from transformer_xl.model import TXLConfig
from transformer_xl.model.fastpath import cpu_caches
from transformer_xl.model.memory import causal_mask
from transformer_xl.train.precision import cpu_class, cpu_flags, cpu_model, matmul_rate

#: A share may exceed 1 by this much before :func:`share` refuses it: the limit and the value are timed at
#: different moments on a machine whose load moves, and a best-of-passes limit can still catch a slow moment. A
#: larger excess is a wrong yardstick (bytes or FLOPs not counted), not noise.
SHARE_TOLERANCE = 0.02
#: CPU flags that decide which kernels run, recorded with every figure.
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
#: Seconds :func:`gemm_peak` may spend on the products of one size. A precision the CPU has no native products for
#: (bf16 on AVX2: 1-2 GFLOP/s, a 2048^3 product 10 s or more) stops after its small sizes; its peak is then a lower
#: bound, and it does not matter: a bf16 run is measured against the fp32 peak where that is larger. fp32 never
#: reaches it (2048^3 at 55 GFLOP/s, a slow 2-core AVX2 CPU: 12 products in 3.8 s).
PEAK_BUDGET_S = 5.0
#: The read-rate buffer: at least this many bytes and this many times the last-level cache.
MIN_BUFFER_BYTES, LLC_MULTIPLE = 256 * 2**20, 8
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.embedding.default, torch.ops.aten.index_select.default}


class YardstickError(TXLError):
    """A figure above its limit: the yardstick or the count is wrong, and the bench does not print it."""


def share(value: float, limit: float, what: str = "share") -> float:
    """``value / limit``; a :class:`YardstickError` when it exceeds ``1 + SHARE_TOLERANCE`` (or a limit <= 0)."""
    if not limit > 0:
        raise YardstickError(f"{what}: the limit is {limit!r}, not a positive rate")
    out = value / limit
    if out > 1 + SHARE_TOLERANCE:
        raise YardstickError(f"{what}: {out * 100:.0f} % of its limit, above 100 % (a bytes or FLOP count is missing "
                             f"something, or the limit was measured wrong); refusing to report it")
    return out


# ---------------------------------------------------------------------------------------------- the machine
def llc_bytes(sysfs: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Size of the CPU's last-level cache (the highest level sysfs lists for cpu0), 0 where unknown."""
    caches = cpu_caches(sysfs)
    return caches[max(caches)] if caches else 0


def machine(device: str = "cpu") -> dict[str, Any]:
    """What every result file records beside its figures: the CPU (or GPU), its flags and the class of kernels this
    process runs on it (:func:`~transformer_xl.train.precision.cpu_class`), the last-level cache, the threads and the
    load average (the machine may be shared)."""
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    flags = cpu_flags(wanted=FLAGS)  # every flag cpu_class reads among them
    out: dict[str, Any] = {"cpu": cpu_model(), "cpu_flags": flags, "cpu_class": cpu_class(flags),
                           "llc_bytes": llc_bytes(), "threads": torch.get_num_threads(), "load_average": load}
    if is_cuda(device):
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def best_seconds(fn: Callable[[], Any], passes: int, device: str) -> float:
    """The fastest of ``passes`` timed calls of ``fn``, after one untimed call."""
    fn()
    best = math.inf
    for _ in range(passes):
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t)
    return best


def read_buffer(device: str = "cpu", *, nbytes: int | None = None, huge_pages: bool = True) -> torch.Tensor:
    """The buffer of the read pass: float32 ones, ``nbytes`` (default: ``max(8 x LLC, 256 MiB)``; on CUDA
    ``max(8 x L2, 1 GiB)``), on the CPU on huge pages (``huge_pages``; the memory the captured decoder streams from:
    :mod:`transformer_xl.inference.arena`) or on the allocator's 4 KiB pages."""
    if nbytes is None:
        if is_cuda(device):
            cache = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0)
            nbytes = max(LLC_MULTIPLE * cache, 2**30)
        else:
            nbytes = max(LLC_MULTIPLE * llc_bytes(), MIN_BUFFER_BYTES)
    numel = max(nbytes // 4, 1)
    if device == "cpu" and huge_pages:
        return huge_page_buffer(numel * 4).view(torch.float32).fill_(1.0)
    return torch.ones(numel, dtype=torch.float32, device=device)


def read_rate(device: str = "cpu", *, nbytes: int | None = None, passes: int = 5,
              huge_pages: bool = True) -> dict[str, Any]:
    """Streaming read bandwidth: bytes/s of the best of ``passes`` ``Tensor.sum`` passes over
    :func:`read_buffer` (on the CPU on huge pages unless ``huge_pages`` is False: a core reads 4 KiB pages far more
    slowly, and the captured step reads from huge pages)."""
    buf = read_buffer(device, nbytes=nbytes, huge_pages=huge_pages)
    secs = best_seconds(buf.sum, passes, device)
    pages = "huge pages" if device == "cpu" and huge_pages else "default pages"
    return {"bytes_per_s": buf.nbytes / secs, "buffer_bytes": buf.nbytes, "passes": passes,
            "method": f"Tensor.sum over a float32 buffer ({pages}), best pass"}


def linear_chain_rate(weights: Sequence[torch.Tensor], *, batch: int = 1, passes: int = 5) -> float:
    """Bytes/s of one ``F.linear`` of ``batch`` rows by every matrix of ``weights`` (a BLAS kernel's rate over
    these shapes, kept beside :func:`read_rate` for comparison)."""
    device = weights[0].device
    xs = {w.size(1): torch.randn(batch, w.size(1), device=device, dtype=w.dtype) for w in weights}

    def chain() -> None:
        for w in weights:
            F.linear(xs[w.size(1)], w)

    return sum(w.nbytes for w in weights) / best_seconds(chain, passes, device.type)


def mv_skeleton_rate(weights: Sequence[torch.Tensor], *, passes: int = 5) -> float:
    """Bytes/s of the bare skeleton of a batch-1 step: one ``torch.mv`` per matrix, in step order, each on the
    previous product where the shapes chain (the practical ceiling of a step built from BLAS matrix-vector
    calls)."""
    device = weights[0].device

    def chain() -> None:
        x = torch.ones(weights[0].size(1), device=device, dtype=weights[0].dtype)
        for w in weights:
            x = torch.mv(w, x if x.numel() == w.size(1) else x.new_ones(w.size(1)))

    return sum(w.nbytes for w in weights) / best_seconds(chain, passes, device.type)


def gemm_peak(dtype: str, device: str = "cpu", sizes: Iterable[int] | None = None, reps: int = 3,
              budget_s: float = PEAK_BUDGET_S) -> float:
    """Best FLOP/s of a square GEMM of ``dtype`` (``fp32`` or ``bf16``) over ``sizes`` (CPU: 256, 1024 and 2048;
    CUDA: 8192), smallest first; a size whose ``(reps + 1) x 3`` products would take more than ``budget_s`` at the
    best rate so far is not run, nor any larger one (:data:`PEAK_BUDGET_S`)."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    best = 0.0
    for n in sorted(sizes or ((8192,) if is_cuda(device) else (256, 1024, 2048))):
        if best and (reps + 1) * 3 * 2 * n**3 / best > budget_s:
            break
        best = max(best, matmul_rate(device, dt, n=n, reps=reps))
    return best


def gemm_peaks(device: str = "cpu") -> dict[str, float]:
    """The compute limit of each precision, measured one after the other: ``fp32`` its GEMM peak, ``bf16`` the
    larger of the bf16 and fp32 peaks (module docstring); ``bf16_gemm`` the bf16 GEMM itself."""
    fp32, bf16 = gemm_peak("fp32", device), gemm_peak("bf16", device)
    return {"fp32": fp32, "bf16": max(bf16, fp32), "bf16_gemm": bf16}


# ---------------------------------------------------------------------------------------------- decode bytes
def _spans(t: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(storage address, first byte, end byte)`` of every contiguous run of memory a (possibly strided) view
    covers (one range where the view is dense, or where it has more than ``2**16`` runs)."""
    if not t.numel():
        return []
    size = t.element_size()
    ptr, start = t.untyped_storage().data_ptr(), t.storage_offset() * size
    dims = sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda d: -d[1])  # same memory
    extent = 1 + sum((n - 1) * s for n, s in dims)
    run, inner = 1, len(dims)  # the longest contiguous suffix of dimensions: one run
    while inner and dims[inner - 1][1] == run:
        inner -= 1
        run *= dims[inner][0]
    outer = dims[:inner]
    if extent == t.numel() or math.prod(n for n, _ in outer) > 2**16:
        return [(ptr, start, start + extent * size)]
    offsets = torch.zeros(1, dtype=torch.long)
    for n, s in outer:
        offsets = (offsets[:, None] + torch.arange(n) * s).reshape(-1)
    return [(ptr, start + o * size, start + (o + run) * size) for o in offsets.tolist()]


def _union_bytes(spans: Iterable[tuple[int, int, int]]) -> int:
    """Bytes covered by byte ranges, each storage's overlapping ranges counted once."""
    total, by_storage = 0, {}
    for ptr, lo, hi in spans:
        by_storage.setdefault(ptr, []).append((lo, hi))
    for ranges in by_storage.values():
        end = -1
        for lo, hi in sorted(ranges):
            total += max(0, hi - max(lo, end))
            end = max(end, hi)
    return total


class _Reads(TorchDispatchMode):
    """Records the byte ranges of pre-existing tensors read by the operations run under it (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()  # storages the operations created
        self.seen: set[int] = set()  # storages that existed before
        self.spans: list[tuple[int, int, int]] = []
        self.gathered: dict[int, int] = {}  # storage -> bytes of rows gathered from it (a pre-existing table)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:  # a view reads nothing
            return out
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        written = {id(a) for a, arg in zip(args, func._schema.arguments)
                   if isinstance(a, torch.Tensor) and arg.alias_info is not None and arg.alias_info.is_write}
        for i, t in enumerate(inputs):
            ptr = t.untyped_storage().data_ptr()
            if t.dim() == 0 or not t.numel() or ptr in self.made:  # scalars and intermediates
                continue
            self.seen.add(ptr)
            if id(t) in written:  # a destination: written, not read
                continue
            if func in _INDEXING and i == 0:  # the table: every indexing op takes it first (embedding: weight)
                self.gathered[ptr] = self.gathered.get(ptr, 0) + out.nbytes  # only the rows gathered
            else:
                self.spans += _spans(t)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.seen:
                self.made.add(t.untyped_storage().data_ptr())
        return out


def touched_bytes(fn: Callable[[], Any]) -> int:
    """Bytes that ``fn`` reads of the tensors that existed before it: every pre-existing tensor an operation
    takes as input, as the memory its view covers (overlaps counted once), except tables it only indexes (the
    rows gathered) and destinations it writes (``copy_``, ``index_copy_``: a write is not a read); 0-dim tensors
    are left out (views of them are not). Run eagerly (a compiled graph runs its own
    kernels)."""
    with _Reads() as reads:
        fn()
    spanned = {ptr for ptr, _, _ in reads.spans}  # a table also read whole (tied softmax weights) counts once
    return _union_bytes(reads.spans) + sum(n for ptr, n in reads.gathered.items() if ptr not in spanned)


def step_bytes(decoder: Any) -> dict[str, int]:
    """Bytes one step of a :class:`~transformer_xl.inference.captured.CapturedDecoder` reads, by part (module
    docstring): ``weights`` (packed, with scales and biases; not the zero rows and columns that pad a packed
    matrix), ``embedding_rows``, ``ring`` (keys and values), ``position_keys``, ``slots`` (the slot positions, the
    position counter and the step's tokens), and their ``total``; beside them ``padding``, the zeros the step reads
    too but does not need (:attr:`~transformer_xl.inference.packing.Linear.padding_bytes`: not part of the limit)."""
    w = decoder.weights
    tree = (w["layers"], w["head"], [p for _, p in w["emb"]])
    leaves = [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
    full = {t.untyped_storage().data_ptr() for t in leaves}
    rows = sum(decoder.batch * table.size(1) * table.element_size() for table, _ in w["emb"]
               if table.untyped_storage().data_ptr() not in full)  # an untied table: the rows gathered
    padding = sum(lin.padding_bytes for lin in tree_leaves(tree, is_leaf=lambda x: isinstance(x, Linear))
                  if isinstance(lin, Linear))
    used, slots = decoder.mem_len + 1, decoder.slot_pos.numel()  # slots a step attends to, slots a ring holds
    ring = sum(t.nbytes for t in [*decoder.ks, *decoder.vs])
    table = sum(t.nbytes for t in decoder.pos_keys)
    parts = {"weights": _union_bytes(span for t in leaves if t.dim() for span in _spans(t)) - padding,
             "embedding_rows": rows, "ring": ring * used // slots, "position_keys": table * used // slots,
             "slots": used * decoder.slot_pos.element_size() + decoder.cur.nbytes + decoder.batch * 8}  # + tokens
    parts["total"] = sum(parts.values())
    # read too, but not needed (not part of the limit): zeros that pad packed matrices, slots beyond mem_len + 1
    parts["padding"] = padding + (ring + table + decoder.slot_pos.nbytes) * (slots - used) // slots
    return parts


# ---------------------------------------------------------------------------------------------- FLOPs
def visible_pairs(*, qlen: int, mlen: int, same_length: bool = False) -> int:
    """Query-key pairs the causal mask leaves visible in one ``[Q, M + Q]`` attention (per batch row and head):
    ``Q M + Q (Q + 1) / 2`` without ``same_length``; with it, as the model's mask over a memory of ``mlen``."""
    if not same_length:
        return qlen * mlen + qlen * (qlen + 1) // 2
    mask = causal_mask(qlen=qlen, mlen=mlen, mem_len=mlen, same_length=True, device=torch.device("cpu"))
    return int((~mask).sum())


def forward_flops(cfg: TXLConfig, *, batch: int, qlen: int, mlen: int, targets: torch.Tensor | None = None,
                  streaming: bool = False) -> dict[str, float]:
    """Matmul FLOPs of one forward segment by part (module docstring), and their ``total``.

    Per layer: ``W_q, W_k, W_v`` on the segment (``segment_qkv``), ``W_k, W_v`` on the memory (``memory_kv``;
    none when ``streaming``), ``W_kR`` on the ``M + Q`` position rows (``position_keys``; none when
    ``streaming``), the three ``[Q, K]`` products over the visible pairs (``attention``), ``W_o`` and the
    feed-forward (``output_ff``). Then the adaptive input projections (``embedding``, counted for the words of
    ``targets`` in each cluster, as a stand-in for the inputs) and the softmax (``softmax``: the head for every
    position, a tail cluster for the targets in it; ``targets=None``: every target in the head)."""
    d, hd, n_layer, n = cfg.d_model, cfg.n_head * cfg.d_head, cfg.n_layer, batch * qlen
    pairs = visible_pairs(qlen=qlen, mlen=mlen, same_length=cfg.same_length)
    parts = {"segment_qkv": 2 * n * d * 3 * hd, "memory_kv": 0 if streaming else 2 * batch * mlen * d * 2 * hd,
             "position_keys": 0 if streaming else 2 * (qlen + mlen) * d * hd,
             "attention": 3 * 2 * batch * pairs * hd, "output_ff": 2 * n * (hd * d + 2 * d * cfg.d_inner)}
    parts = {k: float(n_layer * v) for k, v in parts.items()}
    bounds = [0, *cfg.cutoffs, cfg.n_token]
    tgt = targets.reshape(-1) if targets is not None else torch.zeros(n, dtype=torch.long)
    parts["embedding"] = parts["softmax"] = 0.0
    for i in range(len(bounds) - 1):
        d_i = cfg.d_embed // cfg.div_val**i
        n_i = int(((tgt >= bounds[i]) & (tgt < bounds[i + 1])).sum()) if i else n
        n_in = int(((tgt >= bounds[i]) & (tgt < bounds[i + 1])).sum())
        proj = 2 * d * d_i if (cfg.div_val > 1 or cfg.d_embed != d) else 0
        v_i = bounds[i + 1] - bounds[i] + (len(cfg.cutoffs) if i == 0 else 0)
        parts["softmax"] += n_i * (proj + 2 * d_i * v_i)
        parts["embedding"] += n_in * proj
    parts["total"] = sum(parts.values())
    return parts


def train_flops(cfg: TXLConfig, *, batch: int, qlen: int, mlen: int, targets: torch.Tensor | None = None) -> float:
    """Matmul FLOPs of one training step (forward, backward; module docstring): 3x the forward, less the input
    gradients that do not exist (the memory's key/value projections and ``W_kR R`` get a weight gradient only)."""
    fwd = forward_flops(cfg, batch=batch, qlen=qlen, mlen=mlen, targets=targets)
    return 3 * fwd["total"] - fwd["memory_kv"] - fwd["position_keys"]


def plain_step_bytes(model: torch.nn.Module, tokens: torch.Tensor, mems: list[torch.Tensor], *, mem_len: int) -> int:
    """:func:`touched_bytes` of one steady-state plain decode step (:func:`transformer_xl.inference.generate.stream`)
    of ``model`` after the text whose last tokens ``[B]`` and memories are given (the third step from there: the
    first loads the memory into a new inference cache, the second grows its tables)."""
    from transformer_xl.inference.generate import stream

    steps = stream(model, tokens[:, None], mems=mems, max_new_tokens=3, mem_len=mem_len, captured=False)
    next(steps)
    next(steps)
    return touched_bytes(lambda: next(steps))
