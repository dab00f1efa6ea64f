"""Throughput/memory/MFU of txl against Hugging Face TransfoXL in the same run: ``txl bench`` as a script.

    python benchmarks/bench_throughput.py --cases char,word --json benchmarks/results/cpu.json
    python benchmarks/bench_throughput.py --device cuda --cases enwik8-base,wt103-base --dtype bf16

All options are those of ``txl bench --help``; results are described in docs/performance.md.
"""

from __future__ import annotations

import sys

from transformer_xl.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
