"""The transformers this integration needs: 5.17 or later (4.x still has its own, deprecated TransfoXL; 5.17, 5.23
and 5.24 were tested, 5.0's configuration classes are built otherwise)."""

from __future__ import annotations

from transformer_xl.errors import ConfigError, install_hint

#: The oldest transformers release the integration was tested with.
MINIMUM = (5, 17)


def check_transformers() -> str:
    """The installed transformers version; a one-line :class:`ConfigError` when it is missing or older than 5.17."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"transformer_xl.hf needs Hugging Face transformers >= 5.17: {install_hint('hf')}") from None
    version = transformers.__version__
    parts = tuple(int(p) if p.isdigit() else 0 for p in version.split(".")[:2])
    if parts < MINIMUM:
        why = "; transformers 4 has its own deprecated TransfoXL" if parts[0] < 5 else ""
        raise ConfigError(f"transformer_xl.hf needs transformers >= 5.17 (found {version}{why}): "
                          f"{install_hint('hf')}")
    return version
