"""``txl data fetch|prepare|info``: thin CLI over :mod:`transformer_xl.data`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_xl.cli.args import add_split_flags, nonneg_int, positive_int, stderr_note
from transformer_xl.data import fetch, known_datasets, load_corpus
from transformer_xl.data.registry import get_spec
from transformer_xl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformer_xl.data.long_range import LongRangeSpec


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``txl data`` and its ``fetch`` / ``prepare`` / ``info`` subcommands."""
    p = sub.add_parser(
        "data",
        help="download, prepare and inspect datasets",
        description=f"Datasets: {', '.join(known_datasets())}, or a path to your own text (a file or a folder). "
        "Your own text's splits: a folder with train.txt, valid.txt and test.txt (or train/, valid/ and test/ "
        "folders of files) is used as given; otherwise all its files, in name order, are joined and cut at line "
        "ends into train, then valid (--valid-fraction, default 0.05) and test (--test-fraction, default 0.05) "
        "at the end. `prepare` builds a cache once; `info` lists the caches already built (--prepare: build).",
    )
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("name", help="dataset name, or a text file / directory (prepare, info)")
        q.add_argument("--data-dir", default=None, help="raw data folder (default: $TXL_DATA_DIR, then user cache)")

    f = dsub.add_parser(
        "fetch", help="download and verify a dataset's files",
        description="Sources are tried in order: the original URL, the author's mirror (WikiText: "
        "wikitext.smerity.com), then the Hugging Face Hub dataset where one exists (WikiText: Salesforce/wikitext "
        "Parquet at a pinned revision, rebuilt to the exact original files; needs the hub extra, "
        "`pip install -e '.[hub]'` in the checkout; HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN apply). A dead "
        "source is said in one line naming the next. Files are verified whatever the source (SHA-256, or "
        "line/token counts and the checksum of the rebuilt text); the source used is kept in "
        "DATA/SUBDIR/sources.json and in the manifest of caches prepared from them. With HF_HUB_OFFLINE=1 network "
        "URLs are skipped and only the Hub cache is read.")
    common(f)
    f.add_argument("--mirror", default=None, help="base URL replacing the canonical URLs' folder (then the only "
                   "source tried)")
    f.add_argument("--force", action="store_true", help="download again even if present")
    for name, helptext in (("prepare", "tokenize once into the cache and print its sizes"),
                           ("info", "list the caches already prepared (level, tokenizer, sizes, vocabulary, when "
                            "built); --prepare builds one")):
        q = dsub.add_parser(name, help=helptext, description=helptext)
        common(q)
        if name == "info":
            q.add_argument("--prepare", action="store_true",
                           help="prepare the cache of these options (as `txl data prepare`) and print its sizes")
        q.add_argument("--cache-dir", default=None,
                       help="prepared-cache folder (default: $TXL_CACHE_DIR, then the user cache)")
        q.add_argument("--rebuild", action="store_true", help="rebuild the cache even if it is valid")
        q.add_argument("--refuse-stale", action="store_true", help="fail instead of rebuilding a stale cache")
        q.add_argument("--errors", choices=("strict", "replace"), default="strict",
                       help="non-UTF-8 bytes: fail, or replace them with U+FFFD (default: strict)")
        q.add_argument("--level", choices=("word", "char", "byte"), default=None,
                       help="user text: the unit of a token (default: word; char and byte report bpc)")
        q.add_argument("--lower", action="store_true", default=None, help="user text: lower-case")
        q.add_argument("--min-freq", type=nonneg_int, default=None, help="user text: minimum count of a word")
        q.add_argument("--max-size", type=positive_int, default=None, help="user text: maximum vocabulary size")
        q.add_argument("--tokenizer", default=None, metavar="TOK_JSON",
                       help="user text: a Hugging Face tokenizers JSON (subword ids instead of --level)")
        add_split_flags(q)
        q.add_argument("--json", action="store_true", help="print JSON")
    _add_generate(dsub)
    p.set_defaults(func=run)


def _add_generate(dsub: argparse._SubParsersAction) -> None:
    """``txl data generate long-range OUT``: the controlled long-range corpus (transformer_xl.data.long_range)."""
    g = dsub.add_parser("generate", help="write a synthetic corpus: long-range (random letters in which spans are "
                        "copies of the text a given distance back)",
                        description="Writes OUT/train.txt, valid.txt, test.txt (one line each) and "
                        "OUT/long-range.json (the parameters and, per split, every copied span: start, length, "
                        "distance, as token positions of the character-level reading). Train on it with "
                        "`txl train --dataset OUT --level char`. Seeded and deterministic "
                        "(see transformer_xl.data.long_range).")
    g.add_argument("kind", choices=["long-range"], help="the generator")
    g.add_argument("out", help="output folder: new, empty or an earlier long-range corpus")
    g.add_argument("--force", action="store_true", help="write OUT even when it holds other files: the old folder "
                   "is moved aside to OUT.old-N, not deleted")
    add_long_range_flags(g)


