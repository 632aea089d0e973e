"""The package's shape, checked: layers import only downwards, no module reaches into another's
privates, and modules and functions stay small enough to read (docs/design.md, "Layout")."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "shardpack"
# the data flow, bottom to top: a module may import its own layer and the ones before it
LAYERS = ("core", "format", "storage", "images", "read", "write", "order", "loader",
          "transforms", "inspect", "interop", "cli")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _dotted(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _imports(path: pathlib.Path):
    """(imported module, names, line) for every shardpack import in the module, relative ones
    resolved."""
    tree = ast.parse(path.read_text())
    here = _dotted(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "shardpack":
                yield module, [a.name for a in node.names], node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "shardpack":
                    yield alias.name, [], node.lineno


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_down_the_layers(path):
    here = _layer(_dotted(path))
    if here is None:  # shardpack/__init__.py: the public API gathers from every layer
        return
    for module, names, line in _imports(path):
        targets = [module] + [f"{module}.{n}" for n in names]
        there = next((_layer(t) for t in targets if _layer(t)), None)
        if module == "shardpack" and not there:
            pytest.fail(f"{path.name}:{line} imports the top-level package: take it from its layer")
        assert there is not None, f"{path.name}:{line}: {module} is in no layer"
        assert LAYERS.index(there) <= LAYERS.index(here), (
            f"{path.relative_to(PACKAGE)}:{line} ({here}) imports {module} ({there}), "
            "a later layer")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_modules_privates(path):
    for module, names, line in _imports(path):
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{path.relative_to(PACKAGE)}:{line} imports {private} from {module}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)}: over 500 lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_FUNCTION_LINES, (
                f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}() is {size} lines")


def test_torch_is_imported_in_one_module():
    importers = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                importers.append(str(path.relative_to(PACKAGE)))
    assert sorted(set(importers)) == ["loader/torchenv.py"]


def _public_definitions(tree: ast.Module):
    """Module-level public functions and classes, and the public methods of public classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                        yield f"{node.name}.{item.name}", item


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_public_definitions_have_docstrings(path):
    missing = [name for name, node in _public_definitions(ast.parse(path.read_text()))
               if not ast.get_docstring(node)]
    assert not missing, f"{path.relative_to(PACKAGE)}: no docstring: {', '.join(missing)}"
