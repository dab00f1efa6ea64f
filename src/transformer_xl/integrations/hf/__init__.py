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

import warnings

from transformer_xl.errors import ConfigError
from transformer_xl.integrations.hf.version import check_transformers

check_transformers()

from transformer_xl.integrations.hf.cache import TransfoXLMemory  # noqa: E402 - after the version check
from transformer_xl.integrations.hf.config import TransfoXLConfig  # noqa: E402 - after the version check
from transformer_xl.integrations.hf.modeling import TransfoXLForCausalLM  # noqa: E402 - after the version check
from transformer_xl.integrations.hf.tokenizer import TransfoXLTokenizerFast  # noqa: E402 - after the version check

__all__ = ["TransfoXLConfig", "TransfoXLForCausalLM", "TransfoXLMemory", "TransfoXLTokenizerFast", "register"]


def register() -> None:
    """Make ``"transfo-xl"`` known to ``AutoConfig``, ``AutoModelForCausalLM`` and ``AutoTokenizer`` (again: a
    no-op), then check that each Auto class resolves it to this package's class. transformers may one day refuse
    the name (a model type it removed, or a name it will not let ``register`` replace): then a one-line
    :class:`~transformer_xl.errors.ConfigError` says so and names the fallback, the classes themselves
    (``TransfoXLForCausalLM.from_pretrained``, ``TransfoXLTokenizerFast.from_pretrained``), which need no
    registration."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if _registered():
        return
    try:
        AutoConfig.register(TransfoXLConfig.model_type, TransfoXLConfig, exist_ok=True)
        AutoModelForCausalLM.register(TransfoXLConfig, TransfoXLForCausalLM, exist_ok=True)
        AutoTokenizer.register(TransfoXLConfig, fast_tokenizer_class=TransfoXLTokenizerFast, exist_ok=True)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(_refused(f"refuses to register it ({first})")) from None
    if not _registered():
        raise ConfigError(_refused("registered it, but its Auto classes resolve it to another class"))


def _registered() -> bool:
    """Whether each Auto class resolves ``"transfo-xl"`` to this package's class."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    try:
        config = AutoConfig.for_model(TransfoXLConfig.model_type)
        model = MODEL_FOR_CAUSAL_LM_MAPPING[TransfoXLConfig]
        tokenizers = TOKENIZER_MAPPING[TransfoXLConfig]
    except (ValueError, KeyError):
        return False
    tokenizers = tokenizers if isinstance(tokenizers, tuple | list) else (tokenizers,)
    return type(config) is TransfoXLConfig and model is TransfoXLForCausalLM and TransfoXLTokenizerFast in tokenizers


def _refused(why: str) -> str:
    import transformers

    return (f"transformers {transformers.__version__} {why} for model_type {TransfoXLConfig.model_type!r}: the Auto "
            "classes cannot load txl models; load them with transformer_xl.hf.TransfoXLForCausalLM.from_pretrained "
            "and TransfoXLTokenizerFast.from_pretrained instead")


try:
    register()
except ConfigError as _exc:  # the classes themselves still work: say so once, and let the import go on
    warnings.warn(str(_exc), stacklevel=2)
