"""txl: Transformer-XL (Dai et al., ACL 2019) as an installable library.

Public API::

    from transformer_xl import TXLConfig, TransformerXLLM
    model = TransformerXLLM(TXLConfig(n_token=204, n_layer=4, n_head=4, d_model=64, d_head=16, d_inner=256))
    out = model(input_ids, targets=targets, mems=mems)   # out.nll, out.loss, out.mems

The names below are imported on first use, so that ``import transformer_xl.data`` (or any other subpackage) does not
load the model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from transformer_xl import hooks
from transformer_xl.version import __version__

if TYPE_CHECKING:
    from transformer_xl.errors import CheckpointError, ConfigError, DataError, TXLError
    from transformer_xl.model import (
        InferenceCache,
        Lengths,
        LMOutput,
        Recurrence,
        SequenceConfig,
        SequenceOutput,
        SequenceState,
        TransformerXLLM,
        TransformerXLSequence,
        TXLConfig,
    )

_EXPORTS = {
    **dict.fromkeys(("CheckpointError", "ConfigError", "DataError", "TXLError"), "transformer_xl.errors"),
    **dict.fromkeys(("InferenceCache", "LMOutput", "Lengths", "Recurrence", "SequenceConfig", "SequenceOutput",
                     "SequenceState", "TXLConfig", "TransformerXLLM", "TransformerXLSequence"), "transformer_xl.model"),
}

__all__ = ["CheckpointError", "ConfigError", "DataError", "InferenceCache", "LMOutput", "Lengths", "Recurrence",
           "SequenceConfig", "SequenceOutput", "SequenceState", "TXLConfig", "TXLError", "TransformerXLLM",
           "TransformerXLSequence", "__version__"]


class _Layers:
    """The layers above the model, for its convenience methods (:mod:`transformer_xl.hooks`): this root package
    sits outside the layers and imports each one when a method first needs it."""

    def generate(self, model: Any, input_ids: Any, **kwargs: Any) -> Any:
        from transformer_xl.inference.generate import generate

        return generate(model, input_ids, **kwargs)

    def stream(self, model: Any, input_ids: Any, **kwargs: Any) -> Any:
        from transformer_xl.inference.generate import stream

        return stream(model, input_ids, **kwargs)

    def pretrained_dir(self, name: str, revision: str | None) -> Any:
        from transformer_xl.interop.hub import hub_model_dir, parse_hub_id

        return None if parse_hub_id(name) is None else hub_model_dir(name, revision)


hooks.bind(_Layers())


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'transformer_xl' has no attribute {name!r}")
