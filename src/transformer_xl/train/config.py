"""Training configuration: :class:`TrainConfig`, apart from the model's :class:`~transformer_xl.model.config.TXLConfig`.

Field names follow the official ``train.py`` flags where one exists (``lr``, ``warmup_step``,
``max_step``, ``clip``, ``batch_chunk``, ``eval_tgt_len``, ``eta_min``, ``decay_rate``, ``lr_min``,
``patience``, ``mom``, ``varlen``, ``seed``, ``log_interval``, ``eval_interval``). Model fields
(``n_layer``, ``tgt_len``, ``mem_len``, ``dropout``, ...) are not duplicated here: they live in
``model_overrides`` over the model preset ``model``, and a flat dict or file may give them at top
level (``{"n_layer": 2}`` means ``model_overrides={"n_layer": 2}``), like the official flags.

A config file (``.toml`` through stdlib ``tomllib``, or ``.json``) holds the same keys, optionally
``preset = "NAME"`` as the base, and optionally a ``[model_overrides]`` table. The ``config.json`` of a
run directory (``{"train": ..., "model": ...}``) is accepted as well.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_xl.errors import ConfigError, did_you_mean
from transformer_xl.model.config import TXLConfig
from transformer_xl.store.files import parse_json_object

OPTIMIZERS = ("adam", "sgd", "adagrad")
SCHEDULERS = ("cosine", "inv_sqrt", "constant", "dev_perf")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
#: model fields a training config may override (``n_token`` always comes from the dataset)
LEVELS = ("word", "char", "byte")
#: fields that apply to the user's own text only (a registered dataset is prepared by its own rules)
USER_TEXT_KEYS = ("level", "tokenizer", "valid_fraction", "test_fraction")
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(TXLConfig) if f.name != "n_token")
LOGGER_NAMES = ("tensorboard", "wandb")
#: keys of older configs that are read and dropped (``tensorboard``: events/ whenever installed, now --logger)
LEGACY_KEYS = ("tensorboard",)


@dataclass
class TrainConfig:
    """Everything ``txl train`` needs besides the model architecture (see the module docstring)."""

    # what to train
    preset: str | None = None  # the training preset this config was built from (informational)
    dataset: str = "wt2"
    data_dir: str | None = None  # raw data folder (default: $TXL_DATA_DIR, then the user cache)
    model: str = "cpu-small"  # a model preset of transformer_xl.model.presets.MODEL_PRESETS
    model_overrides: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None  # fine-tune: start from this model's weights, architecture and vocabulary
    init_vocab: str | None = None  # init_from's vocabulary when none is beside the model
    # your own text only (dataset a file or folder; see `txl data --help`)
    level: str | None = None  # word | char | byte (None: word)
    tokenizer: str | None = None  # a Hugging Face tokenizers JSON: subword ids instead of level
    valid_fraction: float | None = None  # without train/valid/test files: the valid part (None: 0.05)
    test_fraction: float | None = None  # without train/valid/test files: the test part (None: 0.05)
    out_dir: str = "runs/txl"
    # batches (batch_size is the global batch over all processes, as one process would see it)
    batch_size: int = 16
    batch_chunk: int = 1  # split each process's rows into this many chunks, accumulating gradients
    varlen: bool = False  # official --varlen: Gaussian segment lengths around tgt_len
    # optimizer and schedule (official train.py)
    optim: str = "adam"
    lr: float = 2.5e-4
    mom: float = 0.0  # SGD momentum
    scheduler: str = "cosine"
    warmup_step: int = 0
    max_step: int = 100000
    eta_min: float = 0.0  # cosine: the final learning rate
    decay_rate: float = 0.5  # dev_perf: factor on a plateau
    patience: int = 0  # dev_perf: evaluations without improvement before decaying
    lr_min: float = 0.0  # dev_perf: lower bound
    clip: float = 0.25  # gradient-norm clipping (<= 0 disables it)
    # precision and speed
    precision: str = "fp32"  # fp32 | bf16 (autocast, CPU or GPU) | fp16 (autocast + GradScaler, for GPUs) | auto
    compile: bool = False  # torch.compile the model
    recompute: bool = False  # recompute attention probabilities in backward: less memory, ~10 % slower
    half_loss: bool = False  # the loss of each segment's second half only (paper Table 6, "Half")
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # validation during training (official train.py: batch 10, eval_tgt_len, memory keeping tgt+mem)
    eval_interval: int = 4000
    eval_tgt_len: int | None = None  # None: the model's tgt_len
    eval_batch_size: int = 10
    eval_max_tokens: int | None = None  # score only the first N validation tokens during training
    # final evaluation of the best model (the official eval.py settings of each run script)
    final_eval: bool = True
    test_tgt_len: int | None = None  # None: eval_tgt_len
    test_mem_len: int | None = None  # None: the training memory
    test_clamp_len: int | None = None  # None: the model's clamp_len
    test_same_length: bool | None = None  # None: the model's same_length
    test_batch_size: int = 10
    # logging, checkpoints, limits
    log_interval: int = 200
    save_interval: int | None = None  # None: every eval_interval steps
    save_minutes: float | None = 30.0  # also save when this much wall time passed since the last save
    keep_checkpoints: int = 2  # step_* directories kept (the best model is kept apart)
    max_minutes: float | None = None  # stop (saving a checkpoint) after this much wall time
    max_nonfinite: int = 10  # stop after this many consecutive non-finite losses/gradients
    dist_timeout: float = 1800.0  # torchrun: seconds a collective waits for the other processes, then fails
    seed: int = 1111
    progress: bool = True  # tqdm bar on rank 0
    loggers: list[str] = field(default_factory=list)  # tensorboard, wandb (transformer_xl.train.loggers)

    def __post_init__(self) -> None:
        self.model_overrides = dict(self.model_overrides or {})
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise a one-line :class:`ConfigError` naming the field, before any work starts."""
        _typed(self)
        for f in dataclasses.fields(self):  # every number finite: nan/inf would silently turn a limit off
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value!r}")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"seed must be in [0, 2**32 - 1], got {self.seed}")
        for name in ("batch_size", "batch_chunk", "max_step", "eval_interval", "log_interval",
                     "eval_batch_size", "test_batch_size", "max_nonfinite"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_tgt_len", "eval_max_tokens", "test_tgt_len", "save_interval"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.test_mem_len is not None and self.test_mem_len < 0:
            raise ConfigError(f"test_mem_len must be >= 0, got {self.test_mem_len}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        for name in ("warmup_step", "patience"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.batch_size % self.batch_chunk:
            raise ConfigError(f"batch_size {self.batch_size} is not divisible by batch_chunk {self.batch_chunk}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.eta_min <= self.lr or not 0 <= self.lr_min <= self.lr:
            raise ConfigError(f"eta_min and lr_min must be in [0, lr={self.lr}]")
        if not 0 < self.decay_rate <= 1:
            raise ConfigError(f"decay_rate must be in (0, 1], got {self.decay_rate}")
        if self.mom < 0:
            raise ConfigError(f"mom must be >= 0, got {self.mom}")
        if not self.dist_timeout > 0:
            raise ConfigError(f"dist_timeout must be > 0 seconds, got {self.dist_timeout}")
        for name in ("max_minutes", "save_minutes"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ConfigError(f"{name} must be > 0 (or None), got {value}")
        for name, allowed in (("optim", OPTIMIZERS), ("scheduler", SCHEDULERS), ("precision", PRECISIONS)):
            value = getattr(self, name)
            if value not in allowed:
                hint = did_you_mean(value, allowed)
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}{hint}")
        if self.device != "auto" and self.device != "cpu" and not self.device.startswith("cuda"):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.init_vocab is not None and self.init_from is None:
            raise ConfigError("init_vocab is the vocabulary of init_from: give init_from (--init-from MODEL_DIR) too")
        if self.level is not None and self.level not in LEVELS:
            raise ConfigError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}"
                              f"{did_you_mean(self.level, LEVELS)}")
        if self.level is not None and self.tokenizer is not None:
            raise ConfigError("give level or tokenizer, not both (a tokenizer decides the tokens itself)")
        for name in ("valid_fraction", "test_fraction"):
            value = getattr(self, name)
            if value is not None and not 0 < value < 0.5:
                raise ConfigError(f"{name} must be in (0, 0.5), got {value}")
        given = [k for k in USER_TEXT_KEYS if getattr(self, k) is not None]
        if given and _is_registered(self.dataset):
            raise ConfigError(f"{given[0]} applies to your own text only; {self.dataset} is a known dataset "
                              "prepared by its own rules (see `txl data info`)")
        if not isinstance(self.loggers, (list, tuple)) or not all(isinstance(n, str) for n in self.loggers):
            raise ConfigError(f"loggers must be a list of names ({', '.join(LOGGER_NAMES)}), got {self.loggers!r}")
        for name in self.loggers:
            if name not in LOGGER_NAMES:
                raise ConfigError(f"unknown logger {name!r}: choose from {', '.join(LOGGER_NAMES)}"
                                  f"{did_you_mean(name, LOGGER_NAMES)}")
        self.loggers = list(dict.fromkeys(self.loggers))
        bad = [k for k in self.model_overrides if k not in MODEL_KEYS]
        if bad:
            raise ConfigError(f"unknown model config key {bad[0]!r}{did_you_mean(bad[0], MODEL_KEYS)}")

    def corpus_options(self) -> dict[str, Any]:
        """The options of :func:`transformer_xl.data.load_corpus` for the user-text fields that are set."""
        return {k: getattr(self, k) for k in USER_TEXT_KEYS if getattr(self, k) is not None}

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, base: TrainConfig | None = None) -> TrainConfig:
        """Build from a flat dict over ``base`` (default: the dataclass defaults).

        Keys are ``TrainConfig`` fields or model fields (collected into ``model_overrides``); anything
        else is a :class:`ConfigError` naming the closest known key.
        """
        train_keys = {f.name for f in dataclasses.fields(cls)}
        values = base.to_dict() if base is not None else {}
        overrides = dict(values.get("model_overrides", {}))
        for key, value in data.items():
            if key == "model_overrides":
                if not isinstance(value, dict):
                    raise ConfigError("model_overrides must be a table/object of model config keys")
                overrides.update(value)
            elif key in train_keys:
                values[key] = value
            elif key in MODEL_KEYS:
                overrides[key] = value
            elif key in LEGACY_KEYS:
                continue
            else:
                raise ConfigError(f"unknown config key {key!r}{did_you_mean(key, [*train_keys, *MODEL_KEYS])}")
        values["model_overrides"] = overrides
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"bad training config: {exc}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls.from_dict(parse_json_object(text, "training config"))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The flat dict of a ``.toml``/``.json`` config file (a run's ``config.json`` is flattened)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc})") from None
    if path.suffix != ".toml":
        data = parse_json_object(text, str(path))
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise ConfigError("TOML config files need Python >= 3.11 (tomllib); use a .json config") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    if "train" in data and isinstance(data["train"], dict):  # a run directory's config.json
        flat = dict(data["train"])
        model = {k: v for k, v in data.get("model", {}).items() if k in MODEL_KEYS}
        flat["model_overrides"] = {**model, **flat.get("model_overrides", {})}
        return flat
    return data


