"""The prepared GPU check: one command, run once on a GPU machine (one H100/H200), that says whether txl computes
the right numbers there and how fast, in under 8 minutes, without installing txl::

    PYTHONPATH=src python benchmarks/gpu_check.py --out DIR              # or: make gpu-check OUT=DIR
    PYTHONPATH=src python benchmarks/gpu_check.py --out DIR --device cpu --tiny   # seconds on a CPU (CI runs it)

Parts (each in a process of its own under a time cap, :mod:`.runner`; ``--parts a,d`` picks some, ``--cap b=200``
changes one's cap, ``--budget`` the whole run's):

* **a. correctness** (:mod:`.correctness`): the device's forward against the CPU's for attention types 0-3,
  ``same_length``, memory, adaptive and full softmax (fp32 within 1e-5 relative, bf16 autocast losses within 1e-2);
  the default path's gradients against the paper's plain formulas (``reference()``); fp16 (GradScaler) and bf16
  training steps; ``pytest -m gpu`` over the suite's GPU tests.
* **b. training throughput** (:mod:`.throughput`): NVIDIA's WT103 base and large configurations, bf16 eager, bf16
  ``torch.compile`` and TF32: target tokens/s and MFU against the GEMM peaks measured in the same run, beside
  NVIDIA's A100 figures and the H100 goals.
* **c. evaluation throughput** (:mod:`.throughput`): scoring segments (base tgt 64 / mem 640, large 128 / 1600) at
  batch 1 and 32.
* **d. batch-1 decoding** (:mod:`.decoding`): the captured step (CUDA graphs) at mem 640 (and 1600): tokens/s, bytes
  per step, share of the measured read rate; its tokens and log-probabilities against the plain step's.
* **e. train, kill and resume** and **f. concurrent serving** (:mod:`.train_check`, :mod:`.serve_check`).

Results: ``DIR/gpu_check.json`` (``schema``, ``environment``, ``parts`` with each part's ``status``, ``seconds``,
``cap_s``, ``error`` and ``result``, ``failed_checks``, ``problems``, ``ok``, ``total_s``) and ``DIR/gpu_check.md``
(:mod:`.report`); ``DIR/logs/`` keeps each part's stderr. Exit status 0 only when every part ended ``ok`` and every
check is within its tolerance. ``--tiny`` runs 2-layer models for a few steps (no compiling unless ``--compile``).
"""
