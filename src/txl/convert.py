"""Weight conversion between txl and the official PyTorch code or Hugging Face's TransfoXL.

Key maps (everything else has the same name in all three):

==============================  ======================================  =====================================
txl                             official ``MemTransformerLM``           Hugging Face ``TransfoXLLMHeadModel``
==============================  ======================================  =====================================
``pos_enc.r_w_bias`` (u)        ``r_w_bias``                            ``transformer.r_w_bias``, or with
``pos_enc.r_r_bias`` (v)        ``r_r_bias``                            ``untie_r`` one per layer:
                                                                        ``transformer.layers.{l}.dec_attn.r_w_bias``
``pos_enc.r_emb`` / ``r_bias``  ``r_emb`` / ``r_bias`` (types 1, 3)     (attn_type 0 only)
``layers.{l}.dec_attn.qkv_net`` ``qkv_net``; types 2/3: ``q_net`` and   ``transformer.layers.{l}.dec_attn.qkv_net``
                                ``kv_net`` (rows concatenated)
``crit.cluster_weight/bias``    same (cluster ``i`` read at head        same, but cluster ``i`` at head column
                                column ``-i``)                          ``shortlist + i - 1``: rows reversed
other ``word_emb.*, layers.*``  same                                    ``transformer.`` prefix
==============================  ======================================  =====================================

The official ``train.py`` saves whole pickled models (``torch.save(model)``); txl never unpickles those
(it would run arbitrary code). Files are read with ``torch.load(weights_only=True)``, which accepts
plain state dicts only.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from txl.config import TXLConfig
from txl.errors import CheckpointError, ConfigError
from txl.io import load_tensors
from txl.model import TransformerXLLM

_POS_PARAMS = ("r_w_bias", "r_r_bias", "r_emb", "r_bias")
_OFFICIAL_IGNORED = ("adapt_inp",)


# ---------------------------------------------------------------------------------------------- helpers
def _fill_tied(model: TransformerXLLM, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Add the names of tied parameters that a file left out (e.g. HF safetensors drops tied copies)."""
    own = model.state_dict()
    groups: dict[int, list[str]] = {}
    for name, t in own.items():
        groups.setdefault(t.data_ptr(), []).append(name)
    state = dict(state)
    for names in groups.values():
        present = [n for n in names if n in state]
        for other in present[1:]:
            if not torch.equal(state[other], state[present[0]]):
                raise CheckpointError(f"{present[0]} and {other} are tied in this config but hold different "
                                      "values in the checkpoint (check tie_weight / tie_projs)")
        if present:
            for n in names:
                state.setdefault(n, state[present[0]])
    return state


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a state dict from ``.safetensors`` or a ``torch.save``'d dict (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        return load_tensors(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, EOFError) as exc:
        raise CheckpointError(
            f"{path} is not a plain state dict (it may be a whole pickled model as the official train.py saves; "
            "txl does not unpickle code). In an environment that has the official code run "
            "`torch.save(torch.load(PATH).state_dict(), 'state.pt')` and convert that file"
        ) from exc
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}


# ---------------------------------------------------------------------------------------------- official
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
    model.load_state_dict_strict(_fill_tied(model, state))
    return model


