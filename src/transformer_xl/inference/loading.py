"""Loading what inference needs from a directory: the model behind a model, checkpoint or run directory,
and its vocabulary (layout: :mod:`transformer_xl.store.layout`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from transformer_xl.data import Vocab
from transformer_xl.errors import CheckpointError, ConfigError, DataError, TXLError
from transformer_xl.interop.hub import hub_model_dir, missing_path_hint, parse_hub_id
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.model.int8 import check_scheme
from transformer_xl.safejson import nested_too_deeply, read_object
from transformer_xl.store.checkpoint import verify_checkpoint
from transformer_xl.store.layout import CONFIG, find_vocab, is_checkpoint_dir, resolve_model


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, or a one-line :class:`ConfigError` when it is unknown or absent."""
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {str(device)!r} ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} requested but CUDA is not available")
    return dev


def load_model(path: str | Path, *, device: str | torch.device = "cpu", verify: bool = True,
               note: Callable[[str], None] | None = None, quantize: str | None = None,
               fits: Callable[[TXLConfig], None] | None = None) -> tuple[TransformerXLLM, Path]:
    """The model behind ``path`` in eval mode, and its directory: every command that takes a model reads it here.

    ``path`` is a Hugging Face Hub id ``ORG/NAME[@REV]`` when no local path of that name exists and ``ORG`` is no
    local directory (:func:`transformer_xl.interop.hub.parse_hub_id`,
    :func:`transformer_xl.interop.hub.hub_model_dir`; ``note`` hears of a first conversion), else
    a model directory, a checkpoint directory ``RUN/checkpoints/step_*`` or a run directory (its
    ``best/``, else ``final/``, else its newest checkpoint: :func:`transformer_xl.store.layout.resolve_model`); for a
    run
    directory, ``note`` (e.g. a print to stderr) is told which model was picked, once it has loaded
    (``"using RUN/best (the best validation model, step 1200)"``).

    With ``verify`` (default) the directory's files are checked against its ``MANIFEST.json`` SHA-256 sums
    first (required for a checkpoint; a model directory without one loads unchecked); the config is checked
    against the weights' header and NaN/inf weights are refused either way
    (:meth:`TransformerXLLM.from_pretrained`). ``quantize="int8"`` then quantizes it for CPU inference
    (:meth:`TransformerXLLM.quantize`; refused before loading on another device).

    ``fits`` is shown the model's config before anything is built, to refuse (raising) lengths the machine cannot
    hold (:func:`transformer_xl.inference.budget.check_scoring`); a config that cannot be read is left to the load,
    which says why after checking the manifest. A JSON file of the model nested too deeply for Python's parser
    (``config.json`` of 100,000 ``[``) is a one-line :class:`CheckpointError`, not a :class:`RecursionError`.
    """
    check_device(device)
    if quantize is not None:
        check_scheme(quantize, torch.device(device))
    if parse_hub_id(path) is not None:  # ORG/NAME[@REV], no local path of that name, ORG no local directory
        path = hub_model_dir(str(path), note=note)
    elif not Path(path).exists():  # e.g. runs/demoo beside runs/: a mistyped path, never looked up on the Hub
        raise CheckpointError(f"no such model or run directory: {path}{missing_path_hint(path)}")
    resolved: Path | None = None
    try:  # json's parser recurses once per level: a file of the model nested 100,000 deep would raise RecursionError
        directory, why = resolve_model(path)
        resolved = directory
        checkpoint = is_checkpoint_dir(directory)
        if verify and checkpoint:
            verify_checkpoint(directory)  # a checkpoint must have its manifest
        if fits is not None:
            _show_config(directory, fits)
        model = TransformerXLLM.from_pretrained(directory, map_location=device, verify=verify and not checkpoint)
    except RecursionError:
        if resolved is not None and (resolved / CONFIG).is_file():
            read_object(resolved / CONFIG, error=CheckpointError)  # config.json: named, if it is the one
        raise CheckpointError(f"{resolved or path}: a JSON file of the model ({CONFIG}, a manifest, the run's "
                              "train_info.json or the weights' metadata) is nested too deeply to be read") from None
    if note is not None and why is not None:
        note(f"using {directory} ({why})")
    if quantize is not None:
        model.quantize(quantize)
    return model.eval(), directory


def _show_config(directory: Path, fits: Callable[[TXLConfig], None]) -> None:
    """``fits(config)`` for the config in ``directory``; nothing for one that cannot be read (``from_pretrained``
    refuses it in its own words, after the manifest)."""
    try:
        config = TXLConfig.from_json(directory / CONFIG)
    except TXLError:
        return
    fits(config)


