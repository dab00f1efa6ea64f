"""txl models through Hugging Face transformers 5: ``AutoConfig``, ``AutoModelForCausalLM`` and ``AutoTokenizer``
for ``model_type="transfo-xl"``, and so ``generate``, ``pipeline``, ``Trainer`` and the tools built on them
(minicons, lm-evaluation-harness's ``hf`` backend). The ``hf`` extra: ``pip install "transformer-xl[hf]"``.

transformers 5 removed TransfoXL and discovers no plugins, so the registration happens when this package is
imported: ``import transformer_xl.hf`` (or this module) once, then the Auto classes know ``"transfo-xl"``::

    import transformer_xl.hf  # noqa: F401  (registers "transfo-xl")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("transfo-xl/transfo-xl-wt103")
    tokenizer = AutoTokenizer.from_pretrained("transfo-xl/transfo-xl-wt103")

:func:`register` is idempotent. Modules: :mod:`.config`, :mod:`.modeling`, :mod:`.cache` (the memory as a
``Cache``), :mod:`.padding`, :mod:`.tokenizer`, :mod:`.resolve` (safe loading).
"""

from __future__ import annotations

from transformer_xl.integrations.hf.version import check_transformers

check_transformers()

from transformer_xl.integrations.hf.cache import TransfoXLMemory  # noqa: E402 - after the version check
from transformer_xl.integrations.hf.config import TransfoXLConfig  # noqa: E402 - after the version check
from transformer_xl.integrations.hf.modeling import TransfoXLForCausalLM  # noqa: E402 - after the version check
from transformer_xl.integrations.hf.tokenizer import TransfoXLTokenizerFast  # noqa: E402 - after the version check

__all__ = ["TransfoXLConfig", "TransfoXLForCausalLM", "TransfoXLMemory", "TransfoXLTokenizerFast", "register"]


def register() -> None:
    """Make ``"transfo-xl"`` known to ``AutoConfig``, ``AutoModelForCausalLM`` and ``AutoTokenizer`` (again: a
    no-op)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if TransfoXLConfig.model_type in CONFIG_MAPPING and CONFIG_MAPPING[TransfoXLConfig.model_type] is TransfoXLConfig:
        return
    AutoConfig.register(TransfoXLConfig.model_type, TransfoXLConfig, exist_ok=True)
    AutoModelForCausalLM.register(TransfoXLConfig, TransfoXLForCausalLM, exist_ok=True)
    AutoTokenizer.register(TransfoXLConfig, fast_tokenizer_class=TransfoXLTokenizerFast, exist_ok=True)


register()
