"""The layout of txl's directories on disk: every file name is defined here, once.

**Model directory** (``save_pretrained``, a run's ``best/`` and ``final/``, a converted model)::

    config.json          TXLConfig as JSON
    model.safetensors    the state dict (tied names as aliases, see transformer_xl.store.tensors)
    vocab.json           the vocabulary, when known (training copies the run's into best/ and final/)
    train_info.json      best/ and final/: the step (and validation loss) they were saved at
    MANIFEST.json        SHA-256 and size of the files above (transformer_xl.store.manifest), checked on load

**Checkpoint directory** ``RUN/checkpoints/step_XXXXXXXX/``: a model directory plus ``train_state.json`` and
``train_state.safetensors``, its ``MANIFEST.json`` covering all of them (:mod:`transformer_xl.store.checkpoint`).

**Run directory** (``txl train --out-dir RUN``), :class:`RunDir`::

    config.json  vocab.json  metrics.jsonl  results.json  checkpoints/  best/  final/
    events/  wandb/  loggers.json    the loggers' files (transformer_xl.train.loggers): TensorBoard, W&B, the W&B id

**Prepared data cache** (:mod:`transformer_xl.data.cache`): ``{split}.npy``, ``vocab.json``, ``manifest.json``; the RECL
loss cache (:mod:`transformer_xl.experiments.recl`) keeps a ``manifest.json`` too.

:func:`resolve_model_dir` turns any of "model directory", "checkpoint directory" or "run directory" into
the model directory behind it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.safejson import short_repr
from transformer_xl.store.files import read_json, sha256_file, write_text
from transformer_xl.store.manifest import MANIFEST as MANIFEST  # re-exported: every file name can be imported from here
from transformer_xl.store.manifest import verify_manifest, write_manifest
from transformer_xl.store.tensors import check_finite, load_tensors, save_tensors

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
VOCAB = "vocab.json"
TRAIN_INFO = "train_info.json"
# MANIFEST ("MANIFEST.json", imported above) belongs to transformer_xl.store.manifest, which reads and writes manifests.
TRAIN_STATE_JSON = "train_state.json"
TRAIN_STATE_TENSORS = "train_state.safetensors"
METRICS = "metrics.jsonl"
RESULTS = "results.json"
CHECKPOINTS = "checkpoints"
BEST = "best"
FINAL = "final"
EVENTS = "events"
WANDB = "wandb"  # W&B's own name for its folder under the run directory
LOGGERS = "loggers.json"
STEP_DIR = re.compile(r"^step_(\d{8,})$")  # RUN/checkpoints/step_00001200
CACHE_MANIFEST = "manifest.json"


class RunDir:
    """The paths of a training run directory: ``root`` and one attribute per file or folder in it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.config, self.vocab, self.metrics, self.results = (self.root / n for n in (CONFIG, VOCAB, METRICS, RESULTS))
        self.checkpoints, self.best, self.final, self.events, self.wandb, self.loggers = (
            self.root / n for n in (CHECKPOINTS, BEST, FINAL, EVENTS, WANDB, LOGGERS))

    @staticmethod
    def of_checkpoint(path: str | Path) -> Path:
        """The run directory of a checkpoint directory ``RUN/checkpoints/step_*``."""
        return Path(path).parent.parent


def step_dir(root: str | Path, step: int) -> Path:
    """The checkpoint directory of ``step`` under ``root`` (``RUN/checkpoints``)."""
    return Path(root) / f"step_{step:08d}"


