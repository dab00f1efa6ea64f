"""The package as a whole: the public API re-exported lazily, subpackages that load no more than they need, and
a test suite that mirrors the package (a test module per source module)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

import transformer_xl
from tests.helpers import REPO, subprocess_env

SRC = REPO / "src" / "transformer_xl"


def test_public_api_is_reexported() -> None:
    from transformer_xl.model import TransformerXLLM

    assert transformer_xl.TransformerXLLM is TransformerXLLM
    import importlib

    assert len(transformer_xl.__all__) == len(set(transformer_xl.__all__)) > 10
    for name in transformer_xl.__all__:  # each name is the object its defining module holds under that name
        obj = getattr(transformer_xl, name)
        if name == "__version__":
            assert isinstance(obj, str) and obj[0].isdigit()
            continue
        home = importlib.import_module(obj.__module__)
        assert getattr(home, obj.__name__) is obj and obj.__name__ == name, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        transformer_xl.nope  # noqa: B018


@pytest.mark.integration
def test_importing_the_data_layer_loads_no_model_code(tmp_path) -> None:
    code = ("import sys, transformer_xl.data, transformer_xl.store.checkpoint; "
            "print(sorted(m for m in sys.modules "
            "if m.startswith(('transformer_xl.model', 'transformer_xl.train', 'transformer_xl.inference'))))")
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env(tmp_path), capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_every_source_module_has_a_test_module() -> None:
    """``src/transformer_xl/a/b.py`` is tested in ``tests/a/test_b.py`` (package ``__init__`` files re-export only)."""
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


def test_the_import_graph_has_no_cycle() -> None:
    """No module imports itself through others (imports only for type checking left out, as for lint-imports)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("transformer_xl", exclude_type_checking_imports=True)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(edges.get(module, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def _code_lines(path) -> list[tuple[int, str]]:
    """(line number, whitespace-folded text) of the lines that carry code: no blanks, comments, imports or lone
    punctuation (what a repeated block is made of, as the ``duplicates`` tool counts it)."""
    out = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = " ".join(raw.split())
        if not line or line.startswith(("#", "import ", "from ")) or not any(c.isalnum() for c in line):
            continue
        out.append((n, line))
    return out


def test_no_block_of_six_code_lines_is_repeated_in_src() -> None:
    """The same six consecutive code lines in two places of ``src/`` are one function waiting to be written
    (exact repeats; the ``duplicates`` development tool also finds blocks alike but for names)."""
    first: dict[tuple[str, ...], tuple[str, int]] = {}
    repeats = []
    for path in sorted(SRC.rglob("*.py")):
        lines = _code_lines(path)
        for i in range(len(lines) - 5):
            block = tuple(text for _, text in lines[i:i + 6])
            here = (str(path.relative_to(SRC)), lines[i][0])
            there = first.setdefault(block, here)
            if there != here and (there[0] != here[0] or here[1] - there[1] >= 6):  # not the same lines again
                repeats.append(f"{there[0]}:{there[1]} ~ {here[0]}:{here[1]}")
    assert not repeats, repeats[:5]


def _private_imports(path) -> list[str]:
    """``from transformer_xl.x import _y`` and ``m._y`` for a module ``m`` of the package, in one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_xl"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} imports {node.module}.{alias.name}")
                elif (SRC / node.module.replace(".", "/").removeprefix("transformer_xl").lstrip("/")
                      / f"{alias.name}.py").is_file():
                    modules.add(alias.asname or alias.name)  # from transformer_xl.a import module
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name.startswith("transformer_xl") and a.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.relative_to(SRC)}:{node.lineno} reads {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    """A name with a leading underscore belongs to its module: another module that needs it asks for a public one."""
    found = [hit for path in sorted(SRC.rglob("*.py")) for hit in _private_imports(path)]
    assert not found, found


def test_the_tests_import_only_the_package() -> None:
    """The suite tests ``transformer_xl`` (and its own helpers): no benchmark or script is imported."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[0] in ("benchmarks", "scripts", "examples")]
    assert not found, found
