"""``txl convert``: official / Hugging Face checkpoints to and from transformer_xl model directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformer_xl.cli.args import add_command, add_model, add_no_verify, stderr_note
from transformer_xl.errors import ConfigError

#: The files of an official export (``--to official``): the state dict and the constructor kwargs.
OFFICIAL_STATE, OFFICIAL_KWARGS = "official_state.safetensors", "official_kwargs.json"


CONVERT_HELP = """convert official or Hugging Face TransfoXL weights to a txl model directory (or back)

Import: --from official CKPT --config KWARGS.json, or --from hf HF_DIR. Export: --to official|hf MODEL_DIR. Files
are read without unpickling code. Every output directory gets a MANIFEST.json (SHA-256 of its files), checked when
txl reads it back.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "convert", CONVERT_HELP)
    add_model(p, "path", "path", "checkpoint file (official), HF model directory, or txl model / checkpoint / run "
              "directory (--to); with --from hf or --to")
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from", dest="src", choices=["official", "hf"], help="import from this format")
    direction.add_argument("--to", dest="dst", choices=["official", "hf"], help="export a txl model to it")
    p.add_argument("--config", help="official MemTransformerLM constructor kwargs as JSON (with --from official)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--vocab", help="with --from: a vocabulary to write as OUT/vocab.json (a Hugging Face "
                   "vocab.pkl/vocab.bin, read without running code, a txl vocab JSON, or a dataset name such as wt103: "
                   "the vocabulary of its prepared cache, see `txl data prepare`); --from hf looks for "
                   "PATH/vocab.pkl, vocab.bin or vocab.txt (a --to hf export) by itself. With --to hf: the "
                   "vocabulary to write as TransfoXLTokenizer files (vocab.txt, tokenizer_config.json, "
                   "special_tokens_map.json; default: the model's own vocab.json)")
    add_no_verify(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformer_xl.inference.loading import load_model
    from transformer_xl.interop.hf import HF_CONFIG, HF_WEIGHTS, from_hf, hf_config_dict, to_hf_state_dict
    from transformer_xl.interop.hub import fetch, parse_hub_id
    from transformer_xl.interop.official import load_official, to_official
    from transformer_xl.interop.state_dicts import own_tensors
    from transformer_xl.store.files import write_json, write_text
    from transformer_xl.store.layout import CONFIG, VOCAB, WEIGHTS
    from transformer_xl.store.manifest import write_manifest
    from transformer_xl.store.tensors import save_tensors

    out, verify = Path(args.out), not args.no_verify
    if args.src == "hf" and parse_hub_id(args.path) is not None:  # the repository's own files, from the Hub cache
        snapshot = fetch(args.path)
        if snapshot.layout != "hf":
            raise ConfigError(f"{args.path} is a txl model already (config.json with n_token): use it as it is, "
                              "e.g. txl eval/generate or TransformerXLLM.from_pretrained")
        args.path = str(snapshot.path)
    vocab = _import_vocab(args) if args.src else None  # read (and refuse) before writing anything
    if args.src == "official":
        if not args.config:
            raise ConfigError("--from official needs --config KWARGS.json (the MemTransformerLM constructor "
                              "arguments the checkpoint was trained with)")
        model = load_official(args.path, args.config, verify=verify)
    elif args.src == "hf":
        model = from_hf(args.path, verify=verify)
    else:
        # a model, checkpoint or run directory (saying which model of a run it picked)
        model, model_dir = load_model(args.path, verify=verify, note=stderr_note("txl convert"))
        if args.dst == "official":
            kwargs, state = to_official(model)
            save_tensors(own_tensors(state), out / OFFICIAL_STATE)  # tied names too: load_file gets them all
            write_json(out / OFFICIAL_KWARGS, kwargs, sort_keys=False)
            write_manifest(out, [OFFICIAL_STATE, OFFICIAL_KWARGS])
        else:  # transformers' from_pretrained reads config.json and the weights, and ignores the manifest
            state, hf_config = to_hf_state_dict(model), hf_config_dict(model)  # refusals first
            tokenizer = _export_tokenizer(args, model_dir, model.config.n_token)
            save_tensors(state, out / HF_WEIGHTS[0])
            write_json(out / HF_CONFIG, hf_config, sort_keys=False)
            for name, text in tokenizer.items():
                write_text(out / name, text)
            write_manifest(out, [HF_WEIGHTS[0], HF_CONFIG, *tokenizer])
            if tokenizer:
                print(f"wrote TransfoXLTokenizer files ({', '.join(tokenizer)}) to {out}")
        print(f"wrote {args.dst} weights of {model.num_parameters():,} parameters to {out}")
        return 0
    if vocab is not None and len(vocab) != model.config.n_token:
        raise ConfigError(f"the vocabulary has {len(vocab)} symbols but the model has n_token={model.config.n_token}")
    model.save_pretrained(out)
    print(f"wrote txl model ({model.num_parameters():,} parameters) to {out}")
    if vocab is not None:
        vocab.save(out / VOCAB)
        write_manifest(out, [CONFIG, WEIGHTS, VOCAB])  # the manifest covers the vocabulary too
        print(f"wrote vocabulary ({len(vocab):,} symbols) to {out / VOCAB}")
    return 0


def _import_vocab(args: argparse.Namespace):
    """The vocabulary to write next to an imported model: --vocab, or an HF directory's vocab.pkl/bin."""
    from transformer_xl.data import Vocab
    from transformer_xl.data.named_vocab import resolve_vocab
    from transformer_xl.interop.hf_vocab import find_hf_vocab, load_hf_vocab

    path = resolve_vocab(args.vocab)
    if path is None and args.src == "hf" and Path(args.path).is_dir():
        path = find_hf_vocab(args.path)
    if path is None:
        return None
    if path.suffix == ".json":
        return Vocab.load(path)
    return load_hf_vocab(path)


def _export_tokenizer(args: argparse.Namespace, model_dir: Path, n_token: int) -> dict[str, str]:
    """The TransfoXLTokenizer files of the model's vocabulary (--vocab, else the one beside the model), or none,
    said on stderr in one line, when there is no vocabulary or the tokenizer cannot represent it."""
    from transformer_xl.data import Vocab
    from transformer_xl.data.named_vocab import resolve_vocab
    from transformer_xl.errors import CheckpointError
    from transformer_xl.interop.hf_vocab import hf_tokenizer_files, hf_tokenizer_refusal, load_hf_vocab
    from transformer_xl.store.layout import find_vocab

    try:
        path = find_vocab(model_dir, resolve_vocab(args.vocab))
    except CheckpointError:
        print(f"txl convert: no vocabulary beside {model_dir}, so no tokenizer files were written (pass --vocab "
              "PATH for them)", file=sys.stderr)
        return {}
    vocab = Vocab.load(path) if path.suffix == ".json" else load_hf_vocab(path)
    if len(vocab) != n_token:
        raise ConfigError(f"the vocabulary {path} has {len(vocab)} symbols but the model has n_token={n_token}")
    reason = hf_tokenizer_refusal(vocab)
    if reason is not None:
        print(f"txl convert: no tokenizer files were written: {reason}", file=sys.stderr)
        return {}
    return hf_tokenizer_files(vocab)