def step_dirs(root: str | Path) -> list[Path]:
    """The ``step_*`` directories under ``root``, oldest (lowest step) first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


# ---------------------------------------------------------------------------------------------- model dirs
def is_model_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG).is_file() and (Path(path) / WEIGHTS).is_file()


def is_checkpoint_dir(path: str | Path) -> bool:
    """Whether ``path`` is a training checkpoint: a ``step_*`` directory, or one holding ``train_state.json``
    (complete or not: :func:`transformer_xl.store.checkpoint.verify_checkpoint` requires its manifest). A model
    directory
    has a manifest too, but is neither."""
    path = Path(path)
    return path.is_dir() and (bool(STEP_DIR.match(path.name)) or (path / TRAIN_STATE_JSON).is_file())


def save_model_dir(directory: str | Path, state_dict: dict[str, torch.Tensor], config_json: str,
                   vocab_json: str | None = None) -> Path:
    """Write ``model.safetensors``, ``config.json`` (and ``vocab.json``) into ``directory``, each atomically,
    then ``MANIFEST.json`` listing them (a file added later: :func:`transformer_xl.store.manifest.write_manifest`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(state_dict, directory / WEIGHTS)
    write_text(directory / CONFIG, config_json)
    if vocab_json is not None:
        write_text(directory / VOCAB, vocab_json)
    write_manifest(directory, [WEIGHTS, CONFIG] + ([VOCAB] if vocab_json is not None else []))
    return directory


#: What a txl ``config.json`` calls its model for transformers' ``AutoConfig`` (Hugging Face TransfoXL's name).
MODEL_TYPE = "transfo-xl"
#: Longest name ``architectures`` may list.
_MAX_NAME = 100


def model_fields(data: Any, error: type[Exception] = ConfigError) -> Any:
    """A model ``config.json`` dict without the keys that name the model for transformers: ``model_type`` (when it
    is :data:`MODEL_TYPE`) and ``architectures`` (a list of names) beside it; another model type is a one-line
    ``error`` (:class:`CheckpointError` for a file read from disk). Anything else is returned as it is."""
    if not isinstance(data, dict) or "model_type" not in data:
        return data
    if data["model_type"] != MODEL_TYPE:
        raise error(f"model config has model_type {short_repr(data['model_type'])}, not {MODEL_TYPE!r}")
    names = data.get("architectures", [])
    if not (isinstance(names, list) and all(isinstance(n, str) and len(n) <= _MAX_NAME for n in names)):
        raise error(f"model config key 'architectures' must be a list of names, got {short_repr(names)}")
    return {k: v for k, v in data.items() if k not in ("model_type", "architectures")}


def read_model_config(directory: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """The ``config.json`` dict of a model directory, after checking the directory's files against its
    manifest when it has one (``verify``); one-line :class:`CheckpointError` for what is missing or bad."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"model directory not found: {directory}")
    if verify:
        # equivalent: ``what`` names the directory only when a manifest is required, which it is not here
        verify_manifest(directory, what="model directory")  # pragma: no mutate
    cfg_path = directory / CONFIG
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path} not found (a txl model directory holds {CONFIG} and {WEIGHTS})")
    return model_fields(read_json(cfg_path, error=CheckpointError), CheckpointError)


def load_weights(directory: str | Path, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The state dict in ``directory/model.safetensors``, refused if a floating tensor holds NaN or inf."""
    path = Path(directory) / WEIGHTS
    state = load_tensors(path, map_location)
    check_finite(state, path)
    return state


def load_model_dir(directory: str | Path, map_location: str | torch.device = "cpu", *,
                   verify: bool = True) -> tuple[dict[str, Any], dict]:
    """``(config dict, state dict)`` of a model directory (:func:`read_model_config`, :func:`load_weights`)."""
    return read_model_config(directory, verify=verify), load_weights(directory, map_location)


def resolve_model_dir(path: str | Path) -> Path:
    """The model directory behind ``path``: a model directory (``config.json`` + ``model.safetensors``, e.g.
    ``RUN/best``), a checkpoint ``step_*`` directory, or a run directory (its ``best/``, else ``final/``,
    else its newest ``checkpoints/step_*``)."""
    return resolve_model(path)[0]


def resolve_model(path: str | Path) -> tuple[Path, str | None]:
    """:func:`resolve_model_dir` and why: ``None`` when ``path`` is itself a model or checkpoint directory, else
    which model of the run directory was picked (e.g. ``"the best validation model, step 1200"``), for a
    command to tell its user."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no such model or run directory: {path}")
    if is_model_dir(path):
        return path, None
    run = RunDir(path)
    for sub, what, lacking in ((run.best, "the best validation model", ""),
                               (run.final, "the last model of training", f"; no {BEST}/")):
        if (sub / WEIGHTS).is_file():
            return sub, what + _step_of(sub) + lacking
    steps = [p for p in step_dirs(run.checkpoints) if (p / WEIGHTS).is_file()]
    if steps:
        return steps[-1], f"the newest checkpoint; no {BEST}/ or {FINAL}/"
    raise CheckpointError(f"{path} holds no model: expected {CONFIG} + {WEIGHTS}, or a run directory with "
                          f"{BEST}/, {FINAL}/ or {CHECKPOINTS}/step_*/")


def _step_of(model_dir: Path) -> str:
    """``", step N"`` from a published model's ``train_info.json``, or ``""`` when it cannot be read (the load
    that follows checks the file against the manifest)."""
    try:
        step = json.loads((model_dir / TRAIN_INFO).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return ""
    return f", step {step}" if isinstance(step, int) and not isinstance(step, bool) else ""


def find_vocab(model_dir: str | Path, vocab: str | Path | None = None) -> Path:
    """The vocabulary file of a model: ``vocab`` if given, else ``MODEL_DIR/vocab.json``, else the one of the
    run the directory belongs to (``RUN/best``, ``RUN/final``: one level up; ``RUN/checkpoints/step_*``: two)."""
    if vocab is not None:
        return Path(vocab)
    model_dir = Path(model_dir)
    candidates = [model_dir / VOCAB, model_dir.parent / VOCAB]
    if model_dir.parent.name == CHECKPOINTS:
        candidates.append(RunDir.of_checkpoint(model_dir) / VOCAB)
    for cand in candidates:
        if cand.is_file():
            return cand
    raise CheckpointError(f"no vocabulary for {model_dir}: neither {candidates[0]} nor {candidates[1]} exists; "
                          f"pass --vocab PATH (a txl vocab JSON)")


def weights_digest(directory: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of a model directory's ``model.safetensors``: a cache key for its outputs."""
    return sha256_file(Path(directory) / WEIGHTS)[:16]