def load_vocab(model_dir: str | Path, vocab: str | Path | None = None) -> Vocab:
    """The vocabulary of a model directory: ``vocab`` if given, else the one
    :func:`transformer_xl.store.layout.find_vocab`
    finds beside it (``MODEL_DIR/vocab.json``, or its run's); one nested too deeply to parse is a one-line
    :class:`DataError`."""
    path = find_vocab(model_dir, vocab)
    try:
        return Vocab.load(path)
    except RecursionError:
        raise nested_too_deeply(f"vocabulary {path}", DataError) from None


def check_dataset(model: TransformerXLLM, model_dir: str | Path, corpus: Any, name: str) -> None:
    """Refuse, in one line, a dataset the model was not trained on: a vocabulary other than the model's (when the
    model has one beside it, :func:`transformer_xl.store.layout.find_vocab`), or else another number of symbols."""
    try:
        own = load_vocab(model_dir)
    except CheckpointError:  # no vocabulary beside the model: only the sizes can be compared
        own = None
    if own is not None and own.sha256() != corpus.vocab.sha256():
        raise DataError(f"the vocabulary of {name} ({len(corpus.vocab)} symbols) differs from the model's "
                        f"({len(own)} symbols, {find_vocab(model_dir)}): not the model's dataset, or its text "
                        "changed since the model was trained")
    if len(corpus.vocab) != model.config.n_token:
        raise DataError(f"{name} has {len(corpus.vocab)} symbols but the model predicts {model.config.n_token}: "
                        "not the model's dataset")


def model_ids(model: TransformerXLLM, model_dir: str | Path, corpus: Any, name: str) -> Any:
    """None when ``corpus``'s ids are the model's; else the map ``[len(corpus.vocab)]`` from the dataset's ids to
    the model's, when the model's vocabulary (beside it) holds every symbol of the dataset's: a released TensorFlow
    model's vocabulary (Python 2's ``Counter`` ordered tied counts otherwise than txl's preparation), or WikiText-2's
    text read by a WikiText-103 model. Anything else is :func:`check_dataset`'s one-line refusal."""
    import numpy as np

    try:
        own = load_vocab(model_dir)
    except CheckpointError:
        own = None
    if own is None or own.sha256() == corpus.vocab.sha256() or len(own) != model.config.n_token:
        check_dataset(model, model_dir, corpus, name)
        return None
    missing = [s for s in corpus.vocab.idx2sym if s not in own.sym2idx]
    if missing:
        raise DataError(f"the vocabulary of {name} ({len(corpus.vocab)} symbols) differs from the model's "
                        f"({len(own)} symbols, {find_vocab(model_dir)}) and {len(missing)} of its symbols (e.g. "
                        f"{missing[0][:40]!r}) are not the model's: not the model's dataset")
    return np.array([own.sym2idx[s] for s in corpus.vocab.idx2sym], dtype=np.int64)


#: The options that prepare one's own text, recorded in a run's config (``txl train --level ...``).
USER_TEXT_FLAGS = ("level", "tokenizer", "valid_fraction", "test_fraction")


def run_text_options(model_dir: Path) -> dict:
    """The user-text options of the run ``model_dir`` belongs to, else the level its vocabulary shows."""
    import json

    from transformer_xl.data.codec import detect_level

    for folder in (model_dir, model_dir.parent, model_dir.parent.parent):
        try:
            doc = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # unreadable or not JSON: not a run's config
            continue
        if isinstance(doc, dict) and isinstance(doc.get("train"), dict):
            return {k: doc["train"][k] for k in USER_TEXT_FLAGS if doc["train"].get(k) is not None}
    try:
        level = detect_level(load_vocab(model_dir))
    except (CheckpointError, DataError):
        return {}
    return {"level": level} if level in ("char", "byte") else {}


def load_codec(model_dir: str | Path, vocab: str | Path | None = None, *, level: str | None = None,
               tokenizer: str | None = None) -> tuple[Vocab, Any]:
    """The vocabulary of a model directory and the codec that turns text into its ids and back: a subword codec
    for ``tokenizer`` (default: the one its run recorded, unless ``level`` is given), else a
    :class:`~transformer_xl.data.codec.TextCodec` at ``level`` (default: detected from the vocabulary)."""
    from transformer_xl.data.codec import TextCodec

    voc = load_vocab(model_dir, vocab)
    if tokenizer is None and level is None:
        tokenizer = run_text_options(Path(model_dir)).get("tokenizer")
    if tokenizer is not None:
        from transformer_xl.data.subword import SubwordCodec

        return voc, SubwordCodec(voc, tokenizer)
    return voc, TextCodec(voc, level)
