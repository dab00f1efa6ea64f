"""``txl score``: the log-probability of every token of each line or document of a text
(:mod:`transformer_xl.inference.score`), as JSON lines or one TSV row per token."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TextIO

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
from transformer_xl.inference.streaming import BYTES_PER_TOKEN, DEFAULT_MAX_DOCUMENT_TOKENS

if TYPE_CHECKING:
    from transformer_xl.inference.score import ScoredText
    from transformer_xl.model import TXLConfig

SCORE_HELP = """score your own text: the log-probability of every token of each line (or document)

Each line of FILE (or of standard input: - or nothing) is one record; with --documents, each run of lines between
blank lines is. The text starts from the start-of-line symbol the model was trained with (<eos> where the vocabulary
has one) and every token after it is scored, its line-end symbol included, reading the text segment by segment with
the memory of the previous --mem-len positions. --memory carry (default) reads the lines of a document (the whole
text without --documents) as one stream, each with the memory of those before it: the scores txl eval --batch-size 1
gives the same text; --memory reset scores each line alone. Output: JSON lines (text, tokens, log_probs in nats,
surprisal_bits, n_tokens, total_log_prob, ppl or bpc for character and byte models), or --format tsv, one row per
token.

The input is read as it comes and each record is written once it is scored (a pipe's records as soon as the next
line is slow to come; without --documents and with --memory carry, once the segment holding the line's end is
read), in the memory of one record at a time: a record of more than --max-document-tokens tokens, or a line of more
than 16 bytes per token of that limit, is refused when it is read.
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
    p.add_argument("--max-document-tokens", type=positive_int, default=DEFAULT_MAX_DOCUMENT_TOKENS, metavar="N",
                   help="the most tokens one record (a line; with --documents, a document) may have; a line may have "
                   f"{BYTES_PER_TOKEN} bytes per token of it (default: {DEFAULT_MAX_DOCUMENT_TOKENS:,})")
    add_device(p)
    add_progress(p)
    add_no_verify(p)
    p.set_defaults(func=run)


def write_tsv(records: Iterable[ScoredText], out: TextIO, unit: str, *, first: int = 1, header: bool = True) -> None:
    """One row per token: the record's number (from ``first``), the token's position in it, the token, its
    log-probability (nats) and surprisal (bits), under a header row unless told not to; tabs, newlines and
    backslashes in a token are escaped."""
    if header:
        out.write(f"{unit}\tposition\ttoken\tlog_prob\tsurprisal_bits\n")
    for n, rec in enumerate(records, first):
        for i, (tok, lp, bits) in enumerate(zip(rec.tokens, rec.log_probs, rec.surprisal_bits)):
            tok = tok.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            out.write(f"{n}\t{i}\t{tok}\t{lp!r}\t{bits!r}\n")


def run(args: argparse.Namespace) -> int:
    from transformer_xl.data.progress import Progress, progress_mode
    from transformer_xl.inference.budget import check_scoring
    from transformer_xl.inference.lines import LineEncoder
    from transformer_xl.inference.loading import load_model
    from transformer_xl.inference.reading import open_lines
    from transformer_xl.inference.streaming import score_stream

    if args.tokenizer is not None and args.level is not None:
        raise ConfigError("--level and --tokenizer exclude each other: a tokenizer model's text is subwords")
    limit = args.max_document_tokens
    with open_lines(args.file, max_bytes=BYTES_PER_TOKEN * limit, errors=args.errors) as reader:
        if not reader.has_text():  # a bad or empty input is refused before the model loads
            raise DataError(f"nothing to score: {reader.name} is empty")

        def fits(config: TXLConfig) -> None:  # the lengths against the machine, before the model is built
            check_scoring(config, rows=1, positions=1, device=args.device, tgt_len=args.tgt_len,
                          mem_len=args.mem_len, weights=True)

        model, directory = load_model(args.model, device=args.device, verify=not args.no_verify,
                                      note=stderr_note("txl score"), fits=fits)
        encoder = LineEncoder.for_model(directory, vocab=args.vocab, level=args.level, tokenizer=args.tokenizer)
        if len(encoder.vocab) != model.config.n_token:
            raise ConfigError(f"the vocabulary has {len(encoder.vocab)} symbols but the model predicts "
                              f"{model.config.n_token}")
        records = score_stream(model, encoder, reader, documents=args.documents, memory=args.memory,
                               batch_size=args.batch_size, max_document_tokens=limit, waiting=reader.waiting,
                               name=reader.name, tgt_len=args.tgt_len, mem_len=args.mem_len,
                               clamp_len=args.clamp_len, same_length=args.same_length)
        # over the input's bytes: every 10 % of a file, every MiB of a pipe (whose size is unknown)
        with Progress(reader.size, desc="txl score", unit="B", rate_unit="tok", mode=progress_mode(args.progress),
                      min_seconds=2.0, every=None if reader.size else 1 << 20) as bar:
            tokens = [0]  # scored since the bar last moved: the bar counts the input's bytes, its rate tokens

            def progress(rec: ScoredText) -> None:
                tokens[0] += rec.n_tokens
                if reader.consumed > bar.n:
                    bar.update(reader.consumed - bar.n, amount=tokens[0])
                    tokens[0] = 0

            write_records(records, sys.stdout, args.format, "document" if args.documents else "line",
                          progress=progress, waiting=reader.waiting)
    if encoder.unknown:
        stderr_note("txl score")(f"warning: {encoder.unknown} tokens are not in the vocabulary and were scored "
                                 f"as {encoder.vocab.unk}")
    return 0


def write_records(records: Iterable[ScoredText], out: TextIO, form: str, unit: str, *,
                  progress: Callable[[ScoredText], None] | None = None,
                  waiting: Callable[[], bool] | None = None) -> None:
    """Write each record as it comes (``form``: ``jsonl``, or ``tsv`` under a header naming ``unit``), flushing
    ``out`` whenever the input is ``waiting`` (the reader of a pipe sees the records so far) and at the end."""
    for n, rec in enumerate(records, 1):
        if form == "tsv":
            write_tsv([rec], out, unit, first=n, header=n == 1)
        else:
            out.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
        if progress is not None:
            progress(rec)
        if waiting is not None and waiting():
            out.flush()
    out.flush()
