"""``txl bench``: throughput of txl against Hugging Face TransfoXL, measured in the same run
(see :mod:`transformer_xl.experiments.bench`)."""

from __future__ import annotations

import argparse
import shlex
import sys

from transformer_xl.cli.args import add_command, add_device, add_report_outputs, parse_int_list, positive_int
from transformer_xl.errors import ConfigError
from transformer_xl.store.files import write_json

BENCH_HELP = """benchmark training/evaluation throughput against Hugging Face TransfoXL

Times txl and (if installed) Hugging Face TransfoXL side by side, alternating rounds, and prints txl/HF ratios.
Cases: char, char-mid, word, wt2-cpu (CPU), enwik8-base, wt103-base (GPU).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "bench", BENCH_HELP)
    p.add_argument("--cases", default="char,word",
                   help="comma-separated cases: char, char-mid, word, wt2-cpu, enwik8-base, wt103-base "
                   "(default: char,word)")
    p.add_argument("--eval-mem-lens", default="128,512,1600",
                   help="evaluation memory lengths (default: 128,512,1600; none: time training only)")
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps per round (default: 3)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="alternating rounds; ratio = their median (default: 5)")
    add_device(p)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 = autocast on both sides")
    p.add_argument("--compile", action="store_true", help="torch.compile txl's model (HF stays eager)")
    p.add_argument("--variants", action="store_true",
                   help="also time txl eager/compiled x fp32/bf16 in the same run (MFU against each precision's peak)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="override the cases' batch size")
    p.add_argument("--no-hf", action="store_true", help="time txl only")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--recompute", action="store_true",
                   help="also time and measure txl training with recomputed attention (less memory)")
    p.add_argument("--skeleton", action="store_true",
                   help="also time the GEMM skeleton of each eager txl training step: its matrix products alone, "
                   "back to back (what bounds the step)")
    p.add_argument("--profile", choices=["txl", "hf"], default=None,
                   help="print a torch.profiler table of training steps of the first case instead (with "
                   "--compile: of the compiled model, after its compilation)")
    add_report_outputs(p)
    p.set_defaults(func=run)
    from transformer_xl.cli.experiment import add_eval_speed

    kinds = p.add_subparsers(dest="bench_kind", metavar="{eval-speed,generate,decode}",
                             help="eval-speed: Transformer-XL vs the vanilla sliding window (paper Table 9); "
                             "generate: generation tokens/s vs Hugging Face and the read-rate limit; "
                             "decode: where the captured decode step's time goes on this CPU (a report to send)")
    add_eval_speed(kinds, "eval-speed")
    add_generate(kinds)
    add_decode(kinds)


BENCH_DECODE_HELP = """where the captured decode step's time goes on this machine (a profile to send with a report)

