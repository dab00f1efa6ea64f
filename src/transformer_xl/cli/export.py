"""``txl export onnx MODEL OUT_DIR``: the model as ONNX graphs that ONNX Runtime runs (needs the ``onnx`` extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
int8 models.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", EXPORT_HELP)
    formats = p.add_subparsers(dest="format", required=True, metavar="{onnx}")
    onnx = add_command(formats, "onnx", ONNX_HELP)
    add_model(onnx, "model_dir", "MODEL_OR_RUN_DIR", "txl " + MODEL_DIRS)
    onnx.add_argument("out_dir", metavar="OUT_DIR", help="the export directory to write (replaced if it exists)")
    onnx.add_argument("--vocab", help="vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)")
    add_no_verify(onnx)
    onnx.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformer_xl.inference.loading import load_model, load_vocab, run_text_options
    from transformer_xl.interop.onnx_export import check_exportable, export_onnx, require_onnx

    require_onnx()
    model, directory = load_model(args.model_dir, verify=not args.no_verify, note=stderr_note("txl export"))
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
    out = export_onnx(model, args.out_dir, vocab=vocab, tokenizer=tokenizer,
                      text={k: v for k, v in text.items() if k == "level"})
    print(f"txl export: wrote {out} (segment.onnx, step.onnx; see {out}/onnx_export.json)", file=sys.stderr)
    return 0
