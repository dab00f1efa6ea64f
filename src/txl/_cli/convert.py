"""``txl convert``: official / Hugging Face checkpoints to and from txl model directories."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from txl.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert official or Hugging Face TransfoXL weights to a txl model directory (or back)",
        description="Import: --from official CKPT --config KWARGS.json, or --from hf HF_DIR. "
        "Export: --to official|hf MODEL_DIR. Files are read without unpickling code.",
    )
    p.add_argument("path", help="checkpoint file (official), HF model directory, or txl model directory (--to)")
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from", dest="src", choices=["official", "hf"], help="import from this format")
    direction.add_argument("--to", dest="dst", choices=["official", "hf"], help="export a txl model to it")
    p.add_argument("--config", help="official MemTransformerLM constructor kwargs as JSON (with --from official)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--vocab", help="with --from: a vocabulary to write as OUT/vocab.json (a Hugging Face "
                   "vocab.pkl/vocab.bin, read without running code, or a txl vocab JSON); --from hf looks for "
                   "PATH/vocab.pkl or PATH/vocab.bin by itself")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from txl import TransformerXLLM
    from txl.convert import from_hf, load_official, to_hf_state_dict, to_official
    from txl.io import atomic_write, save_tensors

    out = Path(args.out)
    vocab = _import_vocab(args) if args.src else None  # read (and refuse) before writing anything
    if args.src == "official":
        if not args.config:
            raise ConfigError("--from official needs --config KWARGS.json (the MemTransformerLM constructor "
                              "arguments the checkpoint was trained with)")
        model = load_official(args.path, args.config)
    elif args.src == "hf":
        model = from_hf(args.path)
    else:
        model = TransformerXLLM.from_pretrained(args.path)
        if args.dst == "official":
            kwargs, state = to_official(model)
            save_tensors(state, out / "official_state.safetensors")
            text = json.dumps(kwargs, indent=2) + "\n"
            atomic_write(out / "official_kwargs.json", lambda f: f.write(text), binary=False)
        else:
            hf_cfg = _hf_config(model)
            save_tensors(to_hf_state_dict(model), out / "model.safetensors")
            text = json.dumps(hf_cfg, indent=2) + "\n"
            atomic_write(out / "config.json", lambda f: f.write(text), binary=False)
        print(f"wrote {args.dst} weights of {model.num_parameters():,} parameters to {out}")
        return 0
    if vocab is not None and len(vocab) != model.config.n_token:
        raise ConfigError(f"the vocabulary has {len(vocab)} symbols but the model has n_token={model.config.n_token}")
    model.save_pretrained(out)
    print(f"wrote txl model ({model.num_parameters():,} parameters) to {out}")
    if vocab is not None:
        from txl.textcodec import VOCAB_NAME

        vocab.save(out / VOCAB_NAME)
        print(f"wrote vocabulary ({len(vocab):,} symbols) to {out / VOCAB_NAME}")
    return 0


def _import_vocab(args: argparse.Namespace):
    """The vocabulary to write next to an imported model: --vocab, or an HF directory's vocab.pkl/bin."""
    from txl.data import Vocab
    from txl.hf_vocab import find_hf_vocab, load_hf_vocab

    path = Path(args.vocab) if args.vocab else None
    if path is None and args.src == "hf" and Path(args.path).is_dir():
        path = find_hf_vocab(args.path)
    if path is None:
        return None
    if path.suffix == ".json":
        return Vocab.load(path)
    return load_hf_vocab(path)


def _hf_config(model) -> dict:
    cfg = model.built_config
    return {
        "architectures": ["TransfoXLLMHeadModel"], "model_type": "transfo-xl", "vocab_size": cfg.n_token,
        "cutoffs": cfg.cutoffs, "d_model": cfg.d_model, "d_embed": cfg.d_embed, "n_head": cfg.n_head,
        "d_head": cfg.d_head, "d_inner": cfg.d_inner, "div_val": cfg.div_val, "pre_lnorm": cfg.pre_lnorm,
        "n_layer": cfg.n_layer, "mem_len": cfg.mem_len, "clamp_len": cfg.clamp_len,
        "same_length": cfg.same_length, "attn_type": 0, "sample_softmax": cfg.sample_softmax,
        "adaptive": bool(cfg.cutoffs), "dropout": cfg.dropout, "dropatt": cfg.dropatt, "untie_r": cfg.untie_r,
        "tie_projs": cfg.tie_projs + [False] * (len(cfg.cutoffs) + 1 - len(cfg.tie_projs)),
        "tie_word_embeddings": cfg.tie_weight, "layer_norm_epsilon": 1e-5, "init": cfg.init,
        "init_range": cfg.init_range, "init_std": cfg.init_std, "proj_init_std": cfg.proj_init_std,
    }
