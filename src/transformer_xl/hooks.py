"""What the model's convenience methods need from the layers above the model, as a small protocol.

``TransformerXLLM.generate`` / ``.stream`` run :mod:`transformer_xl.inference.generate`, and
``TransformerXLLM.from_pretrained("ORG/NAME")`` runs :mod:`transformer_xl.interop.hub`. The model layer may not
import either (imports go downward: the import-linter contracts in ``pyproject.toml``, which count imports inside
functions too), so it calls the :class:`Layers` bound here. The package root (``transformer_xl/__init__.py``),
which Python runs before any of its subpackages and which is outside the layers, binds its own implementation
(each method imports its layer on first use); a test may bind another. This module imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor


class Layers(Protocol):
    """The functions of the upper layers that methods of the model call."""

    def generate(self, model: Any, input_ids: Tensor | Any, **kwargs: Any) -> Any:
        """:func:`transformer_xl.inference.generate.generate`."""

    def stream(self, model: Any, input_ids: Tensor | Any, **kwargs: Any) -> Iterator[Any]:
        """:func:`transformer_xl.inference.generate.stream`."""

    def pretrained_dir(self, name: str, revision: str | None) -> Path | None:
        """The local model directory of the Hub id ``name`` (:func:`transformer_xl.interop.hub.hub_model_dir`), or
        None when ``name`` is not one (a local path of that name exists, ``ORG`` is a local directory, or it is not
        shaped ``ORG/NAME``: :func:`transformer_xl.interop.hub.parse_hub_id`)."""


_bound: Layers | None = None


def bind(layers: Layers) -> Layers | None:
    """Make ``layers`` what the model calls; returns the previous binding (to restore it)."""
    global _bound
    previous, _bound = _bound, layers
    return previous


def layers() -> Layers:
    """The bound :class:`Layers` (the package root binds them on import)."""
    if _bound is None:
        raise RuntimeError("transformer_xl.hooks has no layers bound (import transformer_xl binds them)")
    return _bound
