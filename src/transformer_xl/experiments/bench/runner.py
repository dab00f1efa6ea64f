"""One implementation's training and evaluation steps, with its memories carried between calls."""

from __future__ import annotations

import contextlib
import math

import torch

from transformer_xl.experiments.bench.cases import RECOMPUTE, bench_case
from transformer_xl.interop.hf import build_hf, hf_compat
from transformer_xl.model import Recurrence, TransformerXLLM
from transformer_xl.model.adaptive import LogUniformSampler
from transformer_xl.model.fastpath import compiled
from transformer_xl.train.schedule import FUSED_ADAM_DEVICES


class Runner:
    """One implementation's train/eval step with its memories carried between calls."""

    def __init__(self, name: str, model: torch.nn.Module, *, device: str, dtype: str, compile: bool) -> None:
        self.name, self.model, self.device = name, model.to(device), device
        self.is_hf = name == "hf"
        self.fused_adam = not self.is_hf and device.split(":")[0] in FUSED_ADAM_DEVICES
        self.dtype, self.compiled = dtype, compile
        self.autocast = dtype == "bf16"
        self.fn = compiled(model) if compile else model  # training: one whole graph
        # evaluation goes through the inference cache, whose Python-side state breaks the graph there
        self.eval_fn = torch.compile(model, dynamic=False) if compile else model
        # each side's training loop's Adam: txl train's (fused where it can be), the official train.py's
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=self.fused_adam or None)
        self.mems: list[torch.Tensor] | None = None
        self.rec: Recurrence | None = None  # txl's evaluation: memories and inference cache

    def _ctx(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.autocast:
            stack.enter_context(torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16))
        if self.is_hf:
            stack.enter_context(hf_compat())
        return stack

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        with self._ctx():
            if self.is_hf:  # HF's public API: labels = input_ids, shifted inside (Q - 1 predictions)
                out = self.fn(input_ids=x, labels=x, mems=self.mems)
            else:
                out = self.fn(x, y, self.mems)
        self.mems = out.mems
        out.loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def set_eval_mem(self, mem_len: int, batch: int, gen: torch.Generator) -> None:
        """Switch to evaluation with full memories of ``mem_len`` random states (steady state)."""
        self.model.eval()
        cfg = self.model.config
        if self.is_hf:
            self.model.reset_memory_length(mem_len)
            self.mems = [torch.randn((mem_len, batch, cfg.d_model), generator=gen).to(self.device)
                         for _ in range(cfg.n_layer)]
        else:
            mems = [torch.randn((batch, mem_len, cfg.d_model), generator=gen).to(self.device)
                    for _ in range(cfg.n_layer + 1)]
            self.rec = Recurrence(self.eval_fn, cfg.lengths(mem_len=mem_len), mems=mems)

    def eval_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One segment over full memories, which then move on by one segment (as in ``txl eval``)."""
        with torch.no_grad(), self._ctx():
            if self.is_hf:
                self.mems = self.fn(input_ids=x, labels=x, mems=self.mems).mems
            else:
                assert self.rec is not None
                self.rec(x, y)


def zipf_tokens(n_token: int, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Token ids drawn from a Zipfian (log-uniform) law, so adaptive-softmax clusters fill as in text."""
    dist = LogUniformSampler(n_token, 1).dist
    return torch.multinomial(dist, math.prod(shape), replacement=True, generator=gen).view(shape)


def setup(case_name: str, impl: str, *, device: str, dtype: str, compile: bool, batch: int | None,
          seed: int) -> tuple[Runner, torch.Tensor, torch.Tensor]:
    """The runner of implementation ``impl`` (``txl``, ``txl-recompute`` or ``hf``) for a case, and its batch."""
    case = bench_case(case_name)
    torch.manual_seed(seed)
    ours = TransformerXLLM(case.config)
    if impl == RECOMPUTE:
        ours.recompute(True)
    model = build_hf(ours) if impl == "hf" else ours
    bsz = batch or case.batch_size
    gen = torch.Generator().manual_seed(seed)
    seq = zipf_tokens(case.config.n_token, (bsz, case.config.tgt_len + 1), gen).to(device)
    runner = Runner(impl, model, device=device, dtype=dtype, compile=compile and impl == "txl")
    return runner, seq[:, :-1], seq[:, 1:]


def check_equal(ours: TransformerXLLM, hf, x: torch.Tensor, y: torch.Tensor, n_seg: int = 2) -> float:
    """Max |NLL difference| between txl (the evaluation path: a :class:`Recurrence` with its inference cache) and HF
    over ``n_seg`` segments (eval mode, empty first memory)."""
    ours.eval()
    hf.eval()
    bsz, qlen = x.shape
    d = ours.config.d_model
    hf_mems = [x.new_empty(0, bsz, d, dtype=torch.float32) for _ in range(ours.config.n_layer)]
    rec, worst = Recurrence(ours), 0.0
    with torch.no_grad(), hf_compat():
        for _ in range(n_seg):
            h = hf.transformer(input_ids=x, mems=hf_mems)
            hf_mems = h.mems
            hidden = torch.cat([h.last_hidden_state, h.last_hidden_state.new_zeros(bsz, 1, d)], dim=1)
            hf_nll = hf.crit(hidden, torch.cat([x[:, :1], y], dim=1), keep_order=True).view(bsz, qlen)
            worst = max(worst, (rec(x, y).nll - hf_nll).abs().max().item())
    return worst
