"""The official TensorFlow code's checkpoints as txl models: the paper's four released models, and any checkpoint
``tf/model.py`` of kimiyoung/transformer-xl wrote (read by :mod:`transformer_xl.interop.tensorbundle`, no TensorFlow).

The architecture is read from the variables' names and shapes; the model computes what ``tf/model.py`` computes:

============================================================  ==================================================
TensorFlow variable (under ``transformer/``)                  txl
============================================================  ==================================================
``r_w_bias`` / ``r_r_bias`` ``[H, E]``, or ``[L, H, E]``      ``pos_enc.r_w_bias`` / ``r_r_bias`` (``untie_r``)
``adaptive_embed/lookup_table``, or ``cutoff_{i}/...``        ``word_emb.emb_layers.{i}.weight`` (tied to the
                                                              softmax: TF always ties them)
``adaptive_embed[/cutoff_{i}]/proj_W`` ``[d_i, D]``           ``word_emb.emb_projs.{i}``, transposed; a cluster TF
                                                              leaves unprojected (``proj_same_dim=False``, ``d_i =
                                                              D``) gets the identity, which computes the same
``layer_{l}/rel_attn/{qkv,r,o}/kernel`` ``[in, out]``         ``layers.{l}.dec_attn.{qkv,r,o}_net.weight``,
                                                              transposed (q, k, v in that order in both)
``layer_{l}/ff/layer_{1,2}/kernel``, ``bias``                 ``layers.{l}.pos_ff.CoreNet.{0,3}`` (transposed)
``layer_{l}/{rel_attn,ff}/LayerNorm/gamma``, ``beta``         ``...layer_norm.weight``, ``bias``
``adaptive_softmax/bias``, or ``cutoff_{i}/b``                ``crit.out_layers.{0 or i}.bias``
``adaptive_softmax/cutoff_{i}/proj`` ``[d_i, D]``             ``crit.out_projs.{i}``, transposed (absent: tied to
                                                              the input's, ``tie_projs[i]``)
``adaptive_softmax/cutoff_0/cluster_W``, ``cluster_b``        ``crit.cluster_weight``, ``cluster_bias``, rows
                                                              reversed: TF reads cluster ``i`` at head column
                                                              ``shortlist + i - 1``, txl (and the PyTorch code) at
                                                              ``-i``
============================================================  ==================================================

What the TF code computes differently from the PyTorch code is kept as options of the model's config:
``layer_norm_epsilon=1e-12`` (``tf.contrib.layers.layer_norm``) and ``tf_memory`` (the memory starts as ``mem_len``
zero states, and ``same_length`` sees ``mem_len + 1`` keys). Other variables (optimizer slots, ``global_step``) are
left out; a model variable that is missing or has another shape, or a ``transformer/`` variable this code does not
make, is a one-line :class:`~transformer_xl.errors.CheckpointError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_xl.data.vocab import Vocab
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.interop.tensorbundle import BFLOAT16, TensorBundle, find_prefix
from transformer_xl.interop.tf_released import RELEASED, TF_LAYER_NORM_EPS, lengths_for
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.pretrained import mismatch
from transformer_xl.store.tensors import check_finite

P = "transformer/"


@dataclass
class TFCheckpoint:
    """A checkpoint read for conversion: its bundle, the txl config of its model, and how it was read."""

    bundle: TensorBundle
    config: TXLConfig
    proj_same_dim: bool
    ignored: list[str]


# ---------------------------------------------------------------------------------------------- the architecture
def _clusters(shapes: dict[str, tuple[int, ...]], what: str) -> list[tuple[int, ...]]:
    """The shapes of ``what``'s ``cutoff_0, cutoff_1, ...`` tables (the embedding's) or biases (the softmax's), each
    checked to be a 2-d (1-d) shape of sizes >= 1."""
    leaf, rank = ("lookup_table", 2) if "embed" in what else ("b", 1)
    out: list[tuple[int, ...]] = []
    while (shape := shapes.get(f"{P}{what}/cutoff_{len(out)}/{leaf}")) is not None:
        if len(shape) != rank or min(shape) < 1:
            raise CheckpointError(f"{P}{what}/cutoff_{len(out)}/{leaf} has shape {list(shape)}, not a {rank}-d "
                                  "shape of this architecture")
        out.append(shape)
    return out


def architecture(shapes: dict[str, tuple[int, ...]], **lengths: Any) -> tuple[TXLConfig, bool]:
    """``(config, proj_same_dim)`` of the model whose variables have ``shapes`` (name -> shape); ``lengths`` are
    the config's evaluation lengths (``tgt_len``, ``mem_len``, ``clamp_len``, ``same_length``)."""
    def need(name: str, rank: int) -> tuple[int, ...]:
        shape = shapes.get(P + name)
        if shape is None:
            raise CheckpointError(f"the checkpoint has no {P}{name}: not a Transformer-XL of the official TF code "
                                  f"(it holds {len(shapes)} variables, e.g. {', '.join(sorted(shapes)[:3])})")
        if len(shape) != rank or min(shape, default=1) < 1:
            raise CheckpointError(f"{P}{name} has shape {list(shape)}, not a {rank}-d shape of this architecture")
        return shape

    rw = shapes.get(P + "r_w_bias")
    rank = len(rw) if rw is not None and len(rw) in (2, 3) else 2
    rw = need("r_w_bias", rank)
    untie_r = rank == 3
    n_head, d_head = rw[-2:]
    layers = sorted({int(m.group(1)) for n in shapes if (m := re.match(rf"{P}layer_(\d+)/", n))})
    if not layers or layers != list(range(len(layers))):
        raise CheckpointError(f"the checkpoint's layers are {layers[:8]}: expected layer_0 .. layer_N-1")
    n_layer = len(layers)
    if untie_r and rw[0] != n_layer:
        raise CheckpointError(f"{P}r_w_bias has {rw[0]} layers' biases but the checkpoint has {n_layer} layers")
    d_model, qkv = need("layer_0/rel_attn/qkv/kernel", 2)
    if qkv != 3 * n_head * d_head:
        raise CheckpointError(f"{P}layer_0/rel_attn/qkv/kernel has {qkv} outputs, not 3 x {n_head} heads x "
                              f"{d_head} = {3 * n_head * d_head}")
    d_inner = need("layer_0/ff/layer_1/kernel", 2)[1]
    tables, biases = _clusters(shapes, "adaptive_embed"), _clusters(shapes, "adaptive_softmax")
    proj_same_dim = True
    if P + "adaptive_embed/lookup_table" in shapes:  # div_val 1: one table, the softmax's clusters slice it
        n_token, d_embed = need("adaptive_embed/lookup_table", 2)
        div_val = 1
        sizes = [b[0] for b in biases] if biases else [n_token]
        if sum(sizes) != n_token:
            raise CheckpointError(f"the softmax's clusters hold {sum(sizes)} tokens but the embedding {n_token}")
    else:
        if len(tables) < 2:
            raise CheckpointError(f"the checkpoint has no {P}adaptive_embed/lookup_table and {len(tables)} "
                                  "cutoff_i tables: not an architecture of the official TF code")
        sizes, dims = [t[0] for t in tables], [t[1] for t in tables]
        d_embed, div_val = dims[0], max(1, dims[0] // dims[1])
        if div_val < 2 or any(d != d_embed // div_val**i for i, d in enumerate(dims)):
            raise CheckpointError(f"the embedding clusters have sizes {dims}: not d_embed // div_val**i for one "
                                  "div_val > 1")
        n_token = sum(sizes)
        for i, d in enumerate(dims):
            if P + f"adaptive_embed/cutoff_{i}/proj_W" not in shapes:
                if d != d_model:
                    raise CheckpointError(f"{P}adaptive_embed/cutoff_{i}/proj_W is missing")
                proj_same_dim = False
    cutoffs = list(accumulate(sizes))[:-1]
    tie_projs = []
    for i in range(len(sizes)):
        own = P + f"adaptive_softmax/cutoff_{i}/proj" in shapes
        embedded = (P + "adaptive_embed/proj_W" in shapes) if div_val == 1 else \
            (P + f"adaptive_embed/cutoff_{i}/proj_W" in shapes)
        tie_projs.append(not own and embedded)
    try:
        cfg = TXLConfig(n_token=n_token, n_layer=n_layer, n_head=n_head, d_model=d_model, d_head=d_head,
                        d_inner=d_inner, d_embed=d_embed, div_val=div_val, cutoffs=tuple(cutoffs),
                        tie_projs=tuple(tie_projs), tie_weight=True, untie_r=untie_r,
                        layer_norm_epsilon=TF_LAYER_NORM_EPS, tf_memory=True, **lengths)
    except ConfigError as exc:
        raise CheckpointError(f"the checkpoint's shapes make no txl model: {exc}") from None
    return cfg, proj_same_dim


def tf_shapes(cfg: TXLConfig, proj_same_dim: bool) -> dict[str, tuple[int, ...]]:
    """Every model variable ``tf/model.py`` makes for ``cfg`` (as :func:`architecture` reads it), with its shape."""
    d, h, e = cfg.d_model, cfg.n_head, cfg.d_head
    bias = (cfg.n_layer, h, e) if cfg.untie_r else (h, e)
    out: dict[str, tuple[int, ...]] = {P + "r_w_bias": bias, P + "r_r_bias": bias}
    tables = cfg.cluster_shapes()
    if cfg.div_val == 1:
        out[P + "adaptive_embed/lookup_table"] = tables[0]
        if cfg.d_embed != d:
            out[P + "adaptive_embed/proj_W"] = (tables[0][1], d)
    else:
        for i, (v, di) in enumerate(tables):
            out[P + f"adaptive_embed/cutoff_{i}/lookup_table"] = (v, di)
            if proj_same_dim or di != d:
                out[P + f"adaptive_embed/cutoff_{i}/proj_W"] = (di, d)
    for layer in range(cfg.n_layer):
        lp = f"{P}layer_{layer}/"
        out.update({lp + "rel_attn/qkv/kernel": (d, 3 * h * e), lp + "rel_attn/r/kernel": (d, h * e),
                    lp + "rel_attn/o/kernel": (h * e, d), lp + "ff/layer_1/kernel": (d, cfg.d_inner),
                    lp + "ff/layer_1/bias": (cfg.d_inner,), lp + "ff/layer_2/kernel": (cfg.d_inner, d),
                    lp + "ff/layer_2/bias": (d,)})
        for block in ("rel_attn", "ff"):
            out[lp + f"{block}/LayerNorm/gamma"] = out[lp + f"{block}/LayerNorm/beta"] = (d,)
    if not cfg.cutoffs:
        out[P + "adaptive_softmax/bias"] = (cfg.n_token,)
        return out
    bounds = [0, *cfg.cutoffs, cfg.n_token]
    for i in range(len(bounds) - 1):
        sp = f"{P}adaptive_softmax/cutoff_{i}/"
        out[sp + "b"] = (bounds[i + 1] - bounds[i],)
        di = cfg.d_embed if cfg.div_val == 1 else tables[i][1]
        unprojected = (cfg.div_val == 1 or not proj_same_dim) and di == d
        if not cfg.tie_projs[i] and not unprojected:
            out[sp + "proj"] = (di, d)
    out[P + "adaptive_softmax/cutoff_0/cluster_W"] = (len(cfg.cutoffs), cfg.d_embed)
    out[P + "adaptive_softmax/cutoff_0/cluster_b"] = (len(cfg.cutoffs),)
    return out


def check_variables(shapes: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]]) -> list[str]:
    """The checkpoint's variables that are not the model's (ignored), after refusing a missing model variable, one
    of another shape, or a ``transformer/`` variable the TF code does not make (other than an optimizer's slot)."""
    for name, shape in wanted.items():
        if name not in shapes:
            raise CheckpointError(f"the checkpoint lacks {name} (shape {list(shape)}), which the model needs")
        if tuple(shapes[name]) != shape:
            raise CheckpointError(f"{name} has shape {list(shapes[name])} where the model's architecture needs "
                                  f"{list(shape)}")
    ignored = []
    for name in shapes:
        if name in wanted:
            continue
        slot_of = next((w for w in wanted if name.startswith(w + "/")), None)
        if name.startswith(P) and slot_of is None:
            raise CheckpointError(f"the checkpoint holds {name} {list(shapes[name])}, which the official TF "
                                  "Transformer-XL does not make: an unknown architecture")
        ignored.append(name)
    return ignored


def read_checkpoint(src: str | Path, **lengths: Any) -> TFCheckpoint:
    """The checkpoint ``src`` names (:func:`~transformer_xl.interop.tensorbundle.find_prefix`), its model's config
    (with ``lengths``) and its variables checked; no tensor is read yet."""
    bundle = TensorBundle(find_prefix(src))
    shapes = bundle.shapes()
    cfg, proj_same_dim = architecture(shapes, **lengths)
    ignored = check_variables(shapes, tf_shapes(cfg, proj_same_dim))
    return TFCheckpoint(bundle, cfg, proj_same_dim, ignored)


# ---------------------------------------------------------------------------------------------- the weights
def _tensor(bundle: TensorBundle, name: str) -> Tensor:
    array = bundle.read(name)
    if bundle.entries[name].dtype == BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).float()
    if not np.issubdtype(array.dtype, np.floating):
        raise CheckpointError(f"{name} is stored as {bundle.entries[name].dtype_name}, not as floating point")
    return torch.from_numpy(array).float()


