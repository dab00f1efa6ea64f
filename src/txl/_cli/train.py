"""``txl train``: train a model on a dataset (see :mod:`txl.train`)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from txl.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from txl.presets import MODEL_PRESETS
    from txl.train import TrainConfig

    p = sub.add_parser("train", help="train a Transformer-XL language model",
                       description="Train on a dataset known to `txl data` (default: the embedded WikiText-2).")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str}
        base = str(f.type).split("|")[0].strip()
        p.add_argument(flag, dest=f.name, type=kind.get(base, str), default=getattr(defaults, f.name),
                       help=f"(default: {getattr(defaults, f.name)})"
                       + (f"; one of {', '.join(MODEL_PRESETS)}" if f.name == "model" else ""))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set n_layer=2 --set cutoffs=[2000,10000]")
    p.set_defaults(func=run)


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    from txl.train import TrainConfig, train

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    train(cfg, model_overrides=_parse_overrides(args.overrides))
    return 0