def add_long_range_flags(g: argparse.ArgumentParser) -> None:
    """The parameters of the long-range corpus (``txl data generate``, ``txl experiment long-context``)."""
    from transformer_xl.data.long_range import LongRangeSpec

    d = LongRangeSpec()
    g.add_argument("--distances", default=",".join(map(str, d.distances)),
                   help="distances of the copies (default: %(default)s)")
    g.add_argument("--span-lens", default=",".join(map(str, d.span_lens)),
                   help="lengths of the copied spans (default: %(default)s)")
    g.add_argument("--alphabet", default=d.alphabet, help="characters of the copied spans (default: %(default)s)")
    g.add_argument("--filler", default=None, help="characters of the text between copies (default: the alphabet)")
    g.add_argument("--density", type=float, default=d.density,
                   help="share of the tokens the layout aims to put in copies; spans whose source would overlap "
                   "another span are dropped, so fewer are (default: %(default)s)")
    g.add_argument("--tokens", default=",".join(str(d.tokens[s]) for s in ("train", "valid", "test")),
                   help="train,valid,test sizes in tokens (default: %(default)s)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed of the corpus (default: 0)")


def _is_known(name: str) -> bool:
    try:
        get_spec(name)
        return True
    except DataError:
        return False


def run(args: argparse.Namespace) -> int:
    """Execute ``txl data ACTION``."""
    if args.data_command == "generate":
        return _generate(args)
    if args.data_command == "fetch":
        files = fetch(args.name, args.data_dir, mirror=args.mirror, force=args.force)
        for path in files:
            print(path)
        return 0
    options = {
        "cache_dir": args.cache_dir,
        "rebuild": args.rebuild,
        "errors": args.errors,
        "on_stale": "error" if args.refuse_stale else "rebuild",
    }
    user = {
        "level": args.level,
        "lower": args.lower,
        "min_freq": args.min_freq,
        "max_size": args.max_size,
        "tokenizer": args.tokenizer,
        "valid_fraction": args.valid_fraction,
        "test_fraction": args.test_fraction,
    }
    given = {k: v for k, v in user.items() if v is not None}
    if given and _is_known(args.name):
        flag = "--" + next(iter(given)).replace("_", "-")
        raise ConfigError(f"{flag} applies to your own text only; {args.name} is a known dataset prepared by "
                          "its own rules (see `txl data info`)")
    options.update(given)
    if args.data_command == "info" and not (args.prepare or args.rebuild):
        return _list(args, options)
    corpus = load_corpus(args.name, args.data_dir, **options)
    info = corpus.info()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{info['name']}: vocabulary {info['vocab_size']:,}, dtype {info['dtype']}, metric {info['metric']}")
    for split, n in info["tokens"].items():
        print(f"  {split:5s} {n:>13,} tokens  {info['bytes'][split]:>13,} bytes")
    print(f"  cache {info['cache_dir']}")
    return 0


def _list(args: argparse.Namespace, options: dict) -> int:
    from transformer_xl.data.corpus import prepared_caches

    caches = prepared_caches(args.name, args.data_dir, options["cache_dir"])
    if options.get("tokenizer"):
        caches = [c for c in caches if c["tokenizer"] == str(Path(options["tokenizer"]).resolve())]
    elif options.get("level"):
        caches = [c for c in caches if c["level"] == options["level"]]
    if args.json:
        print(json.dumps(caches, indent=1))
        return 0
    if not caches:
        print(f"{args.name}: no prepared cache; build one with `txl data prepare {args.name}` (or info --prepare)")
        return 0
    for c in caches:
        tokens = ", ".join(f"{k} {n:,}" for k, n in c["tokens"].items())
        tok = f" ({c['tokenizer']})" if c["tokenizer"] else ""
        print(f"{c['level']}{tok}: vocabulary {c['vocab_size']:,}, tokens {tokens}; built {c['created']}")
        print(f"  cache {c['cache_dir']}")
    return 0


def long_range_spec(args: argparse.Namespace) -> LongRangeSpec:
    """The :class:`transformer_xl.data.long_range.LongRangeSpec` of the generator flags."""
    from transformer_xl.cli.args import parse_int_list
    from transformer_xl.data.long_range import parse_spec

    sizes = parse_int_list(args.tokens, "--tokens", minimum=1)
    if len(sizes) != 3:
        raise ConfigError(f"--tokens takes three sizes (train,valid,test), got {args.tokens!r}")
    return parse_spec(parse_int_list(args.distances, "--distances", minimum=1),
                      parse_int_list(args.span_lens, "--span-lens", minimum=1), alphabet=args.alphabet,
                      filler=args.filler, density=args.density, tokens=dict(zip(("train", "valid", "test"), sizes)),
                      seed=args.seed)


def _generate(args: argparse.Namespace) -> int:
    from transformer_xl.data.long_range import METADATA, SPLITS, generate
    from transformer_xl.store.outputs import claim_output_dir

    def written(folder: Path) -> set[str] | None:  # an earlier corpus of the generator: its files may be rewritten
        return {METADATA, *(f"{split}.txt" for split in SPLITS)} if (folder / METADATA).is_file() else None

    text = generate(long_range_spec(args))
    with claim_output_dir(args.out, "txl data generate", force=args.force, written=written,
                          note=stderr_note("txl data")) as target:
        text.write(target)
    out = Path(args.out)
    for split, spans in text.spans.items():
        print(f"  {split:5s} {len(text.ids[split]):>9,} tokens, {len(spans):>6,} copied spans")
    print(f"wrote {out}/train.txt, valid.txt, test.txt, long-range.json; train with "
          f"`txl train --dataset {out} --level char`")
    return 0
