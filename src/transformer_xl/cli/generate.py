"""``txl generate``: sample text from a model directory, using the Transformer-XL memory as the cache."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from transformer_xl.cli.args import (
    MODEL_DIRS,
    add_command,
    add_device,
    add_model,
    add_no_verify,
    add_quantize,
    captured_int8_check,
    clamp_int,
    finite_float,
    int8_check,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    seed_int,
    stderr_note,
)
from transformer_xl.errors import ConfigError, DataError

GENERATE_HELP = """generate text from a txl model directory (incremental decoding with the memory cache)

Generate text after a prompt. The prompt is read in segments of tgt_len, then every new token is one step over the
memories of the last --mem-len positions. The vocabulary is MODEL_DIR/vocab.json (or its parent's), or --vocab. An
empty prompt starts from <eos> (a new line). With --backend onnxruntime, MODEL is an ONNX export (txl export onnx)
run on ONNX Runtime: the same tokens as the PyTorch backend (docs/export.md).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "generate", GENERATE_HELP)
    add_model(p, "model_dir", "MODEL_OR_RUN_DIR", "txl " + MODEL_DIRS)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="prompt text (default: empty, start of a line)")
    src.add_argument("--prompt-file", help="read the prompt from this UTF-8 file ('-' for stdin)")
    p.add_argument("--vocab", help="vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)")
    p.add_argument("--level", choices=["word", "char", "text8", "byte"],
                   help="how to split prompts and join output (default: detected from the vocabulary)")
    p.add_argument("--tokenizer", metavar="TOK_JSON",
                   help="the tokenizers JSON of a model trained with --tokenizer (default: the one its run recorded)")
    p.add_argument("--max-new-tokens", type=positive_int, default=200,
                   help="tokens to generate per sample (default: 200)")
    p.add_argument("--num-samples", type=positive_int, default=1,
                   help="samples generated together as a batch (default: 1)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (no sampling)")
    p.add_argument("--temperature", type=nonneg_float, default=1.0,
                   help="sampling temperature; 0 = greedy (default: 1)")
    p.add_argument("--top-k", type=nonneg_int, default=0,
                   help="sample among the K most likely tokens (default: 0 = all)")
    p.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus sampling mass in (0, 1] (default: 1 = off)")
    p.add_argument("--min-p", type=finite_float, default=0.0,
                   help="sample among tokens at least MIN_P times as likely as the most likely (default: 0 = off)")
    p.add_argument("--repetition-penalty", type=positive_float, default=1.0,
                   help="multiply the log-probability of every token already in the text by this (> 1: less "
                   "likely; greedy too; default: 1 = off)")
    p.add_argument("--no-repeat-ngram-size", type=nonneg_int, default=0, metavar="N",
                   help="never complete an N-gram the text already holds (greedy too; default: 0 = off)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed of sampling (default: 0)")
    p.add_argument("--mem-len", type=nonneg_int, help="memory length while generating (default: the model's mem_len)")
    p.add_argument("--clamp-len", type=clamp_int, help="clamp relative distances (useful with a long --mem-len)")
    p.add_argument("--stop", action="append", default=[], metavar="STRING",
                   help="end a sample when its text contains STRING (cut off); repeatable")
    p.add_argument("--stop-token", action="append", default=[], metavar="SYMBOL",
                   help="end a sample after this vocabulary symbol, e.g. '<eos>'; repeatable")
    p.add_argument("--stream", action="store_true", help="print text as it is produced (one sample)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: ids, symbols and log-probs per sample (with --stream: one JSON line per token)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--captured", action="store_true", default=None,
                     help="always decode with the captured (compiled) one-token step: the same tokens, faster per "
                     "token after a one-off compilation; with --quantize int8 its int8 weights and a bf16 key/value "
                     "cache (default: the captured step when the tokens to generate repay its compilation, "
                     "docs/generation.md)")
    cap.add_argument("--no-captured", dest="captured", action="store_false",
                     help="always decode with the plain step (no compilation)")
    p.add_argument("--backend", choices=["torch", "onnxruntime"], default="torch",
                   help="torch: the PyTorch model (default); onnxruntime: MODEL is an ONNX export directory (txl "
                   "export onnx), run on ONNX Runtime on the CPU (needs the onnx extra)")
    add_device(p)
    add_no_verify(p)
    add_quantize(p)
    p.set_defaults(func=run)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is None:
        return args.prompt
    try:
        if args.prompt_file == "-":
            return sys.stdin.read()
        return Path(args.prompt_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read prompt file {args.prompt_file}: {exc}") from None


def _captured(args: argparse.Namespace, int8: bool) -> Any:
    """``captured=`` of the generation: None (the library's choice), False, or the options the library builds its
    decoder with (with int8 weights: a bf16 key/value ring too, the configuration ``txl bench generate`` measures)."""
    if not args.captured:
        return args.captured
    from transformer_xl.inference.captured import CaptureOptions

    return CaptureOptions(int8=True, kv_dtype="bfloat16") if int8 else CaptureOptions()


def run(args: argparse.Namespace) -> int:
    from transformer_xl.data.codec import PromptWarning
    from transformer_xl.inference.loading import load_codec, load_model
    from transformer_xl.inference.sampling import Penalties, check_sampling
    from transformer_xl.inference.text import stream_text

    check_sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, min_p=args.min_p)
    Penalties(args.repetition_penalty, args.no_repeat_ngram_size)  # checked before the model loads
    if args.stream and args.num_samples > 1 and not args.json:
        raise ConfigError("--stream prints one sample as it is produced; use --num-samples 1, or --json for "
                          "JSON lines of several samples")
    if args.tokenizer is not None and args.level is not None:
        raise ConfigError("--level and --tokenizer exclude each other: a tokenizer model's text is subwords")
    prompt = _read_prompt(args)
    int8 = bool(args.captured) and args.quantize == "int8"  # the captured step packs its own int8 weights
    if args.backend == "onnxruntime":
        model, vocab, codec = _onnx_model(args)
    else:
        model, directory = load_model(args.model_dir, device=args.device, verify=not args.no_verify,
                                      quantize=None if int8 else args.quantize, note=stderr_note("txl generate"))
        if args.quantize == "int8" and not int8:  # the plain step's int8 kernel, num_samples rows a product
            int8_check(model, args.num_samples, stderr_note("txl generate"))
        elif int8:  # the captured step's int8 products
            captured_int8_check(model, args.num_samples, stderr_note("txl generate"))
        vocab, codec = load_codec(directory, args.vocab, level=args.level, tokenizer=args.tokenizer)
    if len(vocab) != model.config.n_token:
        raise ConfigError(f"the vocabulary has {len(vocab)} symbols but the model predicts {model.config.n_token}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PromptWarning)
        codec.encode(prompt)  # report what the prompt loses once, before generating
    for w in caught:
        print(f"txl generate: warning: {w.message}", file=sys.stderr)
    results: list = []
    pieces = stream_text(model, codec, prompt, num_samples=args.num_samples, stop_strings=args.stop,
                         stop_tokens=args.stop_token, results=results, max_new_tokens=args.max_new_tokens,
                         do_sample=not args.greedy, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                         no_repeat_ngram_size=args.no_repeat_ngram_size, seed=args.seed, mem_len=args.mem_len,
                         clamp_len=args.clamp_len, captured=_captured(args, int8),
                         note=stderr_note("txl generate"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptWarning)
        if args.stream:
            if not args.json:
                sys.stdout.write(prompt)
            for piece in pieces:
                if args.json:
                    print(json.dumps({"sample": piece.sample, "step": piece.step, "id": piece.token_id,
                                      "log_prob": piece.log_prob, "text": piece.text}, ensure_ascii=False),
                          flush=True)
                else:
                    sys.stdout.write(piece.text)
                    sys.stdout.flush()
            if not args.json:
                sys.stdout.write("\n")
        else:
            for _ in pieces:
                pass
    if args.json:
        doc = {"prompt": prompt, "prompt_ids": _quiet_encode(codec, prompt), "level": codec.level,
               "samples": [{"text": s.text, "token_ids": s.token_ids, "tokens": vocab.decode(s.token_ids),
                            "log_probs": s.log_probs, "finish_reason": s.finish_reason} for s in results]}
        print(json.dumps(doc, ensure_ascii=False))
    elif not args.stream:
        for i, s in enumerate(results):
            if args.num_samples > 1:
                print(f"===== sample {i + 1} =====")
            print(prompt + s.text)
    return 0


def _onnx_model(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The export behind ``--backend onnxruntime``, its vocabulary and codec (the text options it recorded)."""
    from transformer_xl.inference.loading import load_codec
    from transformer_xl.interop.onnx_runtime import OnnxRuntimeLM

    for flag, value in (("--captured", args.captured), ("--quantize", args.quantize),
                        ("--device", args.device != "cpu")):
        if value:
            raise ConfigError(f"{flag} applies to the torch backend; --backend onnxruntime runs the exported "
                              "float graphs on the CPU")
    model = OnnxRuntimeLM(args.model_dir, verify=not args.no_verify, threads=args.threads)
    text = model.info.get("text") or {}
    level, tokenizer = args.level, args.tokenizer
    if level is None and tokenizer is None:
        level = text.get("level")
        tokenizer = str(model.directory / text["tokenizer"]) if text.get("tokenizer") else None
    vocab, codec = load_codec(model.directory, args.vocab, level=level, tokenizer=tokenizer)
    return model, vocab, codec


def _quiet_encode(codec, prompt: str) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return codec.encode(prompt)
