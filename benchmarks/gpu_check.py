"""The prepared GPU check of txl, run from the repository root without installing txl::

    PYTHONPATH=src python benchmarks/gpu_check.py --out gpu-check-out            # one GPU, under 8 minutes
    PYTHONPATH=src python benchmarks/gpu_check.py --out /tmp/gc --device cpu --tiny   # the same on a CPU, seconds

(``make gpu-check OUT=DIR``.) Writes ``DIR/gpu_check.json`` and ``DIR/gpu_check.md``; exits 1 when a part failed or
a check is out of tolerance. What it measures: :mod:`transformer_xl.experiments.gpucheck`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a checkout: txl need not be installed
    from transformer_xl.experiments.gpucheck.runner import main

    sys.exit(main())
