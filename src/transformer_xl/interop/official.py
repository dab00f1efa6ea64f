"""Weight conversion between txl and the official PyTorch code (kimiyoung/transformer-xl, ``MemTransformerLM``).

Key map (everything else has the same name):

==============================  =========================================================
txl                             official ``MemTransformerLM``
==============================  =========================================================
``pos_enc.r_w_bias`` (u)        ``r_w_bias``
``pos_enc.r_r_bias`` (v)        ``r_r_bias``
``pos_enc.r_emb`` / ``r_bias``  ``r_emb`` / ``r_bias`` (types 1, 3)
``layers.{l}.dec_attn.qkv_net`` ``qkv_net``; types 2/3: ``q_net`` and ``kv_net`` (rows concatenated)
==============================  =========================================================

The official ``train.py`` saves whole pickled models (``torch.save(model)``); txl never unpickles those
(it would run arbitrary code). Files are read with ``torch.load(weights_only=True)``, which accepts
plain state dicts only (:func:`transformer_xl.interop.state_dicts.read_state_dict`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.interop.state_dicts import check_size, fill_tied, read_state_dict
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.store.files import read_json
from transformer_xl.store.manifest import verify_beside

_POS_PARAMS = ("r_w_bias", "r_r_bias", "r_emb", "r_bias")
_OFFICIAL_IGNORED = ("adapt_inp",)


def config_from_official(kwargs: dict[str, Any]) -> TXLConfig:
    """``TXLConfig`` from the official ``MemTransformerLM`` constructor kwargs (``None`` lengths -> 0)."""
    kw = {k: v for k, v in kwargs.items() if k not in _OFFICIAL_IGNORED}
    for key in ("ext_len", "mem_len"):
        if kw.get(key) is None:
            kw[key] = 0
    if kw.get("tgt_len") is None:
        kw.pop("tgt_len", None)
    return TXLConfig.from_dict(kw)


def from_official(official_kwargs: dict[str, Any], state_dict: dict[str, Tensor]) -> TransformerXLLM:
    """Build our model from official constructor kwargs and an official ``state_dict``."""
    cfg = config_from_official(official_kwargs)
    model = TransformerXLLM(cfg)
    state: dict[str, Tensor] = {}
    split: dict[str, dict[str, Tensor]] = {}  # absolute attention: q_net and kv_net, joined below
    for name, t in state_dict.items():
        name = name.removeprefix("module.")
        if name == "pos_emb.inv_freq":
            continue
        if name in _POS_PARAMS:
            state[f"pos_enc.{name}"] = t
        elif name.endswith(("dec_attn.q_net.weight", "dec_attn.kv_net.weight")):
            prefix, _, part = name.rpartition("dec_attn.")
            split.setdefault(prefix + "dec_attn.", {})[part] = t
        else:
            state[name] = t
    for prefix, parts in split.items():
        if set(parts) != {"q_net.weight", "kv_net.weight"}:
            raise CheckpointError(f"official state dict has only {sorted(parts)} under {prefix}")
        state[prefix + "qkv_net.weight"] = torch.cat([parts["q_net.weight"], parts["kv_net.weight"]], dim=0)
    model.load_state_dict_strict(fill_tied(model, state))
    return model


def to_official(model: TransformerXLLM) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(official constructor kwargs, official state_dict)`` for our model (``untie_r`` kept as a kwarg).

    The kwargs are the config the model was built with. A model of the TF code's LayerNorm epsilon or memory
    (``layer_norm_epsilon``, ``tf_memory``), which the PyTorch code does not compute, is refused
    (:class:`ConfigError`).
    """
    cfg = model.config
    if cfg.tf_memory or cfg.layer_norm_epsilon != 1e-5:
        raise ConfigError(f"the official PyTorch code has the LayerNorm epsilon 1e-5 and an empty first memory; this "
                          f"model has {cfg.layer_norm_epsilon:g} and tf_memory {cfg.tf_memory} (the TF code's), so "
                          "its scores would differ")
    kwargs = cfg.to_dict()
    for key in ("init", "init_range", "init_std", "proj_init_std", "layer_norm_epsilon", "tf_memory"):
        kwargs.pop(key)
    if not cfg.untie_r:
        kwargs.pop("untie_r")
    absolute = cfg.attn_type in (2, 3)
    hd = cfg.n_head * cfg.d_head
    state: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        if name.startswith("pos_enc."):
            state[name.removeprefix("pos_enc.")] = t
        elif absolute and name.endswith("dec_attn.qkv_net.weight"):
            prefix = name.removesuffix("qkv_net.weight")
            state[prefix + "q_net.weight"] = t[:hd]
            state[prefix + "kv_net.weight"] = t[hd:]
        else:
            state[name] = t
    if cfg.attn_type in (0, 2):
        state["pos_emb.inv_freq"] = model.pos_enc.inv_freq.clone()
    return kwargs, state


def load_official(checkpoint: str | Path, official_kwargs: dict[str, Any] | str | Path, *,
                  verify: bool = True) -> TransformerXLLM:
    """Load an official state-dict checkpoint; kwargs as a dict or a JSON file of constructor kwargs.

    With ``verify``, each file is checked against a ``MANIFEST.json`` beside it that lists it (``txl convert
    --to official`` writes one); the config is checked against the size of the weights before the model is
    built."""
    files = [checkpoint] if isinstance(official_kwargs, dict) else [checkpoint, official_kwargs]
    if verify:
        verify_beside(*files)
    if not isinstance(official_kwargs, dict):
        official_kwargs = read_json(official_kwargs, "official kwargs JSON")
    state = read_state_dict(checkpoint)
    check_size(config_from_official(official_kwargs), state, checkpoint)
    return from_official(official_kwargs, state)
