"""``import transformer_xl.hf``: txl models in Hugging Face transformers 5's Auto classes (``model_type="transfo-xl"``).

Importing this module registers them (transformers discovers no plugins); then::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("transfo-xl/transfo-xl-wt103")

The classes live in :mod:`transformer_xl.integrations.hf` (the ``hf`` extra).
"""

from __future__ import annotations

from transformer_xl.integrations.hf import (
    TransfoXLConfig,
    TransfoXLForCausalLM,
    TransfoXLMemory,
    TransfoXLTokenizerFast,
    register,
)

__all__ = ["TransfoXLConfig", "TransfoXLForCausalLM", "TransfoXLMemory", "TransfoXLTokenizerFast", "register"]
