"""``txl eval``: score a dataset split with a model (see :mod:`transformer_xl.inference.evaluate`); a memory sweep;
the vanilla
window (:mod:`transformer_xl.inference.window`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer_xl.cli.args import (
    MODEL_DIRS,
    add_command,
    add_dataset,
    add_device,
    add_model,
    add_no_verify,
    add_progress,
    add_quantize,
    add_segment_lengths,
    add_split_flags,
    int8_check,
    nonneg_int,
    positive_int,
    stderr_note,
)
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.store.files import write_json, write_text

EVAL_HELP = """evaluate a model on a dataset split (loss, ppl or bpc, tokens/s), with memory

Score every token of a split once, as the official eval.py: the split is cut into --batch-size contiguous streams
read segment by segment with the memory carried over. With B streams the first token of each stream and the N mod B
tail tokens are not scored (--batch-size 1 scores all but the very first token). Lengths default to the model's. A
comma-separated --mem-len sweeps the memory length. --sliding-window L instead scores each token from its own window
of the L previous tokens without memory (the vanilla Transformer evaluation of Al-Rfou et al., stride 1).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "eval", EVAL_HELP, epilog="example (paper enwik8 base eval): txl eval runs/enwik8/best "
                    "--dataset enwik8 --split test --tgt-len 80 --mem-len 2100 --clamp-len 820 --same-length")
    add_model(p, "model", "CHECKPOINT_OR_DIR", MODEL_DIRS)
    add_dataset(p, "dataset name (see `txl data info`) or a user corpus path", splits=("valid", "test", "train"))
    p.add_argument("--level", choices=("word", "char", "byte"), default=None,
                   help="your own text: the unit of a token (default: the run's, else read from the model's "
                   "vocabulary)")
    p.add_argument("--tokenizer", metavar="TOK_JSON", default=None,
                   help="your own text: a Hugging Face tokenizers JSON (default: the run's)")
    add_split_flags(p)
    p.add_argument("--mem-len", default=None,
                   help="memory length, or a comma-separated list to sweep, e.g. 0,128,512,1600 (default: model's)")
    p.add_argument("--ext-len", type=nonneg_int, help="extended context length (default: the model's)")
    add_segment_lengths(p)
    p.add_argument("--batch-size", type=positive_int, default=10, help="evaluation streams (default: 10, as eval.py)")
    p.add_argument("--max-tokens", type=positive_int, help="score only the first N tokens of the split")
    p.add_argument("--sliding-window", type=positive_int, metavar="L",
                   help="vanilla evaluation: each token from its own window of L previous tokens, no memory")
    p.add_argument("--rows", type=positive_int, help="windows per forward with --sliding-window (default: by memory)")
    add_device(p)
    add_progress(p)
    add_no_verify(p)
    add_quantize(p)
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write the results as JSON to PATH")
    p.add_argument("--out", metavar="DIR",
                   help="sweep: write DIR/memory-sweep.json, .md and .png (plot needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformer_xl.cli.args import parse_int_list
    from transformer_xl.data import load_corpus
    from transformer_xl.data.progress import progress_mode
    from transformer_xl.inference.evaluate import EvalResult, describe, evaluate, memory_sweep, replace_settings
    from transformer_xl.inference.loading import load_model, model_ids, run_text_options
    from transformer_xl.inference.window import evaluate_sliding_window

    mem_lens = parse_int_list(args.mem_len, "--mem-len") if args.mem_len is not None else None
    if args.sliding_window is not None and (mem_lens is not None or args.tgt_len is not None):
        raise ConfigError("--sliding-window evaluates without memory or segments: drop --mem-len/--tgt-len")
    if args.sliding_window is not None:
        given = (("--ext-len", args.ext_len), ("--clamp-len", args.clamp_len), ("--same-length", args.same_length),
                 ("--out", args.out))
        ignored = [flag for flag, value in given if value is not None]
        if ignored:
            raise ConfigError(f"{ignored[0]} does not apply to --sliding-window (each token is scored from its own "
                              "window, without memory)")
    given = given_text_options(args)  # a refusal needs no model
    say = stderr_note("txl eval")
    model, directory = load_model(args.model, device=args.device, verify=not args.no_verify, quantize=args.quantize,
                                  note=say)
    if args.quantize == "int8":  # evaluation multiplies batch x segment rows at once: int8 rarely pays there
        int8_check(model, args.batch_size * (args.tgt_len or model.config.tgt_len), say)
    note = shorter_memory_warning(model.config.mem_len, mem_lens)
    if note:
        say(note)
    text = given if given is not None else run_text_options(directory)
    corpus = load_corpus(args.dataset, data_dir=args.data_dir, **text)
    remap = model_ids(model, directory, corpus, args.dataset)
    if args.split not in corpus.splits:
        raise ConfigError(f"{args.dataset} has no {args.split!r} split (has {', '.join(corpus.splits)})")
    data = corpus.splits[args.split]
    if remap is not None:  # the dataset's symbols in the model's vocabulary, which holds them all
        say(f"{args.dataset}'s {len(corpus.vocab):,} symbols read as the model's own ids (its vocabulary of "
            f"{model.config.n_token:,} holds them all, in another order)")
        data = remap[data]
    info = dict(model=str(directory), dataset=args.dataset, split=args.split)
    if args.sliding_window is not None:
        results = [evaluate_sliding_window(model, data, window=args.sliding_window, max_tokens=args.max_tokens,
                                           rows=args.rows, char_level=corpus.char_level, device=args.device)]
    else:
        kw = dict(batch_size=args.batch_size, tgt_len=args.tgt_len, ext_len=args.ext_len, clamp_len=args.clamp_len,
                  same_length=args.same_length, max_tokens=args.max_tokens, char_level=corpus.char_level,
                  device=args.device, progress=progress_mode(args.progress))
        if mem_lens is not None and len(mem_lens) > 1:
            def row(r: EvalResult) -> None:  # each row as soon as its evaluation ends
                print(f"mem_len {r.settings['mem_len']:>5}: " + describe(r), flush=True)

            results = memory_sweep(model, data, mem_lens, on_result=row, **kw)
        else:
            results = [evaluate(model, data, mem_len=mem_lens[0] if mem_lens else None, **kw)]
    results = [replace_settings(r, **info) for r in results]
    if len(results) == 1:
        print(describe(results[0]))
    rows = [r.to_dict() for r in results]
    doc = rows[0] if len(rows) == 1 else {"sweep": rows}
    if args.json_path:
        write_json(args.json_path, doc, sort_keys=False)
    if args.out:
        _write_sweep(rows, Path(args.out), corpus.char_level, f"{directory} on {args.dataset} {args.split}")
    return 0


def _write_sweep(rows: list[dict], out: Path, char_level: bool, title: str) -> None:
    from transformer_xl.experiments.tables import plot_sweep, sweep_table

    if "mem_len" not in rows[0]:
        raise ConfigError("--out writes a memory sweep; it does not apply to --sliding-window")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "memory-sweep.json", rows, sort_keys=False)
    write_text(out / "memory-sweep.md", f"Memory sweep: {title}\n\n" + sweep_table(rows, char_level))
    plot_sweep(rows, out / "memory-sweep.png", char_level=char_level, title=title)
    print(f"wrote {out}/memory-sweep.json, .md, .png")




