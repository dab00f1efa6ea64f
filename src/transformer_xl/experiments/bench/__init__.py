"""Throughput benchmark (``txl bench``): txl against Hugging Face TransfoXL on the same configs, in the same run.

``run_benchmark(BenchOptions(...))`` measures, for every case:

* the outputs of both models (same weights, converted with :mod:`transformer_xl.interop.hf`, dropout off): max |NLL
diff|;
* training tokens/s: forward + backward + optimizer step (``torch.optim.Adam``: txl's fused where it can be, as
  ``txl train`` runs it; HF's the default, as the official ``train.py``), memories carried from step to step;
* evaluation tokens/s (``no_grad``, NLL of every token) at each requested ``mem_len``, memories full and
  carried from segment to segment (txl through its :class:`transformer_xl.model.Recurrence`, as ``txl eval``);
* peak training memory: on CPU the resident-set high-water mark of a fresh child process during the
  first training steps, above its RSS just before them (model, data and imports excluded, optimizer
  state and gradients included); on CUDA ``torch.cuda.max_memory_allocated``;
* model FLOPs utilization: the strict matmul FLOPs of the model's math against the GEMM peak of the run's precision
  measured in the same run (:mod:`~transformer_xl.experiments.bench.yardstick`, which also holds the read-rate
  limit and the decode-byte counts of ``txl bench generate``).

Timings alternate between the two implementations (``repeats`` rounds of ``steps`` steps each) and the
ratio reported is the median of the per-round ratios, because absolute numbers on shared machines
drift by tens of percent within minutes. Hugging Face ``transformers`` (4.35-4.57, where TransfoXL
lives under ``models.deprecated``) is an optional, test-only dependency: without it only txl is timed.

Modules: ``cases`` (what is timed), ``runner`` (one implementation's steps), ``yardstick`` (the limits and the
work counted against them: read rate, GEMM peaks, decode bytes, FLOPs, shares), ``measure`` (peak memory),
``report`` (the run, its ratios and Markdown).
"""

from transformer_xl.experiments.bench.cases import CASES, RECOMPUTE, BenchCase, BenchOptions, bench_case
from transformer_xl.experiments.bench.report import profile_train_step, run_benchmark, run_case, to_markdown
from transformer_xl.experiments.bench.runner import check_equal
from transformer_xl.experiments.bench.yardstick import (
    YardstickError,
    forward_flops,
    gemm_peak,
    gemm_peaks,
    read_rate,
    share,
    step_bytes,
    train_flops,
)

__all__ = ["CASES", "RECOMPUTE", "BenchCase", "BenchOptions", "YardstickError", "bench_case", "check_equal",
           "forward_flops", "gemm_peak", "gemm_peaks", "profile_train_step", "read_rate", "run_benchmark", "run_case",
           "share", "step_bytes", "to_markdown", "train_flops"]
