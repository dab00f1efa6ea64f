"""Weight conversion between txl and Hugging Face's (deprecated) ``TransfoXLLMHeadModel``, attn_type 0 only.

Key map (everything else gets a ``transformer.`` prefix):

==============================  =====================================================================
txl                             Hugging Face ``TransfoXLLMHeadModel``
==============================  =====================================================================
``pos_enc.r_w_bias`` (u)        ``transformer.r_w_bias`` and a copy under every layer, or with ``untie_r``
``pos_enc.r_r_bias`` (v)        one per layer: ``transformer.layers.{l}.dec_attn.r_w_bias`` / ``r_r_bias``
``crit.cluster_weight/bias``    same names, but cluster ``i`` at head column ``shortlist + i - 1`` where the
                                official code (and txl) read column ``-i``: the rows are reversed
``crit.*`` (other)              same
==============================  =====================================================================

Shared u, v (``untie_r=False``) are written under every name Hugging Face's model has for them (the
shared tensor and each layer's alias of it): from transformers 4.43 on (measured: 4.43.4, 4.46.3, 4.52.4,
4.57.6; 4.36.2-4.40.2 were not affected) ``from_pretrained`` re-initializes an alias missing from the file
*after* loading, which overwrites the shared values with random ones ("newly initialized: ...dec_attn.r_w_bias").
Those releases also load each alias as its own parameter (equal values: the same function, but fine-tuning in
transformers would then train per-layer copies). Configurations Hugging Face cannot represent are refused by
:func:`check_hf_exportable`.

Hugging Face ``transformers`` (4.35-4.57, where TransfoXL lives under ``models.deprecated``) is optional:
:func:`build_hf` (the tests' and the benchmark's oracle) needs it, the weight maps do not.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.interop.state_dicts import check_size, fill_tied, read_state_dict
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.store.files import read_json
from transformer_xl.store.manifest import verify_manifest

#: The files of a Hugging Face model directory (``save_pretrained``): its config and, newest first, its weights.
HF_CONFIG = "config.json"
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")

_HF_RENAMES = {"vocab_size": "n_token", "tie_word_embeddings": "tie_weight"}
_HF_IGNORED = {
    "adaptive", "proj_share_all_but_first", "eos_token_id", "architectures",
    "model_type", "transformers_version", "torch_dtype", "dtype", "task_specific_params", "pad_token_id",
    "bos_token_id", "output_attentions", "output_hidden_states", "use_return_dict", "trainer_compatible",
    "return_dict", "is_decoder", "tie_weight", "tie_word_embeddings", "n_token", "vocab_size",
}


def config_from_hf(hf: dict[str, Any]) -> TXLConfig:
    """``TXLConfig`` from a Hugging Face TransfoXL ``config.json`` dict (old and new key names)."""
    if hf.get("attn_type", 0) != 0:
        raise ConfigError("Hugging Face TransfoXL implements attn_type 0 only")
    fields = set(TXLConfig.__dataclass_fields__)
    kw: dict[str, Any] = {k: v for k, v in hf.items() if k in fields and k not in _HF_IGNORED}
    kw["n_token"] = hf.get("vocab_size", hf.get("n_token"))
    kw["tie_weight"] = hf.get("tie_word_embeddings", hf.get("tie_weight", True))
    if "tie_projs" not in hf:
        share, cutoffs = hf.get("proj_share_all_but_first", True), hf.get("cutoffs", [])
        if not isinstance(cutoffs, list):
            raise ConfigError(f"cutoffs must be a list of integers, got {cutoffs!r}")
        kw["tie_projs"] = [False] + [bool(share)] * len(cutoffs)
    if kw.get("tgt_len") is None:  # HF configs need not carry it; TXLConfig checks a value that is there
        kw["tgt_len"] = 128
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
    model.load_state_dict_strict(fill_tied(model, state))
    return model


def check_hf_exportable(cfg: TXLConfig) -> None:
    """Refuse (one-line :class:`ConfigError`) a config Hugging Face's ``TransfoXLLMHeadModel`` cannot compute."""
    if cfg.attn_type != 0:
        raise ConfigError("Hugging Face TransfoXL implements attn_type 0 only")
    if cfg.sample_softmax > 0:
        raise ConfigError(f"Hugging Face TransfoXL has no sampled softmax (sample_softmax={cfg.sample_softmax}; "
                          "its model refuses sample_softmax > 0)")
    if cfg.tf_memory:
        raise ConfigError("Hugging Face TransfoXL has no tf_memory (the TF code's memory: mem_len zero states to "
                          "start, same_length seeing mem_len + 1 keys): its scores would differ")
    if cfg.ext_len > 0:
        raise ConfigError(f"Hugging Face TransfoXL has no ext_len (ext_len={cfg.ext_len}): its memory keeps the "
                          "last mem_len positions of every segment, so its memories would differ")


