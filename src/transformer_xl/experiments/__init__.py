"""The paper's experiments on top of the library: RECL (Table 8), evaluation speed (Table 9), ablations
(Tables 6 and 10), the tables/plots they produce, and the side-by-side benchmark.

* :mod:`transformer_xl.experiments.recl` — relative effective context length, as defined in the paper's Appendix C;
* :mod:`transformer_xl.experiments.speed` — per-token evaluation time, Transformer-XL memory vs vanilla sliding window;
* :mod:`transformer_xl.experiments.ablations` — recurrence x encoding x Full/Half loss variants, trained and compared;
* :mod:`transformer_xl.experiments.equal_memory` — peak training memory of a step, and the longest segment within a
budget;
* :mod:`transformer_xl.experiments.long_context` — controlled long-range dependencies (issue 23): copies at known
  distances scored per distance (report: ``long_context_report``, RECL: ``long_context_recl``);
* :mod:`transformer_xl.experiments.grid` — the seed x variant loop the ablations and long-context share (resume,
  signal, save);
* :mod:`transformer_xl.experiments.tables` — Markdown tables and matplotlib plots;
* :mod:`transformer_xl.experiments.bench` — throughput, memory and MFU against Hugging Face TransfoXL (``txl bench``).

Nothing in the library imports this package; the CLI (``txl recl``, ``txl experiment ...``) does.
"""