def to_official(model: TransformerXLLM) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(official constructor kwargs, official state_dict)`` for our model (``untie_r`` kept as a kwarg).

    The kwargs are the config the model was built with: evaluation lengths set by ``reset_length`` are
    not exported.
    """
    cfg = model.built_config
    kwargs = cfg.to_dict()
    for key in ("init", "init_range", "init_std", "proj_init_std"):
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


def load_official(checkpoint: str | Path, official_kwargs: dict[str, Any] | str | Path) -> TransformerXLLM:
    """Load an official state-dict checkpoint; kwargs as a dict or a JSON file of constructor kwargs."""
    if not isinstance(official_kwargs, dict):
        path = Path(official_kwargs)
        try:
            official_kwargs = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read official kwargs JSON {path}: {exc}") from exc
    return from_official(official_kwargs, read_state_dict(checkpoint))


# ---------------------------------------------------------------------------------------------- Hugging Face
_HF_RENAMES = {"vocab_size": "n_token", "tie_word_embeddings": "tie_weight"}
_HF_IGNORED = {
    "adaptive", "proj_share_all_but_first", "layer_norm_epsilon", "eos_token_id", "architectures",
    "model_type", "transformers_version", "torch_dtype", "dtype", "task_specific_params", "pad_token_id",
    "bos_token_id", "output_attentions", "output_hidden_states", "use_return_dict", "trainer_compatible",
    "return_dict", "is_decoder", "tie_weight", "tie_word_embeddings", "n_token", "vocab_size",
}


def config_from_hf(hf: dict[str, Any]) -> TXLConfig:
    """``TXLConfig`` from a Hugging Face TransfoXL ``config.json`` dict (old and new key names)."""
    if hf.get("attn_type", 0) != 0:
        raise ConfigError("Hugging Face TransfoXL implements attn_type 0 only")
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if abs(eps - 1e-5) > 1e-12:
        raise ConfigError(f"layer_norm_epsilon {eps} is not supported (txl uses the official 1e-5)")
    fields = set(TXLConfig.__dataclass_fields__)
    kw: dict[str, Any] = {k: v for k, v in hf.items() if k in fields and k not in _HF_IGNORED}
    kw["n_token"] = hf.get("vocab_size", hf.get("n_token"))
    kw["tie_weight"] = hf.get("tie_word_embeddings", hf.get("tie_weight", True))
    if "tie_projs" not in hf:
        share = hf.get("proj_share_all_but_first", True)
        kw["tie_projs"] = [False] + [bool(share)] * len(hf.get("cutoffs", []))
    kw.setdefault("tgt_len", max(1, int(hf.get("tgt_len") or 128)))
    return TXLConfig.from_dict(kw)


def from_hf_state_dict(cfg: TXLConfig, hf_state: dict[str, Tensor]) -> TransformerXLLM:
    """Our model from a ``TransfoXLLMHeadModel`` state dict (cluster rows reversed, see module doc)."""
    model = TransformerXLLM(cfg)
    state: dict[str, Tensor] = {}
    per_layer: dict[str, dict[int, Tensor]] = {"r_w_bias": {}, "r_r_bias": {}}
    for name, t in hf_state.items():
        if name.endswith("pos_emb.inv_freq"):
            continue
        m = re.fullmatch(r"transformer\.layers\.(\d+)\.dec_attn\.(r_w_bias|r_r_bias)", name)
        if m:
            per_layer[m.group(2)][int(m.group(1))] = t
        elif name in ("transformer.r_w_bias", "transformer.r_r_bias"):
            state["pos_enc." + name.removeprefix("transformer.")] = t
        elif name in ("crit.cluster_weight", "crit.cluster_bias"):
            state[name] = t.flip(0)
        else:
            state[name.removeprefix("transformer.")] = t
    for key, layers in per_layer.items():
        if layers and cfg.untie_r:
            state[f"pos_enc.{key}"] = torch.stack([layers[i] for i in sorted(layers)])
        elif layers:  # tied biases: HF also registers the shared tensor under every layer
            state.setdefault(f"pos_enc.{key}", layers[min(layers)])
    model.load_state_dict_strict(_fill_tied(model, state))
    return model


def to_hf_state_dict(model: TransformerXLLM) -> dict[str, Tensor]:
    """The ``TransfoXLLMHeadModel`` state dict of our (attn_type 0) model."""
    cfg = model.built_config
    if cfg.attn_type != 0:
        raise ConfigError("Hugging Face TransfoXL implements attn_type 0 only")
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        if name.startswith("pos_enc."):
            key = name.removeprefix("pos_enc.")
            if cfg.untie_r:
                for i in range(cfg.n_layer):
                    out[f"transformer.layers.{i}.dec_attn.{key}"] = t[i]
            else:
                out[f"transformer.{key}"] = t
        elif name.startswith("crit."):
            out[name] = t.flip(0) if name in ("crit.cluster_weight", "crit.cluster_bias") else t
        else:
            out["transformer." + name] = t
    out["transformer.pos_emb.inv_freq"] = model.pos_enc.inv_freq.clone()
    return out


def from_hf(path: str | Path) -> TransformerXLLM:
    """Load a Hugging Face TransfoXL directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file} not found (expected a Hugging Face model directory)")
    try:
        hf_cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from exc
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if (path / weights).is_file():
            return from_hf_state_dict(config_from_hf(hf_cfg), read_state_dict(path / weights))
    raise CheckpointError(f"no model.safetensors or pytorch_model.bin in {path}")
