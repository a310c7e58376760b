"""Names in the source that would fail only when their line runs: checked statically here, because CI has no GPU and
the GPU tests (tests/*/test_*_gpu.py), the device scripts and the tools run only on a GPU machine.

1. pyflakes on every Python file of the repository: an undefined name, a local used before it is assigned, an
   ``__all__`` entry that does not exist (pyflakes skips ``__init__.py``: those are imported and checked), a
   duplicate argument, ``return`` / ``yield`` outside a function. Unused imports and variables are not failures
   (the families' kernel modules re-export jit functions by import).
2. ``monkeypatch.setattr(<module>, "<name>", ...)`` in the tests, where ``<module>`` is a tsct module bound by an
   import in the same file: the module must have ``<name>`` (pytest's setattr raises otherwise, on the GPU machine).
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

from pyflakes import checker as pyflakes_checker
from pyflakes import messages as M

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("python", "tests", "tools", "scripts", "examples", "ci", "cutedsl")
FAILURES = (M.UndefinedName, M.UndefinedLocal, M.UndefinedExport, M.DuplicateArgument, M.ReturnOutsideFunction,
            M.YieldOutsideFunction)


def _sources() -> list[Path]:
    return sorted(p for d in DIRS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py"))


def _import(name: str):
    """The module ``name``; None when it needs a third-party package this machine lacks (Triton on a CPU machine); a
    missing tsct module raises."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if (e.name or "").startswith("tsct"):
            raise
        return None


def test_the_walk_finds_the_gpu_tests():
    files = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert "tests/ops/test_sort_by_expert_gpu.py" in files and "python/tsct/ops/grouped_glu.py" in files


def test_no_undefined_names():
    found = []
    for path in _sources():
        text = path.read_text()
        tree = ast.parse(text, filename=str(path))
        checker = pyflakes_checker.Checker(tree, filename=str(path.relative_to(ROOT)))
        found += [str(m) for m in checker.messages if isinstance(m, FAILURES)]
    assert not found, "\n".join(found)


def test_every_all_entry_exists():
    """pyflakes does not check ``__all__`` in ``__init__.py`` files: each package's ``__all__`` names attributes it
    has."""
    missing, seen = [], 0
    for init in sorted((ROOT / "python" / "tsct").rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(ROOT / "python").parts)
        mod = _import(name)
        if mod is None:
            continue
        for entry in getattr(mod, "__all__", ()):
            seen += 1
            if not hasattr(mod, entry):
                missing.append(f"{name}.__all__: {entry!r}")
    assert seen > 20
    assert not missing, missing


def test_pyflakes_sees_a_name_used_before_assignment():
    tree = ast.parse("def f(p):\n    if p['a'] and q['b']:\n        return 1\n    q = p\n")
    msgs = pyflakes_checker.Checker(tree, filename="x.py").messages
    assert any(isinstance(m, FAILURES) for m in msgs), msgs


def _tsct_module_aliases(tree: ast.AST) -> dict[str, str]:
    """{local name: module path} for every ``import tsct.x as n`` / ``from tsct(.x) import m [as n]`` in the file
    (any scope) that binds a module of tsct (``from tsct.ops import grouped_glu`` binds the function: not listed).
    A module that needs a missing third-party package (Triton on a CPU machine) is left out; a missing tsct module
    raises."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tsct"):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else "tsct"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tsct") and not node.level:
            parent = _import(node.module)
            for a in node.names:
                obj = getattr(parent, a.name, None) if parent is not None else None
                if obj is None and parent is not None:
                    obj = _import(f"{node.module}.{a.name}")
                if isinstance(obj, types.ModuleType):
                    out[a.asname or a.name] = obj.__name__
    return out


def _setattr_targets(path: Path) -> list[tuple[int, str, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = _tsct_module_aliases(tree)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "monkeypatch"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            raising = [k for k in node.keywords if k.arg == "raising"]
            if raising and isinstance(raising[0].value, ast.Constant) and raising[0].value.value is False:
                continue  # the test means to add the attribute
            out.append((node.lineno, aliases[node.args[0].id], node.args[1].value))
    return out


def test_monkeypatched_module_attributes_exist():
    missing, seen = [], 0
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for line, module, name in _setattr_targets(path):
            seen += 1
            if not hasattr(importlib.import_module(module), name):
                missing.append(f"{path.relative_to(ROOT)}:{line}: {module} has no attribute {name!r}")
    assert seen > 20  # the walk finds the tests' patches (a broken resolver would check nothing)
    assert not missing, "\n".join(missing)


def test_a_removed_attribute_is_found(tmp_path):
    p = tmp_path / "test_x.py"
    p.write_text("def test_a(monkeypatch):\n    from tsct.ops import routing as R\n"
                 "    monkeypatch.setattr(R, '_warned', set())\n    monkeypatch.setattr(R, 'sort_by_expert', None)\n")
    targets = _setattr_targets(p)
    assert targets == [(3, "tsct.ops.routing", "_warned"), (4, "tsct.ops.routing", "sort_by_expert")]
    routing = importlib.import_module("tsct.ops.routing")
    assert not hasattr(routing, "_warned") and hasattr(routing, "sort_by_expert")
