"""``txl export onnx MODEL OUT_DIR``: the model as ONNX graphs that ONNX Runtime runs (needs the ``onnx`` extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from transformer_xl.cli.args import MODEL_DIRS, add_command, add_model, add_no_verify, stderr_note
from transformer_xl.errors import CheckpointError, ConfigError

EXPORT_HELP = """export a model to another runtime's format (onnx)

txl export onnx MODEL OUT_DIR writes the segment forward and the one-token step as ONNX graphs, with the memories
as inputs and outputs, beside the model's config and vocabulary: txl generate OUT_DIR --backend onnxruntime
generates from it (docs/export.md).
"""

ONNX_HELP = """export the segment forward and the one-token step to ONNX (torch.onnx, dynamo exporter)

Writes OUT_DIR/segment.onnx and step.onnx (inputs input_ids, mem_0..mem_L; outputs log_probs, new_mem_0..new_mem_L),
onnx_export.json (opset, names, types, dynamic axes), config.json, vocab.json (and tokenizer.json) and MANIFEST.json,
whole or not at all. Both graphs pass onnx.checker. Refused: sampled softmax, same_length, attn_type other than 0,
int8 models. OUT_DIR must be new, empty or an earlier export; anything else (files txl export did not write, the model's
own directory or one holding it, a directory inside the model's) is refused unless --force, which moves the old OUT_DIR
aside to OUT_DIR.old-N (nothing is deleted).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", EXPORT_HELP)
    formats = p.add_subparsers(dest="format", required=True, metavar="{onnx}")
    onnx = add_command(formats, "onnx", ONNX_HELP)
    add_model(onnx, "model_dir", "MODEL_OR_RUN_DIR", "txl " + MODEL_DIRS)
    onnx.add_argument("out_dir", metavar="OUT_DIR", help="the export directory to write: new, empty or an earlier "
                      "export (which is replaced)")
    onnx.add_argument("--vocab", help="vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)")
    onnx.add_argument("--force", action="store_true", help="write OUT_DIR even when it holds what txl export did not "
                      "write (or the model): the old one is moved aside to OUT_DIR.old-N, not deleted")
    add_no_verify(onnx)
    onnx.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformer_xl.inference.loading import load_model
    from transformer_xl.interop.onnx_export import OUTPUT, require_onnx
    from transformer_xl.store.outputs import claim_output_dir

    require_onnx()
    note = stderr_note("txl export")
    model, directory = load_model(args.model_dir, verify=not args.no_verify, note=note)
    # refused before anything is exported: the model's own directory, one holding it or inside it, the user's files
    with claim_output_dir(args.out_dir, OUTPUT, force=args.force, note=note, sealed=[directory],
                          protect=[args.model_dir, directory, *([args.vocab] if args.vocab else [])]) as target:
        _export(args, model, directory, target)
    out = Path(args.out_dir)
    print(f"txl export: wrote {out} (segment.onnx, step.onnx; see {out}/onnx_export.json)", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace, model: Any, directory: Path, target: Path) -> Path:
    """Export ``model`` (loaded from ``directory``) with its vocabulary and text options to ``target`` (the
    directory that becomes ``args.out_dir``)."""
    from transformer_xl.inference.loading import load_vocab, run_text_options
    from transformer_xl.interop.onnx_export import check_exportable, export_onnx

    check_exportable(model)
    try:
        vocab = load_vocab(directory, args.vocab)
    except CheckpointError:
        if args.vocab is not None:
            raise
        vocab = None
        print("txl export: warning: no vocabulary beside the model; generating from the export needs --vocab",
              file=sys.stderr)
    text = run_text_options(directory)
    tokenizer = text.pop("tokenizer", None)
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise ConfigError(f"the model's tokenizer {tokenizer} (recorded by its run) is not found")
    if vocab is not None and tokenizer is None and "level" not in text:
        from transformer_xl.data.codec import detect_level

        text["level"] = detect_level(vocab)
    return export_onnx(model, target, vocab=vocab, tokenizer=tokenizer,
                       text={k: v for k, v in text.items() if k == "level"})
