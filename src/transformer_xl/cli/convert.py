"""``txl convert``: official / Hugging Face checkpoints to and from transformer_xl model directories."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformer_xl.cli.args import add_command, add_model, add_no_verify, stderr_note
from transformer_xl.errors import ConfigError

#: The datasets of the paper's released TensorFlow models (``--from tf --preset``).
RELEASED_NAMES = ("enwik8", "text8", "wt103", "lm1b")
#: The files of an official export (``--to official``): the state dict and the constructor kwargs.
OFFICIAL_STATE, OFFICIAL_KWARGS = "official_state.safetensors", "official_kwargs.json"
#: What the manifest of an output directory says wrote it (:mod:`transformer_xl.store.outputs`).
OUTPUT = "txl convert"


CONVERT_HELP = """convert official or Hugging Face TransfoXL weights to a txl model directory (or back)

Import: --from official CKPT --config KWARGS.json, --from hf HF_DIR, or --from tf SRC (a TensorFlow checkpoint of the
official code, read without TensorFlow: a prefix model.ckpt-N, its model/ directory, or a released model's directory
holding data/ and model/). Export: --to official|hf MODEL_DIR. Files
are read without unpickling code. Every output directory gets a MANIFEST.json (SHA-256 of its files), checked when
txl reads it back. --out must be new, empty or an earlier txl convert output (replaced whole); anything else (files
txl convert did not write, the input or a directory holding it) is refused unless --force, which moves the old one
aside to OUT.old-N (nothing is deleted).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "convert", CONVERT_HELP)
    add_model(p, "path", "path", "checkpoint file (official), HF model directory, or txl model / checkpoint / run "
              "directory (--to); with --from hf or --to")
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from", dest="src", choices=["official", "hf", "tf"], help="import from this format")
    direction.add_argument("--to", dest="dst", choices=["official", "hf"], help="export a txl model to it")
    p.add_argument("--config", help="official MemTransformerLM constructor kwargs as JSON (with --from official)")
    p.add_argument("--preset", choices=sorted(RELEASED_NAMES),
                   help="with --from tf: the released model's dataset, whose evaluation settings the model gets "
                   "(default: the dataset data/corpus-info.json names; none: tgt_len = mem_len = 128)")
    p.add_argument("--out", required=True, help="output directory: new, empty or an earlier txl convert output")
    p.add_argument("--force", action="store_true", help="write --out even when it holds what txl convert did not "
                   "write (or the input): the old one is moved aside to OUT.old-N, not deleted")
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
    from transformer_xl.interop.hf import from_hf
    from transformer_xl.interop.hub import fetch, parse_hub_id
    from transformer_xl.interop.official import load_official
    from transformer_xl.store.layout import CONFIG, VOCAB, WEIGHTS
    from transformer_xl.store.outputs import write_output_manifest

    if args.src == "hf" and parse_hub_id(args.path) is not None:  # the repository's own files, from the Hub cache
        snapshot = fetch(args.path)
        if snapshot.layout != "hf":
            raise ConfigError(f"{args.path} is a txl model already (config.json with n_token): use it as it is, "
                              "e.g. txl eval/generate or TransformerXLLM.from_pretrained")
        args.path = str(snapshot.path)
    inputs = [p for p in (args.path, args.config, args.vocab) if p]  # --out may not be, nor hold, one of these
    if args.preset and args.src != "tf":
        raise ConfigError("--preset applies to --from tf (the released TensorFlow models)")
    if args.src == "tf":
        return _convert_tf(args, inputs)
    vocab = _import_vocab(args) if args.src else None  # read (and refuse) before writing anything
    if args.src == "official":
        if not args.config:
            raise ConfigError("--from official needs --config KWARGS.json (the MemTransformerLM constructor "
                              "arguments the checkpoint was trained with)")
        model = load_official(args.path, args.config, verify=not args.no_verify)
    elif args.src == "hf":
        model = from_hf(args.path, verify=not args.no_verify)
    else:
        # a model, checkpoint or run directory (saying which model of a run it picked)
        model, model_dir = load_model(args.path, verify=not args.no_verify, note=stderr_note("txl convert"))
        with _output(args, [*inputs, model_dir], [model_dir]) as tmp:
            files, tokenizer = _exported_files(args, model, model_dir)
            for name, write in files.items():
                write(tmp / name)
            write_output_manifest(tmp, OUTPUT, files)
        if tokenizer:
            print(f"wrote TransfoXLTokenizer files ({', '.join(tokenizer)}) to {args.out}")
        print(f"wrote {args.dst} weights of {model.num_parameters():,} parameters to {args.out}")
        return 0
    if vocab is not None and len(vocab) != model.config.n_token:
        raise ConfigError(f"the vocabulary has {len(vocab)} symbols but the model has n_token={model.config.n_token}")
    with _output(args, inputs, []) as tmp:
        model.save_pretrained(tmp, vocab=vocab)
        write_output_manifest(tmp, OUTPUT, [CONFIG, WEIGHTS, *([VOCAB] if vocab is not None else [])])
    print(f"wrote txl model ({model.num_parameters():,} parameters) to {args.out}")
    if vocab is not None:
        print(f"wrote vocabulary ({len(vocab):,} symbols) to {Path(args.out) / VOCAB}")
    return 0


