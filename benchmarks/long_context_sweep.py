"""Why does a Transformer-XL learn the long-range copies in one seed and not another? One setting of the
long-range corpus and model, trained for several seeds (issue 23, docs/long-context.md, "Seed fragility").

Each seed trains ``ours`` (or ``--encoding``) with memory through the experiment's own loop
(:func:`transformer_xl.experiments.ablations.train_variant`, the ``Trainer``) and is scored on the valid split
(:func:`transformer_xl.experiments.long_context.score_model`). Printed per seed, one JSON line: the step at which
the training loss first fell below 0.93 x the uniform guess (``escape``, None: never), the copies' and all
tokens' loss relative to the guess, and the training minutes. Runs are deleted after scoring.

Usage (the settings of the table in docs/long-context.md)::

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/long_context_sweep.py base --seeds 0,1,2,3,4,5 --alphabet abcd
    ... a16 --alphabet abcdefghijklmnop
    ... a16d7 --alphabet abcdefghijklmnop --density 0.7
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from transformer_xl.data.long_range import LongRangeSpec, generate
from transformer_xl.experiments.ablations import train_variant
from transformer_xl.experiments.long_context import LCVariant, default_base, score_model

ESCAPE = 0.93  # training loss below this share of the guess: the model left the uniform plateau


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tag")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--alphabet", default="abcd")
    p.add_argument("--distances", default="20")
    p.add_argument("--span", type=int, default=8)
    p.add_argument("--density", type=float, default=0.5)
    p.add_argument("--tgt-len", type=int, default=8)
    p.add_argument("--mem-len", type=int, default=24)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--init-std", type=float, default=None, help="default: the official 0.02")
    p.add_argument("--encoding", default="ours")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)
    spec = LongRangeSpec(distances=tuple(int(d) for d in a.distances.split(",")), span_lens=(a.span,),
                         alphabet=a.alphabet, density=a.density, tokens={"train": 100_000, "valid": 10_000,
                                                                          "test": 1000})
    text = generate(spec)
    base = default_base(len(a.alphabet)).replace(d_model=a.d_model, n_head=a.n_head, d_head=a.d_model // a.n_head,
                                                 d_inner=2 * a.d_model)
    if a.init_std is not None:
        base = base.replace(init_std=a.init_std)
    cfg = LCVariant(a.encoding, a.mem_len, a.n_layer).config(base, a.tgt_len)
    guess = math.log(len(a.alphabet))
    for seed in (int(s) for s in a.seeds.split(",")):
        t0 = time.time()
        run = Path(tempfile.mkdtemp(prefix="lc-sweep-"))
        try:
            model, log = train_variant(cfg, text.corpus(), run, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                                       warmup=a.warmup, seed=seed)
        finally:
            shutil.rmtree(run, ignore_errors=True)
        curve = [(h["step"], round(h["loss"] / guess, 3)) for h in log["history"]]
        sc = score_model(model, text.ids["valid"], text.spans["valid"], mem_len=a.mem_len)
        print(json.dumps({"tag": a.tag, "seed": seed, "escape": next((s for s, v in curve if v < ESCAPE), None),
                          "copies_rel": round(sc["copies"]["loss"] / guess, 3),
                          "all_rel": round(sc["loss"] / guess, 3),
                          "per_distance_rel": {d: round(v["loss"] / guess, 3) for d, v in sc["distances"].items()},
                          "minutes": round((time.time() - t0) / 60, 2)}), flush=True)


if __name__ == "__main__":
    main()