def shorter_memory_warning(trained: int, asked: list[int] | None) -> str | None:
    """One line when ``asked`` (the ``--mem-len`` values) holds memories shorter than the ``trained`` one: a model
    trained with memory relies on it, and scores worse without it than a model trained without (see
    docs/long-context.md); None otherwise."""
    short = sorted({m for m in asked or [] if m < trained})
    if not short:
        return None
    return (f"warning: --mem-len {','.join(map(str, short))} is shorter than the {trained} this model was trained "
            "with; a model trained with memory relies on it and can score worse than one trained without "
            "(docs/long-context.md)")


def given_text_options(args: argparse.Namespace) -> dict | None:
    """The user-text flags given (``{}`` for a registered dataset, which refuses them in one line); None for your
    own text without any: the model's run decides (:func:`transformer_xl.inference.loading.run_text_options`)."""
    from transformer_xl.data.registry import get_spec
    from transformer_xl.inference.loading import USER_TEXT_FLAGS

    given = {k: getattr(args, k) for k in USER_TEXT_FLAGS if getattr(args, k, None) is not None}
    try:
        get_spec(args.dataset)
    except DataError:
        return given or None
    if given:
        raise ConfigError(f"--{next(iter(given)).replace('_', '-')} applies to your own text only; "
                          f"{args.dataset} is a known dataset prepared by its own rules")
    return {}