def _convert_tf(args: argparse.Namespace, inputs: list[Any]) -> int:
    """``--from tf``: every refusal before anything is written (:func:`transformer_xl.interop.tf.open_tf`), then the
    weights one variable at a time."""
    from transformer_xl.interop.tf import open_tf, state_dict
    from transformer_xl.store.layout import CONFIG, VOCAB, WEIGHTS, save_model_dir
    from transformer_xl.store.outputs import write_output_manifest

    ckpt, vocab, dataset = open_tf(args.path, preset=args.preset, vocab=_import_vocab(args) if args.vocab else None)
    cfg = ckpt.config
    state = state_dict(ckpt)
    with _output(args, [*inputs, ckpt.bundle.prefix.parent], []) as tmp:
        save_model_dir(tmp, state, cfg.to_json(), vocab.to_json() if vocab is not None else None)
        write_output_manifest(tmp, OUTPUT, [CONFIG, WEIGHTS, *([VOCAB] if vocab is not None else [])])
    print(f"wrote txl model ({cfg.parameter_count():,} parameters: {cfg.n_layer} layers, d_model {cfg.d_model}, "
          f"{cfg.n_head} heads of {cfg.d_head}, d_inner {cfg.d_inner}, n_token {cfg.n_token}, div_val {cfg.div_val}, "
          f"cutoffs {list(cfg.cutoffs)}, untie_r {cfg.untie_r}{'' if ckpt.proj_same_dim else ', proj_same_dim False'}) "
          f"from {ckpt.bundle.prefix} to {args.out}")
    print(f"settings{' of the paper (' + dataset + ')' if dataset else ''}: tgt_len {cfg.tgt_len}, mem_len "
          f"{cfg.mem_len}, clamp_len {cfg.clamp_len}, same_length {cfg.same_length}; TF's LayerNorm epsilon 1e-12 and "
          f"memory (tf_memory); {len(ckpt.ignored)} variables that are not the model's left out")
    if dataset is None:
        stderr_note("txl convert")(f"no released dataset named (data/corpus-info.json or --preset), so the model has "
                                   f"generic lengths; give --preset {{{','.join(RELEASED_NAMES)}}} for a released "
                                   "model's evaluation settings")
    if vocab is not None:
        print(f"wrote vocabulary ({len(vocab):,} symbols) to {Path(args.out) / VOCAB}")
    return 0


@contextlib.contextmanager
def _output(args: argparse.Namespace, protect: list[Any], sealed: list[Any]) -> Iterator[Path]:
    """The temporary directory that becomes ``--out`` as a whole, once claimed (:mod:`transformer_xl.store.outputs`):
    new, empty or an earlier output of txl convert, else refused unless ``--force`` (the old one moved aside)."""
    from transformer_xl.store.files import atomic_dir
    from transformer_xl.store.outputs import claim_output_dir

    with claim_output_dir(args.out, OUTPUT, force=args.force, protect=protect, sealed=sealed,
                          note=stderr_note("txl convert")) as target, atomic_dir(target) as tmp:
        yield tmp


def _exported_files(args: argparse.Namespace, model: Any,
                    model_dir: Path) -> tuple[dict[str, Callable[[Path], Any]], list[str]]:
    """File name -> its writer, for ``--to official`` or ``--to hf`` of ``model`` (everything refusable refused
    first), and the names of the tokenizer's files among them."""
    from transformer_xl.interop.hf import HF_CONFIG, HF_WEIGHTS, hf_config_dict, to_hf_state_dict
    from transformer_xl.interop.official import to_official
    from transformer_xl.interop.state_dicts import own_tensors
    from transformer_xl.store.files import write_json, write_text
    from transformer_xl.store.tensors import save_tensors

    if args.dst == "official":
        kwargs, state = to_official(model)
        # tied names too: load_file gets them all
        return {OFFICIAL_STATE: lambda p: save_tensors(own_tensors(state), p),
                OFFICIAL_KWARGS: lambda p: write_json(p, kwargs, sort_keys=False)}, []
    # transformers' from_pretrained reads config.json and the weights, and ignores the manifest
    state, hf_config = to_hf_state_dict(model), hf_config_dict(model)
    tokenizer = _export_tokenizer(args, model_dir, model.config.n_token)
    files: dict[str, Callable[[Path], Any]] = {HF_WEIGHTS[0]: lambda p: save_tensors(state, p),
                                               HF_CONFIG: lambda p: write_json(p, hf_config, sort_keys=False)}
    for name, text in tokenizer.items():
        files[name] = lambda p, text=text: write_text(p, text)
    return files, list(tokenizer)


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