def to_hf_state_dict(model: TransformerXLLM) -> dict[str, Tensor]:
    """The ``TransfoXLLMHeadModel`` state dict of our (attn_type 0) model: every name Hugging Face's model has,
    the per-layer aliases of shared u, v included (each its own tensor, so that a safetensors file holds it)."""
    cfg = model.config
    check_hf_exportable(cfg)
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        if name.startswith("pos_enc."):
            key = name.removeprefix("pos_enc.")
            if not cfg.untie_r:
                out[f"transformer.{key}"] = t
            for i in range(cfg.n_layer):
                out[f"transformer.layers.{i}.dec_attn.{key}"] = t[i] if cfg.untie_r else t.clone()
        elif name.startswith("crit."):
            out[name] = t.flip(0) if name in ("crit.cluster_weight", "crit.cluster_bias") else t
        else:
            out["transformer." + name] = t
    out["transformer.pos_emb.inv_freq"] = model.pos_enc.inv_freq.clone()
    return out


def from_hf(path: str | Path, *, verify: bool = True) -> TransformerXLLM:
    """Load a Hugging Face TransfoXL directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``).

    With ``verify``, a ``MANIFEST.json`` in the directory (``txl convert --to hf`` writes one) is checked first;
    the config is checked against the size of the weights before the model is built."""
    path = Path(path)
    cfg_file = path / HF_CONFIG
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file} not found (expected a Hugging Face model directory)")
    if verify:
        verify_manifest(path, what="Hugging Face model directory")
    cfg = config_from_hf(read_json(cfg_file, error=CheckpointError))
    for weights in HF_WEIGHTS:
        if (path / weights).is_file():
            state = read_state_dict(path / weights)
            check_size(cfg, state, path / weights)
            return from_hf_state_dict(cfg, state)
    raise CheckpointError(f"no model.safetensors or pytorch_model.bin in {path}")


def hf_config_dict(model: TransformerXLLM) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face TransfoXL model with ``model``'s architecture (attn_type 0)."""
    cfg = model.config
    check_hf_exportable(cfg)
    return {
        "architectures": ["TransfoXLLMHeadModel"], "model_type": "transfo-xl", "vocab_size": cfg.n_token,
        "cutoffs": list(cfg.cutoffs), "d_model": cfg.d_model, "d_embed": cfg.d_embed, "n_head": cfg.n_head,
        "d_head": cfg.d_head, "d_inner": cfg.d_inner, "div_val": cfg.div_val, "pre_lnorm": cfg.pre_lnorm,
        "n_layer": cfg.n_layer, "mem_len": cfg.mem_len, "clamp_len": cfg.clamp_len,
        "same_length": cfg.same_length, "attn_type": 0, "sample_softmax": cfg.sample_softmax,
        "adaptive": bool(cfg.cutoffs), "dropout": cfg.dropout, "dropatt": cfg.dropatt, "untie_r": cfg.untie_r,
        "tie_projs": [*cfg.tie_projs, *[False] * (len(cfg.cutoffs) + 1 - len(cfg.tie_projs))],
        "tie_word_embeddings": cfg.tie_weight, "layer_norm_epsilon": cfg.layer_norm_epsilon, "init": cfg.init,
        "init_range": cfg.init_range, "init_std": cfg.init_std, "proj_init_std": cfg.proj_init_std,
    }


# ---------------------------------------------------------------------------------------------- running HF's model
@contextlib.contextmanager
def hf_compat() -> Iterator[None]:
    """Run Hugging Face's TransfoXL forward under this torch: transformers 4.38-4.57 (measured: 4.38.2, 4.40.2,
    4.43.4, 4.46.3, 4.52.4, 4.57.6; not 4.36.2, 4.37.2) call ``Tensor.type_as(dtype=...)``
    (``TransfoXLModel.forward``, the position sequence), which torch rejects ("type_as() missing 1 required
    positional argument"); for the block, ``type_as`` also accepts ``dtype=``. Restored afterwards."""
    original = torch.Tensor.type_as

    def type_as(self, other=None, dtype=None):
        return self.to(dtype) if other is None else original(self, other)

    torch.Tensor.type_as = type_as  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.type_as = original  # type: ignore[method-assign]


def _hf_module() -> Any:
    try:
        from transformers.models.deprecated.transfo_xl import modeling_transfo_xl
    except ImportError:
        return None
    return modeling_transfo_xl


def hf_available() -> bool:
    """Whether ``transformers`` with the deprecated TransfoXL (4.35-4.57) is installed."""
    return _hf_module() is not None


def build_hf(model: TransformerXLLM) -> Any:
    """Hugging Face's ``TransfoXLLMHeadModel`` holding the weights of ``model`` (attn_type 0)."""
    mod = _hf_module()
    if mod is None:
        raise ConfigError("Hugging Face transformers (4.35-4.57, with TransfoXL) is not installed")
    from transformers.models.deprecated.transfo_xl import TransfoXLConfig

    hf = mod.TransfoXLLMHeadModel(TransfoXLConfig(**hf_config_dict(model)))
    hf.load_state_dict(to_hf_state_dict(model), strict=True)
    return hf
