"""The package's shape, checked: layers import only downwards, no module reaches into another's
privates, and modules and functions stay small enough to read (docs/design.md, "Layout")."""

from __future__ import annotations

import ast
import pathlib


PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "shardpack"
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


def _import_problems(path) -> list[str]:
    here = _layer(_dotted(path))
    if here is None:  # shardpack/__init__.py: the public API gathers from every layer
        return []
    problems = []
    for module, names, line in _imports(path):
        targets = [module] + [f"{module}.{n}" for n in names]
        there = next((_layer(t) for t in targets if _layer(t)), None)
        where = f"{path.relative_to(PACKAGE)}:{line}"
        if there is None:
            problems.append(f"{where} imports {module}, which is in no layer")
        elif LAYERS.index(there) > LAYERS.index(here):
            problems.append(f"{where} ({here}) imports {module} ({there}), a later layer")
    return problems


def _all(check) -> list[str]:
    return [problem for path in _modules() for problem in check(path)]


def test_imports_run_down_the_layers():
    assert not _all(_import_problems), "\n".join(_all(_import_problems))


def _private_imports(path) -> list[str]:
    return [f"{path.relative_to(PACKAGE)}:{line} imports {private} from {module}"
            for module, names, line in _imports(path)
            if (private := [n for n in names if n.startswith("_") and not n.startswith("__")])]


def test_no_module_imports_another_modules_privates():
    assert not _all(_private_imports), "\n".join(_all(_private_imports))


def _size_problems(path) -> list[str]:
    text = path.read_text()
    problems = [f"{path.relative_to(PACKAGE)}: {text.count(chr(10))} lines"] \
        if text.count("\n") > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_FUNCTION_LINES:
                problems.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}() is "
                                f"{size} lines")
    return problems


def test_modules_and_functions_stay_small():
    assert not _all(_size_problems), "\n".join(_all(_size_problems))


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


def _missing_docstrings(path) -> list[str]:
    return [f"{path.relative_to(PACKAGE)}: {name} has no docstring"
            for name, node in _public_definitions(ast.parse(path.read_text()))
            if not ast.get_docstring(node)]


def test_public_definitions_have_docstrings():
    assert not _all(_missing_docstrings), "\n".join(_all(_missing_docstrings))


def test_no_image_format_is_named_outside_its_codec():
    """Each image format lives in its codec module (images/formats/): its name as a literal
    ("JPEG") or its magic bytes anywhere else would be a second place to change when a format is
    added or fixed.  Lower-case peer encoding names ("jpeg" in an MDS column) are field
    extensions, not formats, and stay where the peers' readers are."""
    from shardpack.images.registry import CODECS

    names = {codec.name for codec in CODECS}
    magics = [m for codec in CODECS for m in codec.magics if len(m) >= 2] + [b"\xff\xd8"]
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("images/formats/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if (isinstance(value, str) and value in names) or (
                    isinstance(value, bytes) and any(value.startswith(m) for m in magics)):
                found.append(f"{rel}:{node.lineno}: {value!r}")
    assert not found, "\n".join(found)
    assert len(names) == len(CODECS)  # one codec a format
