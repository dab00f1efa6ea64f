"""A captured one-token decode step: :class:`CapturedDecoder`, the state of one generation over fixed buffers.

Generation's plain step (:mod:`transformer_xl.inference.generate`) runs the model's forward on a ``[B, 1]``
segment: a few hundred small operations dispatched one by one from Python. The captured step is the same math
(:func:`transformer_xl.inference.decode.step`) with static shapes over fixed-capacity buffers, compiled once into
one graph (``torch.compile``: inductor's C++ kernels on the CPU; on CUDA the same graph replayed as a CUDA graph,
``mode="reduce-overhead"`` with the buffers marked static), so a step costs little more than reading its bytes.

The public contract stays the functional one: :meth:`CapturedDecoder.step` takes the memories of the text so far
(``n_layer + 1`` tensors ``[B, M, D]``, as :class:`~transformer_xl.model.TransformerXLLM` returns them) and
returns the next ones, which stay what they were when returned. Internally:

* the keys/values live in a ring of ``mem_len + 1`` slots per layer (:mod:`transformer_xl.inference.decode`);
* on the CPU the packed weights and position keys are one buffer in step order, every ring a buffer of its own,
  all on huge pages (:mod:`transformer_xl.inference.arena`: a step streams them at the machine's read rate);
* the memories returned are views of append-only buffers ``[L + 1, B, C_h, D]`` (each position written once;
  when full, the live window moves to new buffers, as :class:`transformer_xl.model.InferenceCache` does);
* a step whose ``mems`` are not the ones this decoder returned last (unmodified: same objects, same version
  counters) first loads them: their keys/values are projected once into the ring. So branches from an older
  state and several texts interleaved over one decoder give the plain path's values (``tests/inference``).

The weights are packed, and the position keys ``W_kR R_d`` of every distance tabulated, when the decoder is made
(:func:`transformer_xl.inference.packing.pack`, :func:`~transformer_xl.inference.decode.position_keys`): build a new
decoder after changing them. The compiled graph is keyed by the step's constants and shapes, so a second
decoder of the same model shape (another generation) reuses it without compiling again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves, tree_map

from transformer_xl.errors import ConfigError, check_int
from transformer_xl.inference.arena import huge_page_zeros, into_arena
from transformer_xl.inference.decode import (
    block_slots,
    check_supported,
    linear,
    position_keys,
    ring_slots,
    spec_of,
    step,
)
from transformer_xl.inference.packing import ROW_BLOCK, pack
from transformer_xl.model import Lengths, TransformerXLLM
from transformer_xl.model.dispatch import decode_products
from transformer_xl.model.fastpath import allow_graphs, compile_unavailable
from transformer_xl.model.native import PRODUCTS, unavailable
from transformer_xl.model.positional import sinusoid

#: Key/value ring dtypes :class:`CapturedDecoder` accepts (by name).
KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CaptureOptions:
    """How a generation builds its captured decoder (``stream(..., captured=CaptureOptions(int8=True))``; ``True``
    is ``CaptureOptions()``): int8 weights, and the type of the key/value ring (:data:`KV_DTYPES`)."""

    int8: bool = False
    kv_dtype: str = "float32"


_COMPILED: dict[str, object] = {}  # kind -> torch.compile(step): one compiled function per kind, shared

# ---------------------------------------------------------------------------------------------- when it pays
#: What the first step of a captured decoder is expected to cost, in seconds: inductor compiling the graph
#: ("cold") or taking it from its on-disk cache ("warm", a graph this machine compiled before). Measured by
#: ``benchmarks/compile_time.py`` (benchmarks/results/compile_time_cpu_1t.json: the 2-core EPYC, one thread, load
#: 1.9 -> 1.4): WT103-base at memory 640 44.2 s cold, 4.8 s warm; the demo model 19.7 s and 3.5 s. These are the
#: larger figures, rounded up to 5 s (a test checks it against the file): a smaller model is estimated on the safe
#: side (it captures later than it could).
COMPILE_S = {"cold": 45.0, "warm": 5.0}

#: The share of a plain step's time the captured step saves, at least (the same file: about half on WT103-base's
#: shape, more on the demo model's).
SAVING = 0.5

_DONE: set[str] = set()  # keys of the steps compiled in this process (torch.compile holds their graphs)
_SEEN_FILE = "txl_captured_steps.json"  # in inductor's cache directory: the keys it holds a compiled graph of


def pays(new_tokens: int, step_s: float, compile_s: float, saving: float = SAVING) -> bool:
    """Whether decoding ``new_tokens`` tokens with the captured step repays compiling it: the time saved,
    ``new_tokens * step_s * saving`` (``step_s``: a plain step's seconds), exceeds ``compile_s``."""
    return new_tokens * step_s * saving > compile_s


def step_key(model: TransformerXLLM, *, batch: int, lengths: Lengths, options: CaptureOptions,
             products: str | None = None) -> str:
    """What the compiled graph of a step depends on, as one string: the model's shape, the batch, the lengths, the
    options, the weights' type and device, the products' form (default: the rule's), torch's version."""
    p = next(model.parameters())
    products = products or decode_products(p.device)
    return json.dumps([torch.__version__, model.config.to_dict(), batch, lengths.mem_len, lengths.clamp_len,
                       lengths.same_length, options.int8, options.kv_dtype, str(p.dtype), p.device.type, products],
                      sort_keys=True)


def _seen_path() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / _SEEN_FILE


def _seen() -> set[str]:
    try:
        return set(json.loads(_seen_path().read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):  # none yet, or unreadable: nothing known compiled
        return set()


def compile_estimate(key: str) -> float:
    """The seconds the first step of a decoder with :func:`step_key` ``key`` is expected to take compiling: 0 when
    this process compiled it already, :data:`COMPILE_S` ``"warm"`` when inductor's cache directory holds it (this
    machine compiled it before), else ``"cold"``."""
    if key in _DONE:
        return 0.0
    return COMPILE_S["warm"] if key in _seen() else COMPILE_S["cold"]


def _record(key: str) -> None:
    """Remember that the step ``key`` was compiled (in this process, and beside inductor's cache)."""
    _DONE.add(key)
    seen = _seen()
    if key in seen:
        return
    try:
        path = _seen_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{id(seen)}.tmp")  # forked processes share ids, not pids
        tmp.write_text(json.dumps(sorted(seen | {key})), encoding="utf-8")
        tmp.replace(path)
    except OSError:  # a read-only cache directory: the estimate stays "cold", nothing else changes
        pass


def _compiled(device: torch.device, batch: int, *, products: str = "compiled") -> object:  # pragma: no mutate block
    """``torch.compile(step)``: static shapes, one graph; CUDA graphs on CUDA (``reduce-overhead``). On the CPU with
    several rows the C++ is compiled with multiply-adds contracted into FMAs: the fused per-row sums of a batch are
    bound by arithmetic there (wt103-base, batch 8: 32.9 -> 30.5 ms per step, one thread), while at batch 1 an FMA's
    longer latency slows the one accumulator of the int8 products (6.0 -> 6.3 ms) and gains nothing in float32.
    With txl's kernels (``products="native"``) every product and the attention are their calls, each on every core;
    inductor's own kernels (norms, residuals, a few hundred numbers each) then run on one thread, no parallel region
    each, and without the size checks of every kernel's output (about 300 a step, 0.3 ms on the Zen 3).
    (Left out of mutation testing: it compiles, about 50 s.)"""
    kind = "plain" if batch == 1 else "fma"
    key = "cuda" if device.type == "cuda" else f"cpu-{kind}-{products}"
    if key not in _COMPILED:
        allow_graphs()  # one graph per model shape, batch, mem_len, int8 and ring dtype
        if device.type == "cuda":
            _COMPILED[key] = torch.compile(step, fullgraph=True, dynamic=False, mode="reduce-overhead")
        else:
            options: dict[str, object] = {"cpp.enable_floating_point_contract_flag": "fast"} if batch > 1 else {}
            if products == "native":
                options.update({"cpp.threads": 1, "size_asserts": False})
            _COMPILED[key] = torch.compile(step, fullgraph=True, dynamic=False, options=options)
    return _COMPILED[key]


def _into_arena(weights: dict, pos_keys: list[Tensor]) -> tuple[dict, list[Tensor]]:
    """``weights`` (:func:`~transformer_xl.inference.packing.pack`) and ``pos_keys`` as views into one arena
    (:func:`~transformer_xl.inference.arena.into_arena`) in the order a step reads them: per layer ``[W_q; W_k;
    W_v]``, ``u``, ``v``, the position keys, the rest of the layer; the input projections; the softmax. The embedding
    tables stay where they are (a step gathers a few rows of them)."""
    order: list[Tensor] = []

    def add(tree: object) -> None:
        order.extend(t for t in tree_leaves(tree) if isinstance(t, Tensor))

    for i, layer in enumerate(weights["layers"]):
        add((layer["qkv"], layer["u"], layer["v"], pos_keys[i]))
        add([v for k, v in layer.items() if k not in ("qkv", "u", "v")])
    add([proj for _, proj in weights["emb"]])
    add(weights["head"])
    copies = dict(zip(map(id, order), into_arena(order)))
    moved = tree_map(lambda t: copies.get(id(t), t) if isinstance(t, Tensor) else t, weights)
    return moved, [copies[id(t)] for t in pos_keys]


def _stamps(tensors: Sequence[Tensor]) -> list[int] | None:
    """How often each tensor was modified in place (None: inference tensors keep no count)."""
    try:
        return [t._version for t in tensors]
    except RuntimeError:
        return None


class CapturedDecoder:
    """The captured decode step of ``model`` for ``batch`` rows and a memory of ``mem_len`` (module docstring).

    Args:
        int8: int8 weights (per-row scales) in the step, from the float model's weights.
        kv_dtype: ``"float32"`` or ``"bfloat16"``: the type of the keys/values kept in the ring.
        compile: compile the step (``False``: the same function run eagerly, for tests and debugging).
        clamp_len / same_length: as :class:`~transformer_xl.model.config.Lengths` (default: the model's).
        products: the form of the matrix products, ``"native"`` (txl's kernels), ``"compiled"`` (inductor's
            reductions) or ``"blas"`` (default: :func:`~transformer_xl.model.dispatch.decode_products`, the rule per
            CPU).
    """

    def __init__(self, model: TransformerXLLM, *, batch: int, mem_len: int | None = None,
                 clamp_len: int | None = None, same_length: bool | None = None, int8: bool = False,
                 kv_dtype: str = "float32", compile: bool = True, products: str | None = None) -> None:
        check_supported(model)
        if kv_dtype not in KV_DTYPES:
            raise ConfigError(f"unknown kv_dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
        lengths = model.config.lengths(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length, ext_len=0)
        self.mem_len = check_int("mem_len", lengths.mem_len, 1)
        self.lengths: Lengths = lengths  # the lengths this decoder computes with (ext_len 0)
        self.batch = check_int("batch", batch, 1)
        self.model, self.int8, self.kv_dtype = model, int8, kv_dtype
        p = next(model.parameters())
        self.device, dtype = p.device, p.dtype
        if products not in (None, *PRODUCTS):
            raise ConfigError(f"unknown products {products!r}; known: {', '.join(PRODUCTS)}")
        if (products == "blas" and self.device.type == "cpu") or (products in ("native", "compiled") and \
                self.device.type != "cpu"):
            raise ConfigError(f"products {products!r} do not run on {self.device}")
        if int8 and self.device.type != "cpu":
            raise ConfigError(f"int8 decoding is for the CPU; the model is on {self.device}")
        if products == "native" and (why := unavailable()):
            raise ConfigError(f"txl's native kernels cannot run here: {why}")
        #: the form of the step's matrix products (:func:`~transformer_xl.model.dispatch.decode_products`)
        self.products: str = products or decode_products(self.device)
        with torch.no_grad():
            self.weights = pack(model, int8=int8, products=self.products)
        # under tf_memory a query sees mem_len + 1 keys: all of a full ring, as without same_length
        self.spec = spec_of(model, self.weights["head"], mem_len=self.mem_len,
                            same_length=lengths.same_length and not lengths.tf_memory,
                            native_attention=self.products == "native" and dtype == torch.float32)
        cfg, slots = model.config, ring_slots(self.mem_len)
        # every layer's keys in slot blocks, values by dimension (decode.step); on the CPU on huge pages, one buffer
        # each (arena: a step writes them, and views of one buffer would be inputs that alias each other)
        zeros = huge_page_zeros if self.device.type == "cpu" else partial(torch.zeros, device=self.device)
        kv_type = KV_DTYPES[kv_dtype]
        self.ks = [zeros((batch, cfg.n_head, slots // ROW_BLOCK, cfg.d_head, ROW_BLOCK), dtype=kv_type)
                   for _ in range(cfg.n_layer)]
        self.vs = [zeros((batch, cfg.n_head, cfg.d_head, slots), dtype=kv_type) for _ in range(cfg.n_layer)]
        # equivalent mutants: load() fills slot_pos before any step
        self.slot_pos = torch.full((slots,), -1, dtype=torch.long, device=self.device)  # pragma: no mutate
        self.cur = torch.zeros((), dtype=torch.long, device=self.device)
        # equivalent mutants: integer distances give the same sinusoid
        dist = torch.arange(slots, dtype=torch.float32, device=self.device)  # pragma: no mutate
        if lengths.clamp_len > 0:
            dist = dist.clamp(max=lengths.clamp_len)
        # equivalent mutants: inv_freq is a buffer of the model (on its device); position_keys casts r_dist
        inv_freq = model.pos_enc.inv_freq.to(self.device)  # pragma: no mutate
        r_dist = sinusoid(dist, inv_freq).to(dtype)  # pragma: no mutate  # [C, D]: row d = distance min(d, clamp_len)
        self.pos_keys = position_keys(model, r_dist, KV_DTYPES[kv_dtype])  # [H, C / 16, E, 16] per layer
        if self.device.type == "cpu":
            self.weights, self.pos_keys = _into_arena(self.weights, self.pos_keys)
        self.dtype = dtype
        # left out: CUDA only, checked by test_cuda_graph_step_equals_the_plain_step on a GPU
        if self.device.type == "cuda":  # pragma: no mutate block  (the buffers keep their addresses for CUDA graphs)
            for t in [*self.ks, *self.vs, self.slot_pos, self.cur, *self.pos_keys]:
                torch._dynamo.mark_static_address(t)
        if compile and (why := compile_unavailable(self.device.type)):
            raise ConfigError(f"the captured step cannot be compiled here: {why}; decode without --captured")
        self._fn = _compiled(self.device, batch, products=self.products) if compile else step
        self.compiled = self._fn is not step  # the step is torch.compile's graph (False: the function run eagerly)
        #: what its compiled graph depends on (:func:`step_key`), for :func:`compile_estimate`
        self.key = step_key(model, batch=batch, lengths=lengths, options=CaptureOptions(int8, kv_dtype),
                            products=self.products)
        # equivalent mutants: load() makes the memory buffers before any step
        self._hist: Tensor | None = None  # pragma: no mutate  # [L + 1, B, C_h, D] append-only memory rows
        # equivalent mutants: load() sets both bounds before any step; any _mems but the last returned is reloaded
        self._lo = self._hi = 0  # pragma: no mutate
        self._mems: list[Tensor] | None = None  # pragma: no mutate
        self._stamps: list[int] | None = None  # pragma: no mutate
        # left out: only a compiled step sets it (test_compiled_step_equals_the_plain_step compiles)
        self.compile_s: float | None = None  # pragma: no mutate  # seconds of the first (compiling) step

    # ---------------------------------------------------------------------------------------------- state
    def _continues(self, mems: Sequence[Tensor]) -> bool:
        last = self._mems
        if last is None or len(mems) != len(last) or not all(a is b for a, b in zip(mems, last)):
            return False
        return _stamps(mems) == self._stamps  # inference tensors keep no version counter (None): identity only

    @torch.no_grad()
    def load(self, mems: Sequence[Tensor]) -> None:
        """Start from ``mems`` (``n_layer + 1`` tensors ``[B, M, D]``, ``M <= mem_len``): their keys/values
        projected into the ring, their rows copied into new memory buffers. :meth:`step` does it when given other
        memories than its own; calling it first keeps that work (one projection of the memory) out of a timed step."""
        cfg = self.model.config
        if len(mems) != cfg.n_layer + 1 or any(m.dim() != 3 or m.size(0) != self.batch for m in mems):
            raise ConfigError(f"mems must be {cfg.n_layer + 1} tensors [batch={self.batch}, M, {cfg.d_model}]")
        mlen = mems[0].size(1)
        if mlen > self.mem_len:
            mems = [m[:, mlen - self.mem_len:] for m in mems]
            mlen = self.mem_len
        he = cfg.n_head * cfg.d_head
        for i, w in enumerate(self.weights["layers"]):
            if not mlen:
                break
            mem = mems[i]
            x = torch.nn.functional.layer_norm(mem, mem.shape[-1:], *w["ln1"], self.spec.eps) \
                if self.spec.pre_lnorm else mem
            kv = linear(x.reshape(-1, x.size(-1)), w["qkv"])[:, he:]  # [B*M, 2*H*E]
            kv = kv.view(self.batch, mlen, 2, cfg.n_head, cfg.d_head)
            keys = kv.new_zeros(self.batch, cfg.n_head, self.slot_pos.numel(), cfg.d_head)
            keys[:, :, :mlen] = kv[:, :, 0].transpose(1, 2)
            self.ks[i].copy_(block_slots(keys))
            self.vs[i][..., :mlen].copy_(kv[:, :, 1].permute(0, 2, 3, 1))
        self.slot_pos.fill_(-1)
        self.slot_pos[:mlen] = torch.arange(mlen, device=self.device)
        self.cur.fill_(mlen)
        self._new_hist(torch.stack([m.to(self.dtype) for m in mems]) if mlen else None, mlen)
        self._mems, self._stamps = list(mems), _stamps(mems)  # a step over these mems continues from here

    def _new_hist(self, window: Tensor | None, mlen: int) -> None:
        """New append-only memory buffers holding ``window [L + 1, B, M, D]`` in front (old ones untouched)."""
        cfg = self.model.config
        cap = self.mem_len + max(self.mem_len // 2, 64)
        self._hist = torch.empty(cfg.n_layer + 1, self.batch, cap, cfg.d_model, dtype=self.dtype,
                                 device=self.device)
        if window is not None:
            self._hist[:, :, :mlen].copy_(window)
        self._lo, self._hi = 0, mlen

    # ---------------------------------------------------------------------------------------------- a step
    @torch.no_grad()
    def step(self, tokens: Tensor, mems: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """Feed ``tokens [B]`` after the text whose memories are ``mems``: next-token log-probabilities
        ``[B, V]`` and the next memories (views, never written again)."""
        if tokens.shape != (self.batch,):
            raise ConfigError(f"tokens must be [batch={self.batch}], got shape {tuple(tokens.shape)}")
        if not self._continues(mems):
            self.load(mems)
        start = time.perf_counter() if self.compile_s is None and self.compiled else None
        log_probs, rows = self._fn(self.spec, self.weights, tokens.to(self.device), self.ks, self.vs,
                                   self.slot_pos, self.cur, self.pos_keys)  # [B, V], [L + 1, B, D]
        if start is not None:
            self.compile_s = time.perf_counter() - start
            _record(self.key)
        assert self._hist is not None
        if self._hi == self._hist.size(2):  # full: the live window moves to new buffers
            self._new_hist(self._hist[:, :, self._lo:self._hi], self._hi - self._lo)
        self._hist[:, :, self._hi].copy_(rows)
        self._hi += 1
        self._lo = max(self._lo, self._hi - self.mem_len)
        new = list(self._hist[:, :, self._lo:self._hi].unbind(0))
        self._mems, self._stamps = new, _stamps(new)
        return log_probs.clone() if self.device.type == "cuda" else log_probs, new
