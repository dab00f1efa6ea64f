"""A model's directory on disk, checked before anything is built: what ``TransformerXLLM.save_pretrained`` and
``from_pretrained`` (:mod:`transformer_xl.model.lm`) verify besides the forward.

The directory itself (``config.json``, ``model.safetensors``, ``vocab.json``, ``MANIFEST.json``; written atomically,
no pickle) is :mod:`transformer_xl.store.layout`; here are the checks that refuse, in one line, a vocabulary of the
wrong size, weights that do not belong to their config (read from the safetensors header, before any allocation)
and a state dict that does not fit the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.model.config import TXLConfig
from transformer_xl.store.tensors import TensorInfo


class SupportsToJson(Protocol):
    """A vocabulary as ``TransformerXLLM.save_pretrained`` takes it (``transformer_xl.data.Vocab``; the model layer
    does not import the data layer)."""

    def to_json(self) -> str: ...


def checked_vocab_json(vocab: str | SupportsToJson | None, n_token: int) -> str | None:
    """The JSON text of ``vocab`` (a ``Vocab`` or its JSON), or None for none; a one-line :class:`ConfigError` unless
    it is a txl vocabulary of ``n_token`` symbols (:func:`check_vocab_json`)."""
    if vocab is None:
        return None
    text = vocab if isinstance(vocab, str) else vocab.to_json()
    check_vocab_json(text, n_token)
    return text


def check_vocab_json(text: str, n_token: int) -> None:
    """A one-line :class:`ConfigError` unless ``text`` is a txl vocabulary JSON of ``n_token`` symbols."""
    try:
        symbols = json.loads(text).get("symbols")
    except (ValueError, AttributeError):
        symbols = None
    if not isinstance(symbols, list):
        raise ConfigError("vocab is not a txl vocabulary (expected a Vocab or its JSON text with a 'symbols' list)")
    if len(symbols) != n_token:
        raise ConfigError(f"the vocabulary has {len(symbols)} symbols but the model predicts n_token={n_token}")


_LAYER = re.compile(r"layers\.(\d+)\.")


def check_weights_header(config: TXLConfig, header: dict[str, TensorInfo], path: str | Path, *,
                         build: Callable[[TXLConfig], nn.Module]) -> None:
    """A one-line :class:`CheckpointError` unless the tensors a safetensors header lists (names, shapes,
    dtypes) are those of a model of ``config``. Cheap checks first, from the config alone (the number of layers,
    the parameter count :meth:`TXLConfig.parameter_count`), so a config far larger than its weights (say
    ``n_layer`` 100000 or ``n_token`` 10**9) is refused before anything is built; then names and shapes
    against ``build(config)`` on the ``meta`` device (no memory). Any floating dtype is accepted (cast on load)."""
    layers = {int(m.group(1)) for name in header if (m := _LAYER.match(name))}
    # the count first: a config's n_layer may be far too large for a set of its indices (10**12: a MemoryError)
    if len(layers) != config.n_layer or layers != set(range(config.n_layer)):
        raise CheckpointError(f"{path} holds the weights of {len(layers)} layers but its config says "
                              f"n_layer={config.n_layer}: the config does not belong to these weights")
    held, wanted = sum(info.numel for info in header.values()), config.parameter_count(tied_names=True)
    if held != wanted:
        raise CheckpointError(f"{path} holds {held:,} parameters but its config (n_token={config.n_token}, "
                              f"d_model={config.d_model}, d_inner={config.d_inner}) describes {wanted:,}: the config "
                              "does not belong to these weights")
    for name, info in header.items():
        if not info.floating:
            raise CheckpointError(f"{path}: tensor {name!r} is stored as {info.dtype}, not as floating point")
    with torch.device("meta"):
        own = build(config).state_dict()
    problem = mismatch({k: v.shape for k, v in own.items()}, {k: info.shape for k, info in header.items()})
    if problem:
        raise CheckpointError(f"{path}: weights do not fit the config ({problem})")


def mismatch(own: dict[str, Sequence[int]], given: dict[str, Sequence[int]]) -> str | None:
    """What keeps a state dict of ``given`` shapes from a model of ``own`` shapes, or None."""
    missing = sorted(set(own) - set(given))
    unexpected = sorted(set(given) - set(own))
    bad = sorted(k for k in set(own) & set(given) if tuple(own[k]) != tuple(given[k]))
    parts = [f"{label}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
             for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", bad)) if keys]
    return "; ".join(parts) or None
