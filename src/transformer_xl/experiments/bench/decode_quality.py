"""What the narrower types of the captured decode step cost: perplexity of a trained model read token by token.

``txl bench generate --quality MODEL_DIR`` scores a whole split (WikiText-2 valid for the demo model) the way
generation reads text: ``batch`` contiguous streams, one token per step over a memory of ``mem_len``, every
position after the first of a stream scored. Each variant reads the same tokens with the same memory, so
their ratios are the cost of the variant alone:

* ``plain``: the model's forward on a ``[B, 1]`` segment (:class:`~transformer_xl.model.Recurrence`);
* ``captured``: :class:`~transformer_xl.inference.captured.CapturedDecoder`, float32 weights and ring (equal to
  ``plain`` to float rounding: the check that the comparison is of types, not of code paths);
* ``captured bf16 kv``, ``captured int8``, ``captured int8 + bf16 kv``: the narrower ring and/or int8 weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.model import Recurrence, TransformerXLLM, eval_mode

#: Variant name -> CapturedDecoder keywords (None: the plain step).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "captured": {},
    "captured bf16 kv": {"kv_dtype": "bfloat16"},
    "captured int8": {"int8": True},
    "captured int8 + bf16 kv": {"int8": True, "kv_dtype": "bfloat16"},
}


def streams(data: np.ndarray | torch.Tensor, batch: int) -> torch.Tensor:
    """``[batch, n]``: the split cut into ``batch`` contiguous streams (the tail that does not fit is dropped)."""
    if isinstance(data, torch.Tensor):
        ids = data.long().flatten()
    else:
        ids = torch.from_numpy(np.array(data, dtype=np.int64))  # a copy: the split may be read-only
    n = ids.numel() // batch
    return ids[:batch * n].view(batch, n)


@torch.no_grad()
def stream_nll(model: TransformerXLLM, ids: torch.Tensor, *, mem_len: int, decoder: dict[str, Any] | None,
               compile: bool = True) -> float:
    """Mean negative log-likelihood (nats) of ``ids [B, n]`` positions ``1..n-1`` read one token per step."""
    bsz, n = ids.shape
    p = next(model.parameters())
    mems = [p.new_zeros(bsz, 0, model.config.d_model) for _ in range(model.config.n_layer + 1)]
    total = torch.zeros(bsz, dtype=torch.float64)
    if decoder is None:
        rec = Recurrence(model, model.config.lengths(mem_len=mem_len, ext_len=0), mems=mems)

        def step(tok: torch.Tensor) -> torch.Tensor:
            return model.log_prob(rec(tok[:, None]).hidden[:, -1])
    else:
        dec = CapturedDecoder(model, batch=bsz, mem_len=mem_len, compile=compile, **decoder)
        state = {"mems": mems}

        def step(tok: torch.Tensor) -> torch.Tensor:
            lp, state["mems"] = dec.step(tok, state["mems"])
            return lp

    with eval_mode(model):
        for t in range(n - 1):
            total -= step(ids[:, t]).gather(1, ids[:, t + 1, None])[:, 0].double()
    return float(total.sum()) / (bsz * (n - 1))


def quality(model: TransformerXLLM, data: np.ndarray | torch.Tensor, *, batch: int, mem_len: int,
            variants: list[str] | None = None, compile: bool = True,
            log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every variant's loss and perplexity over ``data`` and its cost relative to ``captured`` (float32)."""
    ids = streams(data, batch)
    rows: dict[str, dict[str, float]] = {}
    for name in variants or list(VARIANTS):
        start = time.perf_counter()
        loss = stream_nll(model, ids, mem_len=mem_len, decoder=VARIANTS[name], compile=compile)
        rows[name] = {"loss": loss, "ppl": math.exp(loss), "seconds": time.perf_counter() - start}
        log(f"  quality {name}: loss {loss:.5f} ppl {math.exp(loss):.3f}")
    base = rows.get("captured", next(iter(rows.values())))
    for row in rows.values():
        row["ppl_cost"] = row["ppl"] / base["ppl"] - 1.0
    return {"batch": batch, "mem_len": mem_len, "tokens": batch * (ids.size(1) - 1), "variants": rows}


def quality_markdown(report: dict[str, Any], title: str) -> str:
    """The variants as a Markdown table."""
    lines = [f"{title}: {report['tokens']:,} tokens scored, {report['batch']} streams, one token per step, "
             f"mem_len {report['mem_len']}", "", "| variant | loss | ppl | ppl cost vs captured fp32 | seconds |",
             "|---|---|---|---|---|"]
    for name, r in report["variants"].items():
        lines.append(f"| {name} | {r['loss']:.5f} | {r['ppl']:.3f} | {r['ppl_cost']:+.3%} | {r['seconds']:.0f} |")
    return "\n".join(lines)
