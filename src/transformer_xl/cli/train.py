"""``txl train``: train a model (see :mod:`transformer_xl.train`); the flags are the fields of ``TrainConfig`` and
``TXLConfig``.

A run's config is resolved as: training preset (``--preset``, or ``preset`` in the file) < config file
(``--config run.toml|run.json``) < command-line flags. ``--resume RUN_DIR`` starts from the run's own
``config.json`` instead, and flags given with it override it (e.g. a longer ``--max-step``).
``--init-from MODEL_DIR`` fine-tunes a pretrained model in a new run (:mod:`transformer_xl.train.init_from`): its
architecture (a training preset's model fields then give way to it) and vocabulary; not with ``--resume``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError
from transformer_xl.model import TXLConfig

_SKIP = {"model_overrides", "n_token"}


def _parser_for(annotation: str) -> Any:
    kinds = str(annotation).replace(" ", "").split("|")
    optional = "None" in kinds
    base = kinds[0]

    def parse(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        try:
            if base == "int":
                return int(text)
            if base == "float":
                return float(text)
            if base == "bool":
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(text)
                return text.lower() in ("true", "1", "yes")
            if base.startswith("list"):
                value = json.loads(text)
                if not isinstance(value, list):
                    raise ValueError(text)
                return value
        except (ValueError, json.JSONDecodeError) as exc:
            raise argparse.ArgumentTypeError(f"expected {'/'.join(kinds)}, got {text!r}") from exc
        return text

    return parse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from transformer_xl.model.presets import MODEL_PRESETS, model_preset
    from transformer_xl.train.config import TrainConfig
    from transformer_xl.train.presets import TRAIN_PRESETS

    p = sub.add_parser(
        "train", help="train a Transformer-XL language model",
        description="Train on a dataset known to `txl data` (default: the embedded WikiText-2) or on your own text "
                    "(--dataset FILE_OR_FOLDER with --level word|char|byte or --tokenizer TOK_JSON; its splits: see "
                    "`txl data --help`). Multi-process: `torchrun --nproc_per_node N -m transformer_xl train ...`.",
        epilog=f"training presets: {', '.join(TRAIN_PRESETS)}; model presets (--model): {', '.join(MODEL_PRESETS)}")
    p.add_argument("--preset", default=argparse.SUPPRESS, metavar="NAME", help="a training preset (see below)")
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE", help="a .toml or .json config")
    p.add_argument("--resume", default=None, metavar="RUN_DIR|auto",
                   help="continue a run (or a checkpoint directory); auto: continue --out-dir if it holds this run, "
                        "else start it (the one command line for torchrun --max-restarts and relaunches)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument("--force", action="store_true",
                   help="start even when the memory estimate of the config exceeds the device's memory")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set any config key, e.g. --set cutoffs=[2000,10000]; KEY=null (or None) clears a value")
    from transformer_xl.train.config import FIELD_HELP, MODEL_FIELD_HELP

    defaults, by_preset = TrainConfig(), _preset_fields()
    train_group = p.add_argument_group(
        "training (TrainConfig)", "defaults: the bare config's, which a --preset or --config may change")
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SKIP or f.name in ("preset", "loggers"):
            continue
        value = getattr(defaults, f.name)
        where = "" if value is None else f" (default: {_shown(value)}"
        where += "; a preset changes it)" if where and f.name in by_preset else (")" if where else "")
        _add_flag(train_group, f, FIELD_HELP[f.name] + where)
    train_group.add_argument("--logger", dest="loggers", action="extend", type=_logger_names, default=argparse.SUPPRESS,
                             metavar="{tensorboard,wandb,none}",
                             help="also log the training curves to TensorBoard (events/ in the run directory) or "
                                  "Weights & Biases; repeat it or give a comma list (none: no logger); a resumed run "
                                  "keeps its loggers")
    bare = model_preset(defaults.model, 10**4)
    model_group = p.add_argument_group(
        "model (TXLConfig fields over the model preset)",
        f"defaults: those of the model preset (--model, default {defaults.model}); shown: {defaults.model}'s")
    for f in dataclasses.fields(TXLConfig):
        if f.name not in _SKIP:
            _add_flag(model_group, f, f"{MODEL_FIELD_HELP[f.name]} (default: {_shown(getattr(bare, f.name))})")
    p.set_defaults(func=run)


def _logger_names(text: str) -> list[str]:
    """``--logger a,b`` -> ``["a", "b"]``; ``none`` -> ``[]`` (the names are checked by ``TrainConfig``)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return [] if names == ["none"] else names


