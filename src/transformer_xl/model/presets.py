"""Model presets as functions: the official run scripts' architectures, and small CPU sizes.

Paper-scale presets follow the official PyTorch ``run_*.sh`` scripts (kimiyoung/transformer-xl; see
``shared/paper/official-configs.md``): where the TF scripts differ (e.g. ``untie_r=True`` for the
word-level models) the PyTorch setting is used and the TF one noted. Each function takes ``n_token``
(the dataset's vocabulary size) and keyword overrides of any :class:`TXLConfig` field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformer_xl.errors import ConfigError, did_you_mean
from transformer_xl.model.config import TXLConfig

_WT103 = dict(cutoffs=[20000, 40000, 200000], tie_projs=[False, True, True, True])
_LM1B = dict(cutoffs=[60000, 100000, 640000], tie_projs=[False, False, False, False])

#: The official PyTorch run scripts' architectures (``run_{enwik8,text8,wt103,lm1b}_{base,large}.sh``).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "enwik8-base": dict(n_layer=12, n_head=8, d_model=512, d_head=64, d_inner=2048, dropout=0.1, dropatt=0.0,
                        tgt_len=512, mem_len=512),
    "enwik8-large": dict(n_layer=24, n_head=8, d_model=1024, d_head=128, d_inner=3072, dropout=0.15, dropatt=0.15,
                         tgt_len=768, mem_len=768),
    "wt103-base": dict(n_layer=16, n_head=10, d_model=410, d_head=41, d_inner=2100, dropout=0.1, dropatt=0.0,
                       div_val=1, tgt_len=150, mem_len=150, **_WT103),
    "wt103-large": dict(n_layer=18, n_head=16, d_model=1024, d_head=64, d_inner=4096, dropout=0.2, dropatt=0.2,
                        div_val=4, tgt_len=384, mem_len=384, **_WT103),
    "lm1b-base": dict(n_layer=18, n_head=8, d_model=1024, d_head=128, d_inner=4096, dropout=0.0, dropatt=0.0,
                      div_val=4, tgt_len=32, mem_len=32, **_LM1B),
    "lm1b-large": dict(n_layer=24, n_head=16, d_model=1280, d_head=80, d_inner=8192, dropout=0.05, dropatt=0.05,
                       div_val=4, tgt_len=32, mem_len=32, **_LM1B),
}


def _make(defaults: dict[str, Any], n_token: int, overrides: dict[str, Any]) -> TXLConfig:
    return TXLConfig.from_dict({**defaults, "n_token": n_token, **overrides})


def enwik8_base(n_token: int = 204, **kw: Any) -> TXLConfig:
    """12L, d_model 512, 8x64 heads, d_inner 2048, dropout 0.1, tgt = mem = 512 (paper: 1.06 bpc)."""
    return _make(ARCHITECTURES["enwik8-base"], n_token, kw)


def enwik8_large(n_token: int = 204, **kw: Any) -> TXLConfig:
    """24L, d_model 1024, 8x128 heads, d_inner 3072, dropout = dropatt = 0.15, tgt = mem = 768."""
    return _make(ARCHITECTURES["enwik8-large"], n_token, kw)


def text8_base(n_token: int = 27, **kw: Any) -> TXLConfig:
    """The enwik8 base architecture on text8's 27 symbols."""
    return enwik8_base(n_token, **kw)


def text8_large(n_token: int = 27, **kw: Any) -> TXLConfig:
    """The enwik8 large architecture on text8's 27 symbols."""
    return enwik8_large(n_token, **kw)


def wt103_base(n_token: int = 267735, **kw: Any) -> TXLConfig:
    """16L, d_model 410, 10x41 heads, d_inner 2100, adaptive softmax div_val 1, tgt = mem = 150."""
    return _make(ARCHITECTURES["wt103-base"], n_token, kw)


def wt103_large(n_token: int = 267735, **kw: Any) -> TXLConfig:
    """18L, d_model 1024, 16x64 heads, d_inner 4096, div_val 4, dropout = dropatt = 0.2, tgt = mem = 384."""
    return _make(ARCHITECTURES["wt103-large"], n_token, kw)


def lm1b_base(n_token: int = 793471, **kw: Any) -> TXLConfig:
    """18L, d_model 1024, 8x128 heads, d_inner 4096, div_val 4, no dropout, tgt = mem = 32."""
    return _make(ARCHITECTURES["lm1b-base"], n_token, kw)


def lm1b_large(n_token: int = 793471, **kw: Any) -> TXLConfig:
    """24L, d_model 1280, 16x80 heads, d_inner 8192, div_val 4, dropout = dropatt = 0.05, tgt = mem = 32."""
    return _make(ARCHITECTURES["lm1b-large"], n_token, kw)


def tiny(n_token: int, **kw: Any) -> TXLConfig:
    """A test-sized model: 2 layers, d_model 32 (seconds on a CPU)."""
    return _make(dict(n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, tgt_len=16, mem_len=16), n_token, kw)


def cpu_small(n_token: int, **kw: Any) -> TXLConfig:
    """4 layers, d_model 128: learns something real in minutes on 2 CPU cores.

    Word vocabularies above 10k get an adaptive softmax (cutoffs 2000/10000, div_val 4, tied projections).
    """
    adaptive = dict(cutoffs=[2000, 10000], div_val=4, tie_projs=[False, True, True]) if n_token > 10000 else {}
    return _make(dict(n_layer=4, n_head=4, d_model=128, d_head=32, d_inner=512, dropout=0.1, dropatt=0.0,
                      tgt_len=64, mem_len=64, **adaptive), n_token, kw)


def ptb(n_token: int = 10000, **kw: Any) -> TXLConfig:
    """OUR OWN PTB model (the maintainers never released theirs, kimiyoung/transformer-xl#16): 12L/400,
    10x40 heads, d_inner 1000, dropout 0.3, dropatt 0.1, tgt = mem = 70 (about 24M parameters, the
    paper's size; without the paper's variational dropout and weight averaging). Not tuned."""
    return _make(dict(n_layer=12, n_head=10, d_model=400, d_head=40, d_inner=1000, dropout=0.3, dropatt=0.1,
                      tgt_len=70, mem_len=70), n_token, kw)


MODEL_PRESETS: dict[str, Callable[..., TXLConfig]] = {
    "enwik8-base": enwik8_base, "enwik8-large": enwik8_large, "text8-base": text8_base,
    "text8-large": text8_large, "wt103-base": wt103_base, "wt103-large": wt103_large,
    "lm1b-base": lm1b_base, "lm1b-large": lm1b_large, "tiny": tiny, "cpu-small": cpu_small,
    "ptb": ptb,
}


def model_preset(name: str, n_token: int, **overrides: Any) -> TXLConfig:
    """The preset ``name`` for a vocabulary of ``n_token``, with overrides; suggests the closest name."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown model preset {name!r}{did_you_mean(name, MODEL_PRESETS)}; "
                          f"known: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name](n_token, **overrides)