def _typed(cfg: TrainConfig) -> None:
    """Check each field's JSON/TOML/CLI value against its annotation (ints for ints, and so on)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        kinds = str(f.type).replace(" ", "").split("|")
        if value is None and "None" in kinds:
            continue
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
        }
        if not any(ok.get(k, True) for k in kinds if k != "None"):
            raise ConfigError(f"{f.name} must be {' or '.join(kinds)}, got {value!r}")
        if "float" in kinds and isinstance(value, int):
            setattr(cfg, f.name, float(value))


def _is_registered(name: str) -> bool:
    from transformer_xl.data.registry import get_spec
    from transformer_xl.errors import DataError

    try:
        get_spec(name)
    except DataError:
        return False
    return True


#: One line of help per :class:`TrainConfig` field (``txl train --help``; a test keeps it complete).
FIELD_HELP: dict[str, str] = {
    "preset": "the training preset the config was built from",
    "dataset": "a dataset of `txl data` (wt2, ptb, enwik8, ...) or a path to your own text (file or folder)",
    "data_dir": "raw data folder (default: $TXL_DATA_DIR, then the user cache)",
    "model": "the model preset whose architecture the model flags below change",
    "model_overrides": "model fields over the model preset",
    "init_from": "fine-tune: start from this model directory's weights, architecture and vocabulary (or a Hugging "
    "Face Hub id ORG/NAME[@REVISION]; a local path of that name, or under a local ORG/ folder, wins)",
    "init_vocab": "the vocabulary (vocab.json/.txt) of --init-from when none is beside the model, or a dataset name "
    "(wt103: the vocabulary of its prepared cache, built by `txl data prepare wt103`)",
    "level": "your own text only: the unit of a token (word, char or byte; char and byte report bpc; default: word)",
    "tokenizer": "your own text only: a Hugging Face tokenizers JSON giving subword ids (instead of --level)",
    "valid_fraction": "your own text without train/valid/test files: the valid part, cut at a line end (default: "
                      "0.05)",
    "test_fraction": "your own text without train/valid/test files: the test part, last (default: 0.05)",
    "out_dir": "the run directory (config, checkpoints, best model, metrics)",
    "batch_size": "sequences per step, over all processes",
    "batch_chunk": "split each step's rows into this many chunks, accumulating gradients (less memory)",
    "varlen": "random segment lengths around tgt_len (official --varlen)",
    "optim": "the optimizer",
    "lr": "the peak learning rate",
    "mom": "SGD momentum",
    "scheduler": "the learning-rate schedule (dev_perf: decay on a validation plateau)",
    "warmup_step": "linear warm-up steps",
    "max_step": "training steps",
    "eta_min": "cosine: the final learning rate",
    "decay_rate": "dev_perf: the factor applied on a plateau",
    "patience": "dev_perf: evaluations without improvement before decaying",
    "lr_min": "dev_perf: the lowest learning rate",
    "clip": "gradient-norm clipping (<= 0: off)",
    "precision": "arithmetic: fp32, bf16 (autocast, CPU or GPU), fp16 (autocast + loss scaling, for GPUs) or auto "
                 "(bf16 where the device's bf16 matmuls pay: CUDA sm80+, a CPU measuring >= 2x fp32; else fp32)",
    "compile": "torch.compile the model (one graph per segment shape; the compile time is logged)",
    "recompute": "recompute attention probabilities in backward: less memory, about 10 % slower",
    "half_loss": "train on the loss of each segment's second half only (paper Table 6)",
    "device": "auto, cpu, cuda or cuda:N",
    "eval_interval": "validate (and save the best model) every N steps",
    "eval_tgt_len": "validation segment length (null: the model's tgt_len)",
    "eval_batch_size": "validation streams",
    "eval_max_tokens": "score only the first N validation tokens during training (null: all)",
    "final_eval": "evaluate the best model on valid and test at the end",
    "test_tgt_len": "final evaluation segment length (null: eval_tgt_len)",
    "test_mem_len": "final evaluation memory length (null: the training memory)",
    "test_clamp_len": "final evaluation clamp length (null: the model's)",
    "test_same_length": "final evaluation same_length (null: the model's)",
    "test_batch_size": "final evaluation streams",
    "log_interval": "log the training loss every N steps",
    "save_interval": "save a checkpoint every N steps (null: every eval_interval)",
    "save_minutes": "also save after this many minutes since the last save (null: off)",
    "keep_checkpoints": "step_* checkpoints kept (the best model is kept apart)",
    "max_minutes": "stop, saving a checkpoint, after this many minutes (null: no limit)",
    "max_nonfinite": "stop after this many consecutive non-finite losses or gradients",
    "dist_timeout": "multi-process: seconds a collective waits for the other processes before the run fails "
                    "naming the rank that did not answer (a rank that died or stalled)",
    "seed": "random seed (0 to 2**32 - 1)",
    "progress": "show a progress bar",
    "loggers": "training loggers beside metrics.jsonl: tensorboard, wandb",
}

#: One line of help per :class:`~transformer_xl.model.config.TXLConfig` field (the model flags of ``txl train``).
MODEL_FIELD_HELP: dict[str, str] = {
    "n_token": "vocabulary size (always the dataset's)",
    "n_layer": "layers",
    "n_head": "attention heads",
    "d_model": "model width",
    "d_head": "width of each head",
    "d_inner": "feed-forward inner width",
    "dropout": "dropout rate, in [0, 1)",
    "dropatt": "attention-probability dropout rate, in [0, 1)",
    "tie_weight": "tie the output embedding to the input embedding",
    "d_embed": "embedding width (null: d_model)",
    "div_val": "adaptive embedding: each cluster's width is divided by this (1: no division)",
    "tie_projs": "adaptive softmax: tie each cluster's projection, a JSON list of booleans",
    "pre_lnorm": "layer norm before each sub-layer instead of after",
    "tgt_len": "training segment length (tokens predicted per step and row)",
    "ext_len": "extended context length (0 in the paper's runs)",
    "mem_len": "memory length: hidden states kept from previous segments (0: no recurrence)",
    "cutoffs": "adaptive softmax cluster boundaries, a JSON list such as [2000,10000] ([]: full softmax)",
    "same_length": "every query attends to the same number of keys",
    "attn_type": "attention: 0 Transformer-XL relative, 1 Shaw et al., 2 absolute sinusoid, 3 Al-Rfou et al.",
    "clamp_len": "clamp relative distances at this length (-1 or 0: no clamping)",
    "sample_softmax": "sampled softmax size (-1 or 0: the full softmax)",
    "untie_r": "separate global position biases u, v per layer",
    "layer_norm_epsilon": "added to the variance in every LayerNorm (PyTorch code 1e-5, TF code 1e-12)",
    "tf_memory": "the TF code's memory: start from mem_len zero states; same_length sees mem_len + 1 keys",
    "init": "weight initialization",
    "init_range": "uniform initialization range",
    "init_std": "normal initialization standard deviation",
    "proj_init_std": "adaptive-softmax projection initialization standard deviation",
}

#: The allowed values of the fields that have a fixed set (shown as ``{a,b,c}`` by ``txl train --help``).
FIELD_CHOICES: dict[str, tuple[Any, ...]] = {
    "optim": OPTIMIZERS, "scheduler": SCHEDULERS, "precision": PRECISIONS, "level": LEVELS,
    "init": ("normal", "uniform"), "attn_type": (0, 1, 2, 3),
}
