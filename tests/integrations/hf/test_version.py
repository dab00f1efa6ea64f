"""transformers 5 or later, or one line saying how to get it."""

from __future__ import annotations

import sys

import pytest

transformers = pytest.importorskip("transformers", minversion="5.17")

from transformer_xl import ConfigError  # noqa: E402
from transformer_xl.integrations.hf.version import check_transformers  # noqa: E402


def test_transformers_4_or_none_is_refused_in_one_line(monkeypatch) -> None:
    assert check_transformers() == transformers.__version__
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.6")
    with pytest.raises(ConfigError, match=r"needs transformers >= 5.17 \(found 4.57.6; transformers 4 has its own"):
        check_transformers()
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.3.0")
    with pytest.raises(ConfigError, match=r"needs transformers >= 5.17 \(found 5.3.0\): pip install"):
        check_transformers()
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.17.0.dev0")
    assert check_transformers() == "5.17.0.dev0"
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r"needs Hugging Face transformers >= 5.17: pip install -e '.\[hf\]'"):
        check_transformers()
