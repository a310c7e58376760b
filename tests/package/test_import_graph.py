"""The import graph of the tsct package, read statically (``ast``) from python/tsct: no import circle among
module-level imports, and a dispatch table that imports nothing above it.

Every ``import`` / ``from ... import`` naming a tsct module is an edge, at module level or inside a function
(a deferred import), resolved to the module it loads: ``from tsct.kernels import triton_glu`` -> the module
``tsct.kernels.triton_glu``, ``from tsct.ops._validate import validate`` -> ``tsct.ops._validate``, relative
imports against the importing package. A module's own parent packages are not edges (Python initialises them
first, in any order of imports).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "python" / "tsct"
# the layers above the dispatch table: it may import the kernel families (lazily), never these
ABOVE_DISPATCH = ("tsct.ops", "tsct.firstuse", "tsct.selftest", "tsct.selftest_child", "tsct.nn", "tsct.bench",
                  "tsct.probe")


def _modules() -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package)} of every module under python/tsct."""
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _module_level(tree: ast.Module) -> set[int]:
    """ids of the import nodes that run when the module is imported (module body, incl. if / try blocks)."""
    found: set[int] = set()

    def walk(body):
        for n in body:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                found.add(id(n))
            elif isinstance(n, (ast.If, ast.Try, getattr(ast, "TryStar", ast.Try), ast.With)):
                for field in ("body", "orelse", "finalbody"):
                    walk(getattr(n, field, []))
                for h in getattr(n, "handlers", []):
                    walk(h.body)
    walk(tree.body)
    return found


def import_graph() -> dict[str, dict[str, bool]]:
    """{module: {imported tsct module: True if imported at module level, False if only inside a function}}."""
    mods = _modules()
    graph: dict[str, dict[str, bool]] = {}
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        top = _module_level(tree)
        package = name if is_pkg else name.rpartition(".")[0]
        edges = graph.setdefault(name, {})
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            else:
                continue
            for t in targets:
                if not (t == "tsct" or t.startswith("tsct.")):
                    continue
                while t not in mods:  # an attribute of a module -> that module
                    t = t.rpartition(".")[0]
                if t != name and not name.startswith(t + "."):
                    edges[t] = edges.get(t, False) or id(node) in top
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_is_read(graph):
    """The reader sees module-level and deferred imports, and resolves submodules and attributes."""
    assert graph["tsct.ops.grouped_glu"]["tsct.dispatch"] is True
    assert graph["tsct.dispatch"]["tsct.kernels.triton_glu"] is False  # inside a function
    assert graph["tsct"]["tsct.ops"] is True
    assert "tsct.ops._validate" in graph["tsct.ops.grouped_glu"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_at_module_level(graph):
    top = {m: {t for t, at_top in edges.items() if at_top} for m, edges in graph.items()}
    cycles = _cycles(top)
    assert not cycles, "module-level import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_dispatch_imports_nothing_above_it(graph):
    """tsct.dispatch is the table and the selection: the first-use self-tests, the public ops, the layers and the
    bench sit above it and are never imported by it, at module level or inside a function."""
    bad = sorted(t for t in graph["tsct.dispatch"] if any(t == a or t.startswith(a + ".") for a in ABOVE_DISPATCH))
    assert not bad, f"tsct.dispatch imports {bad}"


def test_kernel_families_do_not_import_the_first_use_machinery(graph):
    """A kernel family reads its first-use verdict from dispatch (recorded by tsct.ops); it never starts one."""
    bad = sorted((m, t) for m, edges in graph.items() if m.startswith("tsct.kernels")
                 for t in edges if t in ("tsct.firstuse", "tsct.selftest", "tsct.selftest_child") or
                 t.startswith("tsct.ops"))
    assert not bad, bad


FAMILIES = ("tsct.kernels.triton_glu", "tsct.kernels.triton_lowbit")
COMMON = "tsct.kernels.triton_common"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_triton_families_are_peers_on_the_shared_runtime(graph):
    """The shared Triton runtime (tsct.kernels.triton_common) imports neither Triton family; each family imports the
    runtime and never the other family (module level or deferred)."""
    bad = sorted((m, t) for m, edges in graph.items() if _within(m, COMMON) for t in edges
                 if any(_within(t, f) for f in FAMILIES))
    assert not bad, f"the shared runtime imports a family: {bad}"
    for fam in FAMILIES:
        other = next(f for f in FAMILIES if f != fam)
        bad = sorted((m, t) for m, edges in graph.items() if _within(m, fam) for t in edges if _within(t, other))
        assert not bad, f"{fam} imports {other}: {bad}"
        assert any(_within(t, COMMON) for m, edges in graph.items() if _within(m, fam) for t in edges), fam


def test_quant_reaches_the_first_use_machinery_through_firstuse_only(graph):
    """tsct.quant gates the native kernels' first use through tsct.firstuse (the verdict) and tsct.dispatch (the
    table), imported at module level as tsct.ops imports them; it never imports the layers that use quant: the ops,
    the self-test and its child (they quantize), the layers, the bench, the probe."""
    assert graph["tsct.quant._backend"].get("tsct.firstuse") is True
    assert graph["tsct.quant._backend"].get("tsct.dispatch") is True
    above = ("tsct.ops", "tsct.selftest", "tsct.selftest_child", "tsct.nn", "tsct.bench", "tsct.probe")
    bad = sorted((m, t) for m, edges in graph.items() if _within(m, "tsct.quant") for t in edges
                 if any(_within(t, a) for a in above))
    assert not bad, bad
