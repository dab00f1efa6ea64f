"""The public API is pinned: every name in ``__all__`` of the package and its main subpackages, with its signature
(``inspect.signature``; for a class, its constructor and public methods), equals ``tests/assets/public_api.txt``.

A change to the public API is then deliberate: regenerate the list with ``python -m tests.test_public_api`` and say
what moved, was renamed or removed in ``CHANGELOG.md`` (docs/api.md renders the API for users)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

#: The modules whose ``__all__`` is the public API.
MODULES = ("transformer_xl", "transformer_xl.model", "transformer_xl.data", "transformer_xl.inference",
           "transformer_xl.interop", "transformer_xl.train")
PINNED = Path(__file__).parent / "assets" / "public_api.txt"


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"


def _methods(cls: type) -> list[str]:
    """The public methods, class methods and properties a class defines itself (not those inherited from torch or
    ``object``, which are not ours to pin)."""
    out = []
    for name, value in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            out.append(f"    .{name} (property)")
        elif isinstance(value, (classmethod, staticmethod)):
            out.append(f"    .{name}{_signature(getattr(cls, name))}")
        elif inspect.isfunction(value):
            out.append(f"    .{name}{_signature(value)}")
    return out


def public_api() -> list[str]:
    """One line per exported name (and per public method of an exported class): what the pinned file holds."""
    lines = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines.append(f"[{module_name}]")
        for name in sorted(module.__all__):
            obj = getattr(module, name)
            if inspect.isclass(obj):
                lines.append(f"class {name}{_signature(obj)}")
                lines.extend(_methods(obj))
            elif callable(obj):
                lines.append(f"def {name}{_signature(obj)}")
            else:
                lines.append(f"{name}: {type(obj).__name__}")
    return lines


def test_public_api_is_the_pinned_one() -> None:
    pinned = PINNED.read_text(encoding="utf-8").splitlines()
    current = public_api()
    added = [line for line in current if line not in pinned]
    removed = [line for line in pinned if line not in current]
    assert not added and not removed, (
        f"the public API changed (added: {added[:5]}, removed: {removed[:5]}): if on purpose, run "
        "`python -m tests.test_public_api` and record the change in CHANGELOG.md")


def test_every_exported_name_exists_and_has_a_docstring() -> None:
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        assert len(set(module.__all__)) == len(module.__all__), module_name
        for name in module.__all__:
            obj = getattr(module, name)
            assert name == "__version__" or inspect.getdoc(obj), f"{module_name}.{name} has no docstring"


def test_docs_api_documents_every_exported_name() -> None:
    """The API reference (``docs/api.md``) renders every exported name from its docstring (a mkdocstrings ``:::``
    line under its module; a name the root re-exports from ``transformer_xl.model`` is documented there once).
    ``tests/test_docs.py`` builds the site and finds each entry in the HTML."""
    text = (Path(__file__).parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [f"{m}.{name}" for m in MODULES for name in importlib.import_module(m).__all__
               if name != "__version__" and not any(f"\n::: {home}.{name}\n" in text for home in MODULES)]
    assert not missing, f"docs/api.md does not render {missing}"

if __name__ == "__main__":
    PINNED.write_text("\n".join(public_api()) + "\n", encoding="utf-8")
    print(f"wrote {PINNED} ({sum(not line.startswith(' ') for line in public_api())} names)", file=sys.stderr)