def _shown(value: Any) -> str:
    """A default as a user would type it (JSON lists, ``null``, ``true``/``false``)."""
    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def _preset_fields() -> set[str]:
    """The TrainConfig fields some training preset sets to another value than the bare config's."""
    from transformer_xl.train.config import TrainConfig
    from transformer_xl.train.presets import TRAIN_PRESETS, train_preset

    bare, out = TrainConfig().to_dict(), set()
    for name in TRAIN_PRESETS:
        out |= {k for k, v in train_preset(name).to_dict().items() if v != bare[k]}
    return out - {"preset"}


def _add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field, help_text: str) -> None:
    from transformer_xl.train.config import FIELD_CHOICES

    flag = "--" + f.name.replace("_", "-")
    help_text = help_text.replace("%", "%%")
    if str(f.type) == "bool":
        group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=help_text)
        return
    choices = FIELD_CHOICES.get(f.name)
    metavar = "{" + ",".join(map(str, choices)) + "}" if choices else f.name.upper()
    if f.name == "device":
        metavar = "{auto,cpu,cuda,cuda:N}"
    group.add_argument(flag, dest=f.name, type=_parser_for(f.type), default=argparse.SUPPRESS, help=help_text,
                       metavar=metavar)


def _parse_set(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        if value.strip().lower() in ("none", "null"):
            out[key] = None
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def resolve_config(args: argparse.Namespace) -> Any:
    """The :class:`TrainConfig` of ``args`` (preset < file < flags; or the resumed run's config < flags)."""
    from transformer_xl.store.layout import RunDir, is_checkpoint_dir
    from transformer_xl.train.config import MODEL_KEYS, TrainConfig, read_config_file
    from transformer_xl.train.presets import train_preset
    from transformer_xl.train.resume import AUTO

    flags = {k: v for k, v in vars(args).items() if k in {f.name for f in dataclasses.fields(TrainConfig)}
             or k in MODEL_KEYS}
    flags.pop("preset", None)
    flags.update(_parse_set(args.overrides))
    if args.resume and args.resume != AUTO:
        given = [k for k in ("init_from", "init_vocab") if flags.get(k) is not None]
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} cannot be combined with --resume: a resumed run "
                              "continues from its own checkpoint (start a fine-tuning run without --resume)")
        run_dir = Path(args.resume)
        if is_checkpoint_dir(run_dir):  # RUN_DIR/checkpoints/step_*
            run_dir = RunDir.of_checkpoint(run_dir)
        run = RunDir(run_dir)
        if not run.config.is_file():
            raise ConfigError(f"{run_dir} is not a txl run directory (no {run.config.name})")
        cfg = TrainConfig.from_dict(read_config_file(run.config))
        _check_text_fields(cfg, flags, run_dir)
        return TrainConfig.from_dict({**flags, "out_dir": str(run_dir)}, base=cfg)
    file_values = read_config_file(args.config_file) if args.config_file else {}
    preset = getattr(args, "preset", None) or file_values.get("preset")
    base = train_preset(preset) if preset else None
    if base is not None and (flags.get("init_from") or file_values.get("init_from")):
        from transformer_xl.train.init_from import SETTABLE  # a preset's architecture gives way to the model's

        base.model_overrides = {k: v for k, v in base.model_overrides.items() if k in SETTABLE}
    cfg = TrainConfig.from_dict({**file_values, **({"preset": preset} if preset else {})}, base=base)
    return TrainConfig.from_dict(flags, base=cfg)