def state_dict(ckpt: TFCheckpoint) -> dict[str, Tensor]:
    """The txl state dict of the checkpoint's model, built one variable at a time (each read, checked, transposed
    where TF stores ``[in, out]``, then its read buffer dropped): the whole takes the memory of the model once. Tied
    names share one tensor. NaN or inf in a weight is refused."""
    cfg, bundle = ckpt.config, ckpt.bundle
    wanted = tf_shapes(cfg, ckpt.proj_same_dim)  # which projections TF made: the one rule, checked on reading

    def get(name: str, transpose: bool = False, flip: bool = False) -> Tensor:
        t = _tensor(bundle, P + name)
        check_finite({P + name: t}, bundle.prefix)
        if transpose:
            t = t.t().contiguous()
        return t.flip(0).contiguous() if flip else t

    state: dict[str, Tensor] = {"pos_enc.r_w_bias": get("r_w_bias"), "pos_enc.r_r_bias": get("r_r_bias")}
    tables = cfg.cluster_shapes()
    emb_projs: list[Tensor] = []
    if cfg.div_val == 1:
        state["word_emb.emb_layers.0.weight"] = get("adaptive_embed/lookup_table")
        if cfg.d_embed != cfg.d_model:
            emb_projs.append(get("adaptive_embed/proj_W", transpose=True))
    else:
        for i in range(len(tables)):
            state[f"word_emb.emb_layers.{i}.weight"] = get(f"adaptive_embed/cutoff_{i}/lookup_table")
            if P + f"adaptive_embed/cutoff_{i}/proj_W" in wanted:
                emb_projs.append(get(f"adaptive_embed/cutoff_{i}/proj_W", transpose=True))
            else:  # TF leaves this cluster unprojected (proj_same_dim=False): x @ I is x, exactly
                emb_projs.append(torch.eye(cfg.d_model))
    for i, p in enumerate(emb_projs):
        state[f"word_emb.emb_projs.{i}"] = p
    for layer in range(cfg.n_layer):
        tp, lp = f"layer_{layer}/", f"layers.{layer}."
        for net in ("qkv", "r", "o"):
            state[f"{lp}dec_attn.{net}_net.weight"] = get(f"{tp}rel_attn/{net}/kernel", transpose=True)
        state[f"{lp}dec_attn.layer_norm.weight"] = get(f"{tp}rel_attn/LayerNorm/gamma")
        state[f"{lp}dec_attn.layer_norm.bias"] = get(f"{tp}rel_attn/LayerNorm/beta")
        for j, k in ((1, 0), (2, 3)):
            state[f"{lp}pos_ff.CoreNet.{k}.weight"] = get(f"{tp}ff/layer_{j}/kernel", transpose=True)
            state[f"{lp}pos_ff.CoreNet.{k}.bias"] = get(f"{tp}ff/layer_{j}/bias")
        state[f"{lp}pos_ff.layer_norm.weight"] = get(f"{tp}ff/LayerNorm/gamma")
        state[f"{lp}pos_ff.layer_norm.bias"] = get(f"{tp}ff/LayerNorm/beta")
    for i in range(len(tables)):  # the softmax: its words are the embedding's tables (TF always ties them)
        state[f"crit.out_layers.{i}.weight"] = state[f"word_emb.emb_layers.{i}.weight"]
    if not cfg.cutoffs:
        state["crit.out_layers.0.bias"] = get("adaptive_softmax/bias")
    else:
        biases = [get(f"adaptive_softmax/cutoff_{i}/b") for i in range(len(cfg.cutoffs) + 1)]
        if cfg.div_val == 1:
            state["crit.out_layers.0.bias"] = torch.cat(biases)
        else:
            for i, b in enumerate(biases):
                state[f"crit.out_layers.{i}.bias"] = b
        state["crit.cluster_weight"] = get("adaptive_softmax/cutoff_0/cluster_W", flip=True)
        state["crit.cluster_bias"] = get("adaptive_softmax/cutoff_0/cluster_b", flip=True)
    projected = cfg.div_val != 1 or cfg.d_embed != cfg.d_model
    for i in range(len(cfg.cutoffs) + 1 if projected else 0):
        if P + f"adaptive_softmax/cutoff_{i}/proj" in wanted:
            state[f"crit.out_projs.{i}"] = get(f"adaptive_softmax/cutoff_{i}/proj", transpose=True)
        elif cfg.tie_projs[i]:
            state[f"crit.out_projs.{i}"] = state[f"word_emb.emb_projs.{0 if cfg.div_val == 1 else i}"]
        else:  # unprojected in TF (d_i == d_model): the identity
            state[f"crit.out_projs.{i}"] = torch.eye(cfg.d_model)
    with torch.device("meta"):
        own = TransformerXLLM(cfg).state_dict()
    problem = mismatch({k: v.shape for k, v in own.items()}, {k: v.shape for k, v in state.items()})
    if problem:  # a defect of this map, not of the file: the architecture was checked before
        raise CheckpointError(f"the converted weights do not fit the model ({problem})")
    return {name: state[name] for name in own}


