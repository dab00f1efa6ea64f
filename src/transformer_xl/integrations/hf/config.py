"""``AutoConfig`` for ``model_type="transfo-xl"``: txl's model config, and old Hugging Face TransfoXL ones.

transformers 5 dropped TransfoXL, so ``"transfo-xl"`` is unknown to ``AutoConfig`` until
:func:`transformer_xl.integrations.hf.register` runs. :class:`TransfoXLConfig` reads both kinds of ``config.json``:

* txl's own (``n_token``, ``tie_projs``, ... the fields of :class:`transformer_xl.model.TXLConfig`), which a model
  saved through transformers also writes, with ``model_type`` and ``architectures`` beside them, so the directory
  stays a txl model directory (``txl eval``, ``txl generate``, ``TransformerXLLM.from_pretrained`` read it);
* Hugging Face TransfoXL's (``vocab_size``, ``proj_share_all_but_first``, ...: ``transfo-xl/transfo-xl-wt103``),
  converted by :func:`transformer_xl.interop.hf.config_from_hf`.

``vocab_size`` is the model's ``n_token``; the tokenizer has one more id, its padding
(:mod:`transformer_xl.integrations.hf.tokenizer`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

from transformers import PretrainedConfig

from transformer_xl.errors import ConfigError
from transformer_xl.interop.hf import config_from_hf
from transformer_xl.model import TXLConfig

_TXL_FIELDS = tuple(f.name for f in dataclasses.fields(TXLConfig))


class TransfoXLConfig(PretrainedConfig):
    """The configuration of a Transformer-XL language model (Dai et al., 2019) for transformers' Auto classes."""

    model_type = "transfo-xl"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache", "past_key_values"]

    def __post_init__(self, **kwargs: Any) -> None:
        #: Whether the fields are txl's own (``n_token``) rather than Hugging Face TransfoXL's (``vocab_size``).
        self.txl_layout = "n_token" in kwargs
        super().__post_init__(**kwargs)
        if self.txl_layout:
            self.vocab_size = kwargs["n_token"]
        for name in ("d_model", "n_layer", "n_head"):  # the names transformers' utilities look for
            if getattr(self, name, None) is None:
                setattr(self, name, getattr(TXLConfig, name, None))
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if not hasattr(self, name):
                setattr(self, name, None)
        self.hidden_size = self.d_model
        self.num_hidden_layers = self.n_layer
        self.num_attention_heads = self.n_head

    @classmethod
    def from_txl(cls, config: TXLConfig, **kwargs: Any) -> TransfoXLConfig:
        """The transformers config of a txl model config."""
        return cls(**config.to_dict(), **kwargs)

    def to_txl(self) -> TXLConfig:
        """The txl model config these fields describe (one line :class:`~transformer_xl.errors.ConfigError` when
        they describe none)."""
        raw = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        if self.txl_layout:
            return TXLConfig.from_dict({k: raw[k] for k in _TXL_FIELDS if k in raw})
        return config_from_hf(raw)

    def txl_config_json(self) -> str:
        """``config.json`` as txl writes it (``model_type`` included), with ``architectures`` for transformers."""
        data = json.loads(self.to_txl().to_json())
        data["architectures"] = list(getattr(self, "architectures", None) or ["TransfoXLForCausalLM"])
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, save_directory: str | Path, push_to_hub: bool = False, **kwargs: Any) -> None:
        """Write ``config.json`` in txl's form (:meth:`txl_config_json`); pushing to the Hub is refused."""
        if push_to_hub:
            raise ConfigError("push_to_hub is not supported here: save, then upload the directory with huggingface_hub")
        path = Path(save_directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(self.txl_config_json(), encoding="utf-8")