Times one captured step of a random-weight model of a paper shape and its parts, each in the form the step runs it:
every matrix family over all layers, the softmax's matrix, the attention over the memory, the log-softmax, the
input embedding, what is beyond them and the decoder's wrapper; each with the bytes it reads and its rate as a share
of the read rate measured in the same process; with the CPU's model, vendor, flags and caches, the threads, and the
form each choice took (transformer_xl.experiments.bench.decode_profile). --products all measures every form that
runs here, one after the other.
"""


def add_decode(kinds: argparse._SubParsersAction) -> None:
    d = add_command(kinds, "decode", BENCH_DECODE_HELP)
    d.add_argument("--shape", default="wt103-base", choices=["wt103-base", "enwik8-base", "tiny"],
                   help="model shape (random weights; tiny: 2 layers, d_model 64, for a quick check) "
                   "(default: wt103-base)")
    d.add_argument("--mem-len", type=positive_int, default=640, help="memory length, full (default: 640)")
    d.add_argument("--batch", type=positive_int, default=1, help="rows decoded at once (default: 1)")
    d.add_argument("--int8", action="store_true", help="int8 weights (with a bfloat16 ring unless --kv-dtype)")
    d.add_argument("--kv-dtype", choices=["float32", "bfloat16"], default=None,
                   help="the key/value ring (default: float32; bfloat16 with --int8)")
    d.add_argument("--products", default="auto",
                   help="the matrix products' form: auto (the rule for this CPU), native (txl's kernels), compiled "
                   "(inductor's reductions), or all (every form that runs here) (default: auto)")
    d.add_argument("--steps", type=positive_int, default=20, help="timed calls per figure, best kept (default: 20)")
    d.add_argument("--profile", action="store_true", help="accepted for symmetry with `txl bench --profile`: "
                   "this command always profiles")
    add_report_outputs(d)
    d.set_defaults(func=run_decode)


def run_decode(args: argparse.Namespace) -> int:
    from transformer_xl.experiments.bench.decode_profile import profile_decode, profile_markdown
    from transformer_xl.experiments.bench.generate import shape_config
    from transformer_xl.model import TXLConfig, native

    if args.products not in ("auto", "all", "native", "compiled"):
        raise ConfigError(f"unknown --products {args.products!r}; known: auto, native, compiled, all")
    if args.products == "all":
        forms = ["compiled"] + ([] if native.unavailable() else ["native"])
    else:
        forms = [None if args.products == "auto" else args.products]
    config = TXLConfig(n_token=1000, n_layer=2, n_head=4, d_model=64, d_head=16, d_inner=256, mem_len=args.mem_len,
                       tgt_len=16, cutoffs=(200,)) if args.shape == "tiny" else shape_config(args.shape)
    kv = args.kv_dtype or ("bfloat16" if args.int8 else "float32")
    command = _command()
    reports = []
    for form in forms:
        report = profile_decode(config, shape=args.shape, mem_len=args.mem_len, batch=args.batch, int8=args.int8,
                                kv_dtype=kv, products=form, steps=args.steps,
                                log=lambda line: print(line, file=sys.stderr, flush=True))
        report["command"] = command
        reports.append(report)
        print(profile_markdown(report, f"`{command}`: products {report['forms']['products']}") + "\n")
    if args.json:
        write_json(args.json, reports[0] if len(reports) == 1 else {"command": command, "profiles": reports},
                   indent=1, sort_keys=False)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write("\n\n".join(profile_markdown(r, f"`{command}`: products {r['forms']['products']}")
                                 for r in reports) + "\n")
    return 0


BENCH_GENERATE_HELP = """generation tokens/s of txl vs Hugging Face's loop and the memory-bandwidth limit