# ---------------------------------------------------------------------------------------------- a released folder
def released_files(src: str | Path) -> tuple[Path | None, Path | None]:
    """``(cache.pkl, corpus-info.json)`` of the released layout around ``src`` (``DIR/data/`` beside ``DIR/model/``,
    ``src`` being ``DIR``, ``DIR/model`` or a prefix inside it), each None when absent."""
    src = Path(src)
    for folder in (src, src.parent, src.parent.parent):
        data = folder / "data"
        if data.is_dir():
            pkl, info = data / "cache.pkl", data / "corpus-info.json"
            return (pkl if pkl.is_file() else None), (info if info.is_file() else None)
    return None, None


def open_tf(src: str | Path, *, preset: str | None = None,
            vocab: Vocab | None = None) -> tuple[TFCheckpoint, Vocab | None, str | None]:
    """``(checkpoint, vocabulary, dataset)`` of ``src`` as ``txl convert --from tf`` takes it, every refusal made
    and no tensor read: the released layout's ``data/corpus-info.json`` (checked against the checkpoint's model)
    and ``cache.pkl`` (read without running code; ``vocab`` instead when given); the dataset is ``preset``, else the
    one ``data/`` names, and gives the model the paper's evaluation settings when it is a released one (else
    :data:`GENERIC_LENGTHS`; ``dataset`` None)."""
    from transformer_xl.interop.tf_vocab import read_corpus_info, read_corpus_vocab

    pkl, info_file = released_files(src)
    info = read_corpus_info(info_file) if info_file is not None else None
    cached = None
    if vocab is None and pkl is not None:
        vocab, cached = read_corpus_vocab(pkl)
    dataset = preset or (info or {}).get("dataset") or cached
    dataset = dataset if dataset in RELEASED else None
    ckpt = read_checkpoint(src, **lengths_for(dataset))
    cfg = ckpt.config
    if info is not None and (info["vocab_size"] != cfg.n_token or tuple(info["cutoffs"]) != cfg.cutoffs):
        raise ConfigError(f"{info_file} says {info['vocab_size']} tokens with cutoffs {info['cutoffs']}, the "
                          f"checkpoint's model has {cfg.n_token} with cutoffs {list(cfg.cutoffs)}: not its data")
    if vocab is not None and len(vocab) != cfg.n_token:
        raise ConfigError(f"the vocabulary has {len(vocab)} symbols but the model has n_token={cfg.n_token}")
    return ckpt, vocab, dataset


def load_tf(src: str | Path, *, preset: str | None = None) -> TransformerXLLM:
    """The model of a TensorFlow checkpoint of the official code, in eval mode, with the evaluation settings of its
    dataset (:func:`open_tf`)."""
    ckpt, _, _ = open_tf(src, preset=preset)
    model = TransformerXLLM(ckpt.config)
    model.load_state_dict_strict(state_dict(ckpt))
    return model.eval()
