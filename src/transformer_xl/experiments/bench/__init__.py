"""Throughput benchmark (``txl bench``): txl against Hugging Face TransfoXL on the same configs, in the same run.

``run_benchmark(BenchOptions(...))`` measures, for every case:

* the outputs of both models (same weights, converted with :mod:`transformer_xl.interop.hf`, dropout off): max |NLL
diff|;
* training tokens/s: forward + backward + optimizer step (the same ``torch.optim.Adam`` on both sides),
  memories carried from step to step;
* evaluation tokens/s (``no_grad``, NLL of every token) at each requested ``mem_len``, memories full and
  carried from segment to segment (txl through its :class:`transformer_xl.model.Recurrence`, as ``txl eval``);
* peak training memory: on CPU the resident-set high-water mark of a fresh child process during the
  first training steps, above its RSS just before them (model, data and imports excluded, optimizer
  state and gradients included); on CUDA ``torch.cuda.max_memory_allocated``;
* model FLOPs utilization against the fp32 (or bf16) matmul peak measured in the same run.

Timings alternate between the two implementations (``repeats`` rounds of ``steps`` steps each) and the
ratio reported is the median of the per-round ratios, because absolute numbers on shared machines
drift by tens of percent within minutes. Hugging Face ``transformers`` (4.35-4.57, where TransfoXL
lives under ``models.deprecated``) is an optional, test-only dependency: without it only txl is timed.

Modules: ``cases`` (what is timed), ``runner`` (one implementation's steps), ``measure`` (FLOPs, matmul peak,
peak memory), ``report`` (the run, its ratios and Markdown).
"""

from transformer_xl.experiments.bench.cases import CASES, RECOMPUTE, BenchCase, BenchOptions, bench_case
from transformer_xl.experiments.bench.measure import matmul_peak, model_flops
from transformer_xl.experiments.bench.report import profile_train_step, run_benchmark, run_case, to_markdown
from transformer_xl.experiments.bench.runner import check_equal

__all__ = ["CASES", "RECOMPUTE", "BenchCase", "BenchOptions", "bench_case", "check_equal", "matmul_peak",
           "model_flops", "profile_train_step", "run_benchmark", "run_case", "to_markdown"]
