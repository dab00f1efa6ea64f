"""The paper's experiments on top of the library: RECL (Table 8), evaluation speed (Table 9), ablations
(Tables 6 and 10), the tables/plots they produce, and the side-by-side benchmark.

* :mod:`transformer_xl.experiments.recl` — relative effective context length, as defined in the paper's Appendix C;
* :mod:`transformer_xl.experiments.speed` — per-token evaluation time, Transformer-XL memory vs vanilla sliding window;
* :mod:`transformer_xl.experiments.ablations` — recurrence x encoding x Full/Half loss variants, trained and compared;
* :mod:`transformer_xl.experiments.equal_memory` — peak training memory of a step, and the longest segment within a
budget;
* :mod:`transformer_xl.experiments.tables` — Markdown tables and matplotlib plots;
* :mod:`transformer_xl.experiments.bench` — throughput, memory and MFU against Hugging Face TransfoXL (``txl bench``).

Nothing in the library imports this package; the CLI (``txl recl``, ``txl experiment ...``) does.
"""