Greedy generation after a prompt that fills the memory, on random-weight models of the paper's shapes: tokens/s of
txl (plain and captured steps, fp32 and int8), of Hugging Face TransfoXL's forward-with-mems loop (same weights,
tokens compared), alternating rounds, and each txl step's share of its limit: the bytes the step reads at the
machine's read rate, measured in the same run; a share above 100 % is refused
(transformer_xl.experiments.bench.generate, .yardstick).
"""


def add_generate(kinds: argparse._SubParsersAction) -> None:
    g = add_command(kinds, "generate", BENCH_GENERATE_HELP)
    g.add_argument("--shapes", default="wt103-base,enwik8-base",
                   help="model shapes: wt103-base (16 layers, d_model 410, 33,278 words), enwik8-base (12 layers, "
                   "d_model 512, 204 characters) (default: both)")
    g.add_argument("--mem-lens", default="640,1600", help="memory lengths; the prompt fills it (default: 640,1600)")
    g.add_argument("--batches", default="1,8", help="batch sizes (rows generated at once) (default: 1,8)")
    g.add_argument("--new-tokens", type=positive_int, default=24, help="txl decode steps timed per round (default: 24)")
    g.add_argument("--hf-tokens", type=positive_int, default=8,
                   help="Hugging Face decode steps timed per round (default: 8; its steps are slow)")
    g.add_argument("--repeats", type=positive_int, default=3, help="alternating rounds, median kept (default: 3)")
    g.add_argument("--no-hf", action="store_true", help="time txl only")
    g.add_argument("--no-int8", action="store_true", help="skip txl with int8 weights (always skipped off the CPU)")
    g.add_argument("--no-captured", action="store_true",
                   help="skip the captured (compiled) step, fp32 and int8 (transformer_xl.inference.captured)")
    g.add_argument("--kv-dtype", default="bfloat16", choices=["float32", "bfloat16"],
                   help="the key/value ring of the captured int8 step (default: bfloat16)")
    g.add_argument("--no-prefill", action="store_true", help="skip timing the prompt's forward (prefill)")
    g.add_argument("--quality", metavar="MODEL_DIR",
                   help="instead of speed: the perplexity cost of the captured step's bf16 key/value ring and int8 "
                   "weights for a trained model over a whole split, read one token per step "
                   "(transformer_xl.experiments.bench.decode_quality)")
    g.add_argument("--quality-dataset", default="wt2", help="dataset of --quality (default: wt2)")
    g.add_argument("--quality-split", default="valid", choices=["valid", "test"], help="split (default: valid)")
    g.add_argument("--quality-batch", type=positive_int, default=16, help="streams read at once (default: 16)")
    g.add_argument("--quality-mem-len", type=positive_int, help="memory length (default: the model's mem_len)")
    add_device(g)
    add_report_outputs(g)
    g.set_defaults(func=run_generate)


def _command() -> str:
    """The command line, with the variables that held the kernels to a narrower instruction set (``isa_limits``)."""
    from transformer_xl.train.precision import isa_limits

    argv = sys.argv[sys.argv.index("bench"):] if "bench" in sys.argv else None
    return isa_limits() + (shlex.join(["txl", *argv]) if argv else shlex.join(["python", *sys.argv]))


def _write(report: dict, table: str, args: argparse.Namespace) -> None:
    print(table)
    if args.json:
        write_json(args.json, report, indent=1, sort_keys=False)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write(table + "\n")


def run_quality(args: argparse.Namespace) -> int:
    from transformer_xl.data import load_corpus
    from transformer_xl.experiments.bench.decode_quality import quality, quality_markdown
    from transformer_xl.inference.loading import check_dataset, load_model, run_text_options

    model, directory = load_model(args.quality)
    corpus = load_corpus(args.quality_dataset, **run_text_options(directory))
    check_dataset(model, directory, corpus, args.quality_dataset)
    report = quality(model, corpus.splits[args.quality_split], batch=args.quality_batch,
                     mem_len=args.quality_mem_len or model.config.mem_len, log=lambda line: print(line, flush=True))
    report["command"] = command = _command()
    title = f"`{command}` ({directory} on {args.quality_dataset} {args.quality_split}, {args.threads} threads)"
    _write(report, quality_markdown(report, title), args)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from transformer_xl.experiments.bench.generate import GenerateBenchOptions, run_generate_bench, to_markdown

    if args.quality:
        return run_quality(args)

    opts = GenerateBenchOptions(shapes=[s for s in args.shapes.split(",") if s],
                                mem_lens=parse_int_list(args.mem_lens, "--mem-lens", minimum=1),
                                batches=parse_int_list(args.batches, "--batches", minimum=1),
                                new_tokens=args.new_tokens, hf_tokens=args.hf_tokens, repeats=args.repeats,
                                hf=not args.no_hf, int8=not args.no_int8, device=args.device,
                                captured=not args.no_captured, kv_dtype=args.kv_dtype, prefill=not args.no_prefill)
    report = run_generate_bench(opts, log=lambda line: print(line, flush=True))
    report["command"] = command = _command()
    _write(report, to_markdown(report, command), args)
    return 0


def run(args: argparse.Namespace) -> int:
    from transformer_xl.experiments.bench import BenchOptions, profile_train_step, run_benchmark, to_markdown

    cases = [c for c in args.cases.split(",") if c]
    if args.profile:
        print(profile_train_step(cases[0], args.profile, batch=args.batch_size, dtype=args.dtype,
                                 compile=args.compile))
        return 0
    opts = BenchOptions(cases=cases, eval_mem_lens=[] if args.eval_mem_lens == "none" else
                        parse_int_list(args.eval_mem_lens, "--eval-mem-lens"),
                        steps=args.steps,
                        repeats=args.repeats, device=args.device, dtype=args.dtype, compile=args.compile,
                        threads=args.threads, hf=not args.no_hf, memory=not args.no_memory,
                        recompute=args.recompute, variants=args.variants, skeleton=args.skeleton,
                        batch_size=args.batch_size)
    report = run_benchmark(opts, log=lambda line: print(line, flush=True))
    report["command"] = command = _command()
    _write(report, to_markdown(report, command), args)
    return 0
