"""What ``txl bench`` times: the cases (a model config and a batch size) and the options of a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformer_xl.errors import ConfigError
from transformer_xl.model import TXLConfig
from transformer_xl.model.presets import cpu_small, enwik8_base, wt103_base


@dataclass
class BenchCase:
    """A model config and the batch size to time it with (``tgt_len``/``mem_len`` come from the config)."""

    name: str
    config: TXLConfig
    batch_size: int


def _cpu_char(**kw: Any) -> TXLConfig:
    base = dict(n_token=204, n_layer=4, n_head=8, d_model=256, d_head=32, d_inner=1024, dropout=0.1,
                dropatt=0.0, tgt_len=128, mem_len=128)
    return TXLConfig(**{**base, **kw})


#: Case name -> (config factory, batch size). ``char``/``word``/``char-mid`` are the issues' CPU configs; the
#: ``*-base`` ones are the paper's base models with the official run scripts' batch sizes (for a GPU).
CASES: dict[str, tuple[Callable[[], TXLConfig], int]] = {
    "char": (_cpu_char, 8),
    # the mid-size character model (6 layers, d_model 512)
    "char-mid": (lambda: _cpu_char(n_layer=6, n_head=8, d_model=512, d_head=64, d_inner=2048, tgt_len=256,
                                   mem_len=256), 4),
    "word": (lambda: _cpu_char(n_token=33278, cutoffs=[2000, 10000], div_val=4, tie_projs=[False, True, True]), 8),
    # the demo's model (`txl train --preset wt2-cpu` / `demo`): cpu-small, pre-LN, WikiText-2's 33,278 words
    "wt2-cpu": (lambda: cpu_small(33278, pre_lnorm=True), 16),
    "enwik8-base": (enwik8_base, 22),
    "wt103-base": (wt103_base, 60),
}


#: Name of the txl runner that trains with ``TransformerXLLM.recompute`` (``BenchOptions.recompute``).
RECOMPUTE = "txl-recompute"


def bench_case(name: str) -> BenchCase:
    if name not in CASES:
        raise ConfigError(f"unknown benchmark case {name!r}; known: {', '.join(CASES)}")
    factory, batch = CASES[name]
    return BenchCase(name, factory(), batch)


@dataclass
class BenchOptions:
    """What :func:`run_benchmark` measures (defaults: the issue's CPU settings)."""

    cases: list[str] = field(default_factory=lambda: ["char", "word"])
    eval_mem_lens: list[int] = field(default_factory=lambda: [128, 512, 1600])
    steps: int = 3  # timed steps per round
    repeats: int = 5  # interleaved rounds (the ratio is the median of per-round ratios)
    warmup: int = 2
    device: str = "cpu"
    dtype: str = "fp32"  # "fp32" or "bf16" (autocast, for both implementations)
    compile: bool = False  # torch.compile our model (Hugging Face's stays eager)
    threads: int | None = None  # torch.set_num_threads; None keeps torch's default
    hf: bool = True  # also time Hugging Face TransfoXL when transformers is installed
    memory: bool = True  # peak training memory (CPU: one child process per measurement)
    batch_size: int | None = None  # override the cases' batch size
    seed: int = 0
    variants: bool = False  # also time txl eager/compiled x fp32/bf16 in the same run (runners txl-<mode>-<dtype>)
    recompute: bool = False  # also time/measure txl training with TransformerXLLM.recompute (runner "txl-recompute")
    skeleton: bool = False  # also time the GEMM skeleton of each eager txl training step (skeleton.gemm_skeleton)
