"""``txl score``: the log-probability of every token of each line or document of a text
(:mod:`transformer_xl.inference.score`), as JSON lines or one TSV row per token."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from transformer_xl.cli.args import (
    MODEL_DIRS,
    add_command,
    add_device,
    add_model,
    add_no_verify,
    add_progress,
    add_segment_lengths,
    nonneg_int,
    positive_int,
    stderr_note,
)
from transformer_xl.errors import ConfigError, DataError

SCORE_HELP = """score your own text: the log-probability of every token of each line (or document)

Each line of FILE (or of standard input: - or nothing) is one record; with --documents, each run of lines between
blank lines is. The text starts from the start-of-line symbol the model was trained with (<eos> where the vocabulary
has one) and every token after it is scored, its line-end symbol included, reading the text segment by segment with
the memory of the previous --mem-len positions. --memory carry (default) reads the lines of a document (the whole
text without --documents) as one stream, each with the memory of those before it: the scores txl eval --batch-size 1
gives the same text; --memory reset scores each line alone. Output: JSON lines (text, tokens, log_probs in nats,
surprisal_bits, n_tokens, total_log_prob, ppl or bpc for character and byte models), or --format tsv, one row per
token.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "score", SCORE_HELP, epilog="example: txl score runs/wt2 sentences.txt --format tsv")
    add_model(p, "model", "MODEL_OR_RUN_DIR", MODEL_DIRS)
    p.add_argument("file", nargs="?", default="-", metavar="FILE",
                   help="UTF-8 text to score, '-' for standard input (default)")
    p.add_argument("--documents", action="store_true",
                   help="one record per document (lines separated by blank lines) instead of per line")
    p.add_argument("--memory", choices=("carry", "reset"), default="carry",
                   help="carry: the lines of a document read with the memory of those before (default); reset: "
                   "each line alone")
    p.add_argument("--format", choices=("jsonl", "tsv"), default="jsonl",
                   help="jsonl: one JSON object per line/document (default); tsv: one row per token")
    p.add_argument("--mem-len", type=nonneg_int, help="memory length (default: the model's)")
    add_segment_lengths(p)
    p.add_argument("--batch-size", type=positive_int, default=16,
                   help="streams scored side by side (padded and masked; the same scores as one at a time) "
                   "(default: 16)")
    p.add_argument("--vocab", help="vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)")
    p.add_argument("--level", choices=("word", "char", "text8", "byte"),
                   help="how a line becomes tokens (default: the run's, else read from the vocabulary)")
    p.add_argument("--tokenizer", metavar="TOK_JSON",
                   help="the tokenizers JSON of a model trained with --tokenizer (default: the one its run recorded)")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict",
                   help="bytes that are not UTF-8: strict refuses the file (default), replace reads them as U+FFFD")
    add_device(p)
    add_progress(p)
    add_no_verify(p)
    p.set_defaults(func=run)


def read_text(source: str, errors: str = "strict") -> str:
    """The text of ``source`` (``-``: standard input) as UTF-8; a one-line :class:`DataError` for a missing file or,
    with ``errors="strict"``, bytes that are not UTF-8."""
    from transformer_xl.data.rawtext import decode_utf8

    name = "standard input" if source == "-" else source
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {name}: {exc.strerror or exc}") from None
    # equivalent mutants: score_text reads "\r\n" and "\r" as line ends itself
    return decode_utf8(data, name, errors=errors).replace("\r\n", "\n").replace("\r", "\n")  # pragma: no mutate


def write_tsv(records: list, out: TextIO, unit: str) -> None:
    """One row per token: the record's number (from 1), the token's position in it, the token, its log-probability
    (nats) and surprisal (bits); tabs, newlines and backslashes in a token are escaped."""
    out.write(f"{unit}\tposition\ttoken\tlog_prob\tsurprisal_bits\n")
    for n, rec in enumerate(records, 1):
        for i, (tok, lp, bits) in enumerate(zip(rec.tokens, rec.log_probs, rec.surprisal_bits)):
            tok = tok.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            out.write(f"{n}\t{i}\t{tok}\t{lp!r}\t{bits!r}\n")


def run(args: argparse.Namespace) -> int:
    from transformer_xl.data.progress import progress_mode
    from transformer_xl.inference.lines import LineEncoder
    from transformer_xl.inference.loading import load_model
    from transformer_xl.inference.score import score_text

    if args.tokenizer is not None and args.level is not None:
        raise ConfigError("--level and --tokenizer exclude each other: a tokenizer model's text is subwords")
    text = read_text(args.file, args.errors)  # a bad or empty file is refused before the model loads
    if not text.strip():
        raise DataError(f"nothing to score: {'standard input' if args.file == '-' else args.file} is empty")
    model, directory = load_model(args.model, device=args.device, verify=not args.no_verify,
                                  note=stderr_note("txl score"))
    encoder = LineEncoder.for_model(directory, vocab=args.vocab, level=args.level, tokenizer=args.tokenizer)
    if len(encoder.vocab) != model.config.n_token:
        raise ConfigError(f"the vocabulary has {len(encoder.vocab)} symbols but the model predicts "
                          f"{model.config.n_token}")
    records = score_text(model, encoder, text, documents=args.documents, memory=args.memory,
                         batch_size=args.batch_size, tgt_len=args.tgt_len, mem_len=args.mem_len,
                         clamp_len=args.clamp_len, same_length=args.same_length,
                         progress=progress_mode(args.progress), desc="txl score")
    if encoder.unknown:
        stderr_note("txl score")(f"warning: {encoder.unknown} tokens are not in the vocabulary and were scored "
                                 f"as {encoder.vocab.unk}")
    if args.format == "tsv":
        write_tsv(records, sys.stdout, "document" if args.documents else "line")
    else:
        for rec in records:
            sys.stdout.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
    sys.stdout.flush()
    return 0