def _check_text_fields(cfg: Any, flags: dict[str, Any], run_dir: Path) -> None:
    """Refuse another preparation of the run's own text on --resume before the text is prepared again."""
    from transformer_xl.train.config import USER_TEXT_KEYS
    from transformer_xl.train.resume import fixed_field_changed

    for key in USER_TEXT_KEYS:
        if key in flags and flags[key] != getattr(cfg, key):
            raise fixed_field_changed(run_dir, key, getattr(cfg, key))


def run(args: argparse.Namespace) -> int:
    from transformer_xl.model.presets import model_preset
    from transformer_xl.train.trainer import Trainer

    began = time.monotonic()  # the command's wall time: setup, training and the final evaluation
    cfg = resolve_config(args)
    model_preset(cfg.model, 10**7, **cfg.model_overrides)  # the model keys' values, before printing or training
    out_dir = Path(cfg.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"out_dir {out_dir} is a file, not a directory")
    if args.print_config:
        print(cfg.to_json(), end="")
        return 0
    trainer = Trainer(cfg, resume=args.resume, force=args.force)  # a resume's changes are checked here
    if trainer.plan is not None and trainer.step >= cfg.max_step and trainer.run.results.is_file():
        trainer.close()
        trainer.dist.close()
        if trainer.dist.main:
            print(f"txl train: {trainer.plan.run.root} already finished at step {trainer.step} "
                  f"(max_step {cfg.max_step}); raise --max-step to continue", file=sys.stderr)
        return _end(0, trainer.dist.world_size)
    summary = trainer.fit()
    code = _report(summary, cfg, (time.monotonic() - began) / 60) if summary["rank"] == 0 else 0
    return _end(code, summary["world_size"])


def _end(code: int, world_size: int) -> int:
    """The exit status; a torchrun worker (``world_size > 1``) ends here without the interpreter's teardown."""
    if world_size > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        # gloo's threads outlive destroy_process_group (the DDP reducer keeps the group alive) and were torn down
        # with the interpreter, in no set order: 1 run of 50 aborted with "terminate called without an active
        # exception" (exit -6). Everything is written and flushed here; nothing is left to tear down.
        os._exit(code)
    return code


def _report(summary: dict[str, Any], cfg: Any, minutes: float) -> int:
    """The last lines of ``txl train`` (rank 0): done, or stopped and how to continue; the exit status. ``minutes``:
    the command's wall time, said with what it was spent on; each score says what it covers."""
    from transformer_xl.train.validation import scope

    metric = summary["metric"]
    out = summary["out_dir"]
    if summary["stopped"] != "max_step":
        why = {"signal": "on a signal", "time": f"after --max-minutes {cfg.max_minutes}"}[summary["stopped"]]
        print(f"txl train: stopped {why} at step {summary['step']}, checkpoint saved; "
              f"continue with: txl train --resume {out}", file=sys.stderr)
        return 0
    final = summary.get("final")
    spent = [f"training {summary['train_minutes']:.2f} min"]
    if summary["train_minutes"] < summary["minutes"]:  # a resumed run: its earlier invocations trained too
        spent[0] += f" ({summary['minutes']:.2f} min over the run)"
    if final:
        spent.append(f"final evaluation {final['minutes']:.2f} min")
    done = f"txl train: done in {minutes:.2f} min ({', '.join(spent)}) at step {summary['step']}"
    if final:
        parts = [f"{s} {metric} ({scope(final[s]['tokens'])}) {final[s][metric]:.3f}" for s in ("valid", "test")
                 if s in final]
        which = final["model"] if final["model"] == "last" else f"{final['model']}, step {summary['best_step']}"
        print(f"{done}; best model ({which}): {', '.join(parts)}")
    else:
        print(f"{done}; models in {out}")
    return 0
