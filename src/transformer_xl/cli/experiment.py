"""``txl recl`` and ``txl experiment {recl,ablation,eval-speed}``: the paper's experiments
(:mod:`transformer_xl.experiments`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from transformer_xl.cli.args import (
    add_dataset,
    add_device,
    clamp_int,
    nonneg_float,
    nonneg_int,
    parse_float_list,
    parse_int_list,
    positive_float,
    positive_int,
    seed_int,
    seed_list,
    stderr_note,
)
from transformer_xl.errors import ConfigError
from transformer_xl.store.files import write_json, write_text


def _log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)  # above a bar, when one is shown


def _add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar on stderr when it is a terminal (--no-progress: only the plain lines)")


def _bar(args: argparse.Namespace) -> str:
    """A bar when asked for and stderr is a terminal; otherwise none (the per-item lines are the progress)."""
    from transformer_xl.data.progress import progress_mode

    return "bar" if progress_mode(args.progress) == "bar" else "off"


def _add_size(p: argparse.ArgumentParser, default_preset: str) -> None:
    p.add_argument("--model-preset", default=default_preset, help=f"model size preset (default: {default_preset})")
    for flag, kind in (("--n-layer", positive_int), ("--d-model", positive_int), ("--n-head", positive_int),
                       ("--d-inner", positive_int), ("--dropout", nonneg_float)):
        note = " (d_head becomes d_model // n_head)" if flag in ("--d-model", "--n-head") else ""
        p.add_argument(flag, type=kind, help=f"override the preset's value{note}")
    p.add_argument("--pre-lnorm", action="store_true", default=None,
                   help="layer norm on the input of each block (official pre_lnorm; steadier at high learning rates)")


def _base_config(args: argparse.Namespace, n_token: int) -> Any:
    from transformer_xl.model.presets import model_preset

    over = {k: getattr(args, k) for k in ("n_layer", "d_model", "n_head", "d_inner", "dropout", "pre_lnorm")
            if getattr(args, k, None) is not None}
    cfg = model_preset(args.model_preset, n_token).replace(**over)
    if "d_model" in over or "n_head" in over:
        cfg = cfg.replace(d_head=cfg.d_model // cfg.n_head)
    return cfg


def _add_recl(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                   help="a model of the group (repeat for each); PATH as for `txl eval` (a Hub id "
                   "ORG/NAME[@REVISION] too)")
    p.add_argument("--method", action="append", default=None, metavar="window|attention-length",
                   help="how l_i(c, t) is measured, one method for the whole group (default: window). window: "
                   "token t given exactly its c previous tokens, a stride-1 window without memory (Appendix C's "
                   "definition; a model with L_max learned positions reads min(c, L_max)). attention-length (alias "
                   "memory): evaluation with memory, mem_len = c and same_length, segments of --tgt-len; each query "
                   "attends to c positions per layer, so a prediction of an n_layer model can depend on up to "
                   "n_layer*(c-1)+1 input tokens")
    add_dataset(p, "dataset all models were trained on", splits=("valid", "test"))
    grid = p.add_mutually_exclusive_group(required=True)
    grid.add_argument("--grid", metavar="START:STOP:STEP",
                      help="uniform context grid START, START+STEP, ..., STOP (STOP included; e.g. 16:256:16; "
                      "the paper: 100:1000:100 words). The 1%% threshold applies per step")
    grid.add_argument("--contexts", metavar="C1,C2,...",
                      help="context grid as a list, e.g. 32,64,96,128; a non-uniform one is accepted with a warning "
                      "(the threshold applies per step, so a longer step passes it more easily)")
    p.add_argument("--tokens", type=positive_int, default=32768,
                   help="scored tokens (default: 32768; the top-r set holds ceil(r * tokens): 3,277 for r = 0.1). "
                   "The window method runs one window per token, context and model: tens of thousands of tokens "
                   "are a job for --device cuda")
    p.add_argument("--start", type=nonneg_int, help="first scored position (default: the largest context, so "
                   "every context is full)")
    p.add_argument("--r", default="0.1,0.5,1.0", help="fractions of hardest tokens (default: 0.1,0.5,1.0)")
    p.add_argument("--threshold", type=nonneg_float, default=0.01,
                   help="relative gain threshold per grid step (default: 0.01)")
    p.add_argument("--resamples", type=nonneg_int, default=200,
                   help="bootstrap resamples of the scored tokens for the spread of each gain and RECL (5-95%% "
                   "interval); 0: none (default: 200)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the bootstrap resamples (default: 0)")
    p.add_argument("--rows", type=positive_int,
                   help="window method: windows per forward (default: as many as fit a 256 MB attention budget, "
                   "at most 256; more rows take more memory)")
    p.add_argument("--tgt-len", type=positive_int, default=32,
                   help="attention-length method: segment length (default: 32; unused by window)")
    p.add_argument("--clamp-len", type=clamp_int,
                   help="attention-length method: clamp relative distances (unused by window)")
    p.add_argument("--cache", help="per-token loss cache directory (default: OUT/cache)")
    p.add_argument("--out", required=True, help="output directory: recl.json, recl.md, recl.png")
    add_device(p)
    _add_progress(p)
    p.set_defaults(func=run_recl)


def add_parser(sub: argparse._SubParsersAction) -> None:
    _add_recl(sub.add_parser("recl", help="relative effective context length of a model group (paper Table 8)",
                             description="RECL as defined in the paper's Appendix C (see "
                             "transformer_xl.experiments.recl): by default every model's loss of token t is measured "
                             "given exactly its c previous tokens (--method window), on a grid, with a bootstrap "
                             "spread over the tokens."))
    p = sub.add_parser("experiment", help="the paper's experiments: recl (Table 8), ablation (Tables 6, 10), "
                                          "eval-speed (Table 9)")
    ex = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    _add_recl(ex.add_parser("recl", help="same as `txl recl`"))

    a = ex.add_parser("ablation", help="train and compare the Table 6 / Table 10 variants at a chosen scale",
                      description="See transformer_xl.experiments.ablations. Each variant is a `txl train` run "
                      "per seed into OUT/seed<k>/<variant>/; resumable: finished variants are skipped, an interrupted "
                      "one "
                      "continues from its checkpoint. Writes OUT/SET.md and OUT/SET.json for a named set "
                      "(OUT/table6.md, ...), else OUT/ablations.md and .json.")
    add_dataset(a, "dataset (default: wt2; e.g. ptb, wt103, wt2-char)", default="wt2")
    a.add_argument("--variants", default="table6",
                   help="table6 (the nine Table 6 rows), table6-core (three of them: rec-ours-full, rec-shaw-full, "
                   "norec-ours-full), table10 (no recurrence at Transformer-XL's measured peak training memory, "
                   "at equal steps and at equal tokens), table10-ratio (the paper's 176/128 and 172/128 lengths "
                   "instead), or a comma-separated list such as rec-ours-full,norec-alrfou-half,norec-ours-full-eqmem "
                   "(default: table6)")
    _add_size(a, "tiny")
    a.add_argument("--tgt-len", type=positive_int, default=32, help="training segment length T (default: 32)")
    a.add_argument("--steps", type=positive_int, default=500,
                   help="training steps per variant; -eqtok variants train round(steps * T / their length) "
                   "(default: 500)")
    a.add_argument("--batch-size", type=positive_int, default=16, help="training batch (default: 16)")
    a.add_argument("--lr", type=positive_float, default=1e-3, help="Adam learning rate (default: 1e-3)")
    a.add_argument("--warmup", type=nonneg_int, default=50, help="warm-up steps (default: 50)")
    a.add_argument("--max-minutes", type=positive_float, help="stop each variant's training after this many minutes")
    a.add_argument("--attn-step", type=positive_int,
                   help="resolution of the attention-length bisection: the reported Attn Len is at most this many "
                   "positions above the shortest length reaching PPL best (default: T // 4, at least 1)")
    a.add_argument("--attn-max", type=positive_int,
                   help="longest evaluation attention length searched (default: 16 * T; attn_type 3 models only "
                   "where every key has a learned position)")
    a.add_argument("--attn-tol", type=nonneg_float, default=1e-3,
                   help="an attention length reaches PPL best when its loss (nats) is within this fraction of the "
                   "best loss; the doubling also stops when a length improves by no more (default: 0.001)")
    a.add_argument("--eval-tokens", type=positive_int,
                   help="read only the first N + 1 validation tokens (memory evaluations score (N // 10 - 1) * 10 "
                   "of them, the window evaluation N) (default: the whole split)")
    a.add_argument("--seeds", type=seed_list, default="0,1,2",
                   help="comma-separated seeds; every variant is trained once per seed and the tables give the mean "
                   "± sample standard deviation (default: 0,1,2)")
    a.add_argument("--device", default="cpu",
                   help="torch device for training, the memory measurement and evaluation: cpu, cuda or cuda:N "
                   "(default: cpu)")
    a.add_argument("--out", required=True, help="output directory: OUT/seed<k>/<variant>/, the report OUT/SET.md "
                   "and .json (SET: the --variants set name, or ablations for a list), OUT/equal-memory.json for "
                   "the equal-memory variants; runs of several sets can share it (common rows are trained once)")
    _add_progress(a)
    a.set_defaults(func=run_ablation)

    add_eval_speed(ex, "eval-speed")
    from transformer_xl.cli.long_context import add_long_context

    add_long_context(ex)


def add_eval_speed(sub: argparse._SubParsersAction, name: str) -> None:
    """The Table 9 evaluation-speed command (``txl experiment eval-speed`` and ``txl bench eval-speed``)."""
    s = sub.add_parser(name, help="per-token evaluation time, Transformer-XL (with txl's caches and cache-free, as "
                       "the paper's code) vs the vanilla sliding window (Table 9)",
                       description="Times, per attention length L, Transformer-XL with txl's inference caches, the "
                       "same model cache-free (memory keys/values and W_kR R projected again at every segment, as "
                       "the paper's code ran) and the vanilla stride-1 window, in alternating repeats; every figure "
                       "is the median over the repeats, with min-max (see transformer_xl.experiments.speed).")
    add_dataset(s, "dataset whose tokens are read (default: wt2)", default="wt2", any_split=True)
    s.add_argument("--attn-lens", help="attention lengths (default: 128,256,512,800; on cuda up to 3800)")
    _add_size(s, "cpu-small")
    s.add_argument("--tgt-len", type=positive_int, default=128, help="XL evaluation segment length (default: 128)")
    s.add_argument("--xl-batch", type=positive_int, default=10, help="XL evaluation streams (default: 10, as eval.py)")
    s.add_argument("--xl-segments", type=positive_int, default=20,
                   help="XL segments timed per repeat and variant, after the memory is filled (default: 20)")
    s.add_argument("--vanilla-attn-type", type=int, default=3, choices=[2, 3],
                   help="vanilla encoding: 3 Al-Rfou et al. (default), 2 Vaswani et al.")
    s.add_argument("--rows", type=positive_int, help="vanilla windows per forward (default: by memory, at most 64)")
    s.add_argument("--vanilla-forwards", type=positive_int, default=8,
                   help="vanilla forwards (of --rows windows) timed per repeat (default: 8)")
    s.add_argument("--repeats", type=positive_int, default=5,
                   help="repeats, each timing cached XL, cache-free XL and vanilla back to back; every time and "
                   "ratio reported is the median over the repeats, with min-max, and all repeats are in the JSON "
                   "(default: 5)")
    add_device(s)
    s.add_argument("--out", help="write OUT/eval-speed.json, .md, .png")
    _add_progress(s)
    s.set_defaults(func=run_eval_speed)


# ---------------------------------------------------------------------------------------------- recl
def _recl_method(values: list[str] | None) -> str:
    """The group's one method from the ``--method`` values (none: window); ``NAME=METHOD`` and differing values are
    refused, since every model of a group must be measured the same way."""
    from transformer_xl.experiments import recl as R

    if not values:
        return R.DEFAULT_METHOD
    for v in values:
        if "=" in v:
            raise ConfigError(f"--method {v!r}: one method measures the whole group (window or attention-length), "
                              "not one per model")
    methods = {R.check_method(v) for v in values}
    if len(methods) > 1:
        raise ConfigError(f"--method given as {', '.join(sorted(methods))}: a group is measured by one method")
    return methods.pop()


def run_recl(args: argparse.Namespace) -> int:
    import numpy as np

    from transformer_xl.data import load_corpus
    from transformer_xl.experiments import recl as R
    from transformer_xl.experiments.tables import plot_recl, recl_gain_table, recl_protocol, recl_table
    from transformer_xl.inference.loading import check_device, load_model
    from transformer_xl.store.layout import weights_digest

    prog = "txl recl" if args.command == "recl" else "txl experiment recl"
    check_device(args.device)
    method = _recl_method(args.method)
    contexts = R.parse_grid(args.grid) if args.grid else parse_int_list(args.contexts, "--contexts", minimum=1)
    if args.contexts and len(contexts) > 1 and R.grid_step(contexts) is None:
        stderr_note(prog)(f"warning: the grid {args.contexts} is not uniform; the {100 * args.threshold:g}% "
                          "threshold applies per step, so a longer step passes it more easily (--grid START:STOP:STEP "
                          "gives a uniform one)")
    r_values = parse_float_list(args.r, "--r")
    corpus = load_corpus(args.dataset, data_dir=args.data_dir)
    members = []
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--model {spec!r}: expected NAME=PATH")
        model, directory = load_model(path, device=args.device, note=stderr_note(f"{prog}: model {name}"))
        if model.config.n_token != len(corpus.vocab):
            raise ConfigError(f"model {name} predicts {model.config.n_token} symbols, {args.dataset} has "
                              f"{len(corpus.vocab)}")
        members.append(R.GroupMember(name, model, weights_digest(directory)))
    data = np.asarray(corpus.splits[args.split])
    start = args.start if args.start is not None else max(contexts)
    out = Path(args.out)
    cache = R.LossCache(args.cache or out / "cache")
    losses, caps = R.group_losses(members, data, contexts, method=method, start=start, tokens=args.tokens,
                                  data_key={"dataset": args.dataset, "split": args.split}, cache=cache,
                                  tgt_len=args.tgt_len, clamp_len=args.clamp_len, rows=args.rows, device=args.device,
                                  progress=_log, bar=_bar(args))
    result = R.compute_recl(losses, contexts, names=[m.name for m in members], r_values=r_values,
                            threshold=args.threshold, max_context=caps, resamples=args.resamples, seed=args.seed,
                            method=method, receptive=R.group_receptive_fields(members, contexts, method))
    memory = method == R.ATTENTION_LENGTH
    doc = {**result.to_dict(), "dataset": args.dataset, "split": args.split, "start": start, "tokens": args.tokens,
           "tgt_len": args.tgt_len if memory else None, "clamp_len": args.clamp_len if memory else None,
           "rows": args.rows if not memory else None,
           "models": {m.name: {"path": spec.partition("=")[2], "digest": m.digest, "method": method,
                               "attn_type": m.model.config.attn_type, "n_layer": m.model.config.n_layer}
                      for m, spec in zip(members, args.model)}}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "recl.json", doc, sort_keys=False)
    text = recl_table(result)
    gains = "\n".join(f"Relative gain g(c, c') in % (r = {r:g}):\n\n{recl_gain_table(result, r)}" for r in r_values)
    write_text(out / "recl.md", recl_protocol(result) + "\n" + text + "\n" + gains)
    plot_recl(result, out / "recl.png", title=f"RECL on {args.dataset} {args.split} ({args.tokens} tokens, {method})")
    print(recl_protocol(result))
    print(text)
    print(f"wrote {out}/recl.json, recl.md, recl.png")
    return 0


# ---------------------------------------------------------------------------------------------- ablation
def run_ablation(args: argparse.Namespace) -> int:
    import dataclasses

    from transformer_xl.data import load_corpus
    from transformer_xl.experiments import ablation_report
    from transformer_xl.experiments import ablations as A
    from transformer_xl.inference.loading import check_device

    variants = A.variant_set(args.variants)
    device = str(check_device(args.device))
    T = args.tgt_len
    search = A.AttnSearch(step=args.attn_step or max(1, T // 4), max_len=args.attn_max or 16 * T,
                          rel_tol=args.attn_tol)
    corpus = load_corpus(args.dataset, data_dir=args.data_dir)
    base = _base_config(args, len(corpus.vocab))
    rows = A.run_ablation(base, corpus, args.out, variants, tgt_len=T, steps=args.steps, search=search,
                          seeds=args.seeds, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
                          eval_tokens=args.eval_tokens, max_minutes=args.max_minutes, device=device, log=_log,
                          progress=args.progress)
    eqmem = A.read_equal_memory(args.out) if any(v.equal_memory for v in variants) else None
    text, doc = ablation_report.report(rows, char_level=corpus.char_level, equal_memory=eqmem)
    doc = {"command": {k: v for k, v in vars(args).items() if k != "func"}, "dataset": args.dataset,
           "char_level": corpus.char_level, "attn_search": dataclasses.asdict(search), **doc}
    stem = args.variants if args.variants in A.VARIANT_SETS else "ablations"  # table6.md and table10.md side by side
    write_text(Path(args.out, f"{stem}.md"), text)
    write_json(Path(args.out, f"{stem}.json"), doc, sort_keys=False)
    print(text)
    print(f"wrote {Path(args.out, stem)}.md, .json", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------- eval speed
def run_eval_speed(args: argparse.Namespace) -> int:
    from transformer_xl.data import load_corpus
    from transformer_xl.experiments import speed as S
    from transformer_xl.experiments.tables import plot_speed, speed_table
    from transformer_xl.inference.loading import check_device

    device = check_device(args.device)  # one line, before the corpus is read
    default = S.GPU_LENGTHS if device.type == "cuda" else S.CPU_LENGTHS
    lens = parse_int_list(args.attn_lens, "--attn-lens", minimum=1) if args.attn_lens else list(default)
    corpus = load_corpus(args.dataset, data_dir=args.data_dir)
    base = _base_config(args, len(corpus.vocab))
    rows = S.eval_speed(base, corpus.splits[args.split], lens, tgt_len=args.tgt_len, xl_batch=args.xl_batch,
                        vanilla_attn_type=args.vanilla_attn_type, rows=args.rows, xl_segments=args.xl_segments,
                        vanilla_forwards=args.vanilla_forwards, repeats=args.repeats, device=device, progress=_log,
                        bar=_bar(args))
    table = speed_table(rows)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "eval-speed.json", rows, sort_keys=False)
        write_text(out / "eval-speed.md", table)
        plot_speed(rows, out / "eval-speed.png")
        print(f"wrote {out}/eval-speed.json, .md, .png")
    return 0
