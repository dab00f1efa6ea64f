"""Datasets for Transformer-XL: the paper's benchmarks and the user's own text.

Public API::

    from transformer_xl.data import load_corpus, LMOrderedIterator
    corpus = load_corpus("wt2")                      # data dir, then the embedded copy
    it = LMOrderedIterator(corpus.splits["train"], batch_size=16, tgt_len=128)
    for input_ids, targets, seq_len in it: ...
"""

from transformer_xl.data.batching import (
    Batch,
    LMMultiFileIterator,
    LMOrderedIterator,
    LMShuffledIterator,
    LMVarLenIterator,
)
from transformer_xl.data.corpus import Corpus, load_corpus
from transformer_xl.data.fetch import download, fetch
from transformer_xl.data.paths import resolve_cache_dir, resolve_data_dir
from transformer_xl.data.registry import known_datasets
from transformer_xl.data.vocab import Vocab

__all__ = [
    "Batch",
    "Corpus",
    "LMMultiFileIterator",
    "LMOrderedIterator",
    "LMShuffledIterator",
    "LMVarLenIterator",
    "Vocab",
    "download",
    "fetch",
    "known_datasets",
    "load_corpus",
    "resolve_cache_dir",
    "resolve_data_dir",
]
