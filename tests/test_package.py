"""The package as a whole: the public API re-exported lazily, subpackages that load no more than they need, and
a test suite that mirrors the package (a test module per source module)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import txl
from tests.helpers import REPO, subprocess_env

SRC = REPO / "src" / "txl"


def test_public_api_is_reexported() -> None:
    from txl.model import TransformerXLLM

    assert txl.TransformerXLLM is TransformerXLLM
    for name in txl.__all__:
        assert getattr(txl, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        txl.nope  # noqa: B018


@pytest.mark.integration
def test_importing_the_data_layer_loads_no_model_code(tmp_path) -> None:
    code = ("import sys, txl.data, txl.store.checkpoint; "
            "print(sorted(m for m in sys.modules if m.startswith(('txl.model', 'txl.train', 'txl.inference'))))")
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env(tmp_path), capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_every_source_module_has_a_test_module() -> None:
    """``src/txl/a/b.py`` is tested in ``tests/a/test_b.py`` (package ``__init__`` files re-export only)."""
    missing = []
    for module in sorted(SRC.rglob("*.py")):
        if module.name in ("__init__.py", "__main__.py"):
            continue
        rel = module.relative_to(SRC)
        test = REPO / "tests" / rel.parent / f"test_{rel.name}"
        if not test.is_file():
            missing.append(str(test.relative_to(REPO)))
    assert not missing, f"source modules without a test module: {missing}"


def test_no_source_module_is_over_400_lines() -> None:
    sizes = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
