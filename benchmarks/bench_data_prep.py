"""Preparation speed of transformer_xl.data: synthetic enwik8-like bytes, a synthetic word corpus, real PTB/WT2.

Usage::

    python benchmarks/bench_data_prep.py [--byte-mb 100] [--word-mtokens 20] [--json out.json]

Each figure is the wall time of ``load_corpus(..., rebuild=True)``: reading, tokenizing, vocabulary,
hashing the sources and writing the ``.npy`` cache. The word corpus defaults to 20M tokens and the
100M-token figure is extrapolated linearly (preparation is a single streaming pass); pass
``--word-mtokens 100`` to measure it directly (about 6 GB of RAM for the text and token lists).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from transformer_xl.data import load_corpus

SHARED = Path(os.environ.get("TXL_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")


def make_bytes(root: Path, n_bytes: int) -> None:
    """An enwik8-shaped zip: ``enwik8/enwik8.zip`` holding ``n_bytes`` of text-like bytes."""
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz ETAOINSHRD<>/=\"'.,;:0123456789\n[]{}|", dtype=np.uint8)
    p = 1.0 / np.arange(1, alphabet.size + 1)
    data = rng.choice(alphabet, size=n_bytes, p=p / p.sum()).astype(np.uint8).tobytes()
    (root / "enwik8").mkdir(parents=True)
    with zipfile.ZipFile(root / "enwik8" / "enwik8.zip", "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("enwik8", data)


def make_words(path: Path, n_tokens: int, vocab: int = 200_000, line_len: int = 60) -> int:
    """A Zipf-distributed word corpus of ``n_tokens`` words, ``line_len`` words a line."""
    rng = np.random.default_rng(1)
    words = np.array([f"w{i}" for i in range(vocab)])
    with open(path, "w", encoding="utf-8") as f:
        done = 0
        while done < n_tokens:
            n = min(5_000_000, n_tokens - done)
            ids = np.minimum(rng.zipf(1.2, size=n), vocab) - 1
            toks = words[ids].tolist()
            f.write("\n".join(" ".join(toks[i : i + line_len]) for i in range(0, n, line_len)) + "\n")
            done += n
    return path.stat().st_size


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--byte-mb", type=int, default=100)
    ap.add_argument("--word-mtokens", type=int, default=20)
    ap.add_argument("--json", default="bench_data_prep.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_bytes(root, args.byte_mb * 1_000_000)
        sec, c = timed(lambda: load_corpus("enwik8", root, cache_dir=root / "c", rebuild=True))
        rows.append(("enwik8-like bytes", f"{args.byte_mb} MB", sum(c.info()["tokens"].values()), sec, sec))
        wdir = root / "words"
        wdir.mkdir()
        n_tok = args.word_mtokens * 1_000_000
        size = make_words(wdir / "corpus.txt", n_tok)
        sec, c = timed(lambda: load_corpus(str(wdir / "corpus.txt"), cache_dir=root / "c", rebuild=True))
        n = sum(c.info()["tokens"].values())
        rows.append((f"words ({size / 1e6:.0f} MB text)", f"{args.word_mtokens}M words", n, sec, sec * 1e8 / n))
        for name in ("ptb", "wt2", "wt2-char"):
            sec, c = timed(lambda name=name: load_corpus(name, SHARED, cache_dir=root / "c", rebuild=True))
            rows.append((name, "real", sum(c.info()["tokens"].values()), sec, None))
    print(f"{'corpus':28s} {'size':>12s} {'tokens':>13s} {'seconds':>8s} {'-> 100M':>8s}")
    for name, size, n, sec, ext in rows:
        print(f"{name:28s} {size:>12s} {n:>13,} {sec:8.2f} {'' if ext is None else f'{ext:8.1f}'}")
    out = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "rows": [dict(zip(("corpus", "size", "tokens", "seconds", "extrapolated_100M_s"), r)) for r in rows],
    }
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
