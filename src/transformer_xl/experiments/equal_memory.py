"""The peak memory of one training step, and the longest segment that fits a budget (paper Table 10, Appendix A).

The paper's Table 10 compares Transformer-XL (backprop length 128 with a memory of 128) against models
without recurrence given a longer segment "under the same GPU memory constraints" (176 with the full loss,
172 with the half loss). Here that memory is measured, not assumed from the paper's ratios:

* :func:`training_step_bytes` is the peak memory of one training step (forward, backward, gradient clipping
  and an Adam update of a ``[batch_size, tgt_len]`` segment, with a full memory of ``mem_len`` positions
  when the model has one), measured in one of two ways:

  - ``"allocator"`` (the default on CUDA): ``torch.cuda.max_memory_allocated`` over the second of two steps
    (the first allocates Adam's moments), less what was allocated before the model was built. It counts
    everything the step allocates at its peak, transient attention scores included.
  - ``"saved-tensors"`` (the default on CPU, where no allocator statistics exist; deterministic): the bytes
    of the distinct storages that autograd saves for backward during the forward (counted through
    ``torch.autograd.graph.saved_tensors_hooks``, the parameters' own storages excluded), plus
    ``4 x`` the parameter bytes (weights, gradients, Adam's two moments), plus the memories held during the
    step (the ones read and the ones written: ``2 (n_layer + 1) B M d_model`` floats). Transient buffers
    that backward does not need (the scores before the softmax, allocator slack) are not counted.

* :func:`longest_within` is the search: the longest integer segment length whose measured bytes stay within
  a budget (doubling from a start, then bisection to the exact integer), assuming memory grows with length.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from transformer_xl.errors import ConfigError, check_int
from transformer_xl.model import TransformerXLLM, TXLConfig

METHODS = ("allocator", "saved-tensors")


def default_method(device: str | torch.device) -> str:
    """``allocator`` on CUDA, ``saved-tensors`` elsewhere."""
    return "allocator" if torch.device(device).type == "cuda" else "saved-tensors"


def _step(model: TransformerXLLM, opt: torch.optim.Optimizer, x: torch.Tensor, mems: list[torch.Tensor] | None, *,
          half_loss: bool) -> list[torch.Tensor]:
    out = model(x, x, mems)
    loss = out.nll[:, out.nll.size(1) // 2:].mean() if half_loss else out.loss  # as Trainer.train_step
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.mems


def training_step_bytes(cfg: TXLConfig, batch_size: int, *, half_loss: bool = False, device: str = "cpu",
                        method: str | None = None) -> dict[str, Any]:
    """Peak bytes of one training step of ``cfg`` at ``batch_size`` rows (module docstring).

    Returns ``{"bytes", "method", "device", "tgt_len", "mem_len", "batch_size"}`` and, for ``saved-tensors``,
    the parts ``saved``, ``parameters`` (x4) and ``memories``.
    """
    check_int("batch_size", batch_size, 1)
    dev = torch.device(device)
    method = method or default_method(dev)
    if method not in METHODS:
        raise ConfigError(f"memory method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "allocator" and dev.type != "cuda":
        raise ConfigError(f"the allocator method needs a CUDA device, got {str(device)!r}")
    B, T, M = batch_size, cfg.tgt_len, cfg.mem_len
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(dev) if method == "allocator" else 0
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(0)  # the values do not matter; the shapes do
    model = TransformerXLLM(cfg).to(dev).train()
    torch.random.set_rng_state(rng_state)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randint(cfg.n_token, (B, T), device=dev)
    mems = [torch.zeros(B, M, cfg.d_model, device=dev) for _ in range(cfg.n_layer + 1)] if M else None
    out: dict[str, Any] = {"method": method, "device": str(dev), "tgt_len": T, "mem_len": M, "batch_size": B}
    if method == "allocator":
        _step(model, opt, x, mems, half_loss=half_loss)  # Adam's moments exist from here on, as in training
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        new = _step(model, opt, x, mems, half_loss=half_loss)
        torch.cuda.synchronize(dev)
        out["bytes"] = int(torch.cuda.max_memory_allocated(dev) - before)
        del new
    else:
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = model(x, x, mems)
        del result
        p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        m_bytes = 2 * (cfg.n_layer + 1) * B * M * cfg.d_model * 4
        out.update(saved=sum(saved.values()), parameters=4 * p_bytes, memories=m_bytes,
                   bytes=sum(saved.values()) + 4 * p_bytes + m_bytes)
    del model, opt, x, mems
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def longest_within(measure: Callable[[int], int], budget: int, *, start: int,
                   limit: int | None = None) -> tuple[int, list[tuple[int, int]]]:
    """The longest integer ``L`` in ``[1, limit]`` with ``measure(L) <= budget``, and every ``(L, bytes)``
    measured, in order. Doubling from ``start`` until a length does not fit (or ``limit``, default
    ``64 * start``), then bisection between the last length that fits and the first that does not; below
    ``start`` when ``start`` itself does not fit. ``measure`` must not decrease with ``L``."""
    check_int("start", start, 1)
    limit = 64 * start if limit is None else check_int("limit", limit, start)
    tried: dict[int, int] = {}

    def fits(n: int) -> bool:
        if n not in tried:
            tried[n] = int(measure(n))
        return tried[n] <= budget

    if fits(start):
        lo, hi = start, None
        while hi is None and lo < limit:
            nxt = min(2 * lo, limit)
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
        if hi is None:  # everything up to the limit fits
            return lo, list(tried.items())
    else:
        lo, hi = 0, start
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0:
        raise ConfigError(f"no segment length fits in {budget:,} bytes (length 1 takes {tried[1]:,})")
    return lo, list(tried.items())
