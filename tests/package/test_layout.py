"""The tests' layout: one folder of tests/ per folder it tests, GPU test files named ``*_gpu.py`` and marked ``gpu``.

``scripts/gpu_suite.sh all`` runs ``tests/*/test_*_gpu.py`` and CI collects everything else without a GPU, so a GPU
test under another name would be left out of the GPU run, and an unmarked one would fail on CI instead of skipping.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PKG = ROOT / "python" / "tsct"
# folders of tests/ that are not a subpackage of tsct: the package's top-level modules and the package as a whole,
# and the top-level folders of the repository that have tests of their own
OTHER = {"package", "cutedsl", "tools", "examples"}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def _marked_gpu(path: Path) -> bool:
    """Whether the module sets ``pytestmark`` to (a list holding) ``pytest.mark.gpu``."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return "pytest.mark.gpu" in ast.unparse(node.value)
    return False


def test_each_test_file_sits_in_the_folder_of_what_it_tests():
    subpackages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    misplaced = [p.relative_to(TESTS).as_posix() for p in _test_files()
                 if len(p.relative_to(TESTS).parts) != 2 or p.parent.name not in subpackages | OTHER]
    assert not misplaced, f"test files outside tests/<{sorted(subpackages | OTHER)}>/: {misplaced}"
    assert {p.parent.name for p in _test_files()} >= {"ops", "quant", "kernels", "native", "nn", "package"}


def test_gpu_test_files_are_named_and_marked_so():
    files = _test_files()
    wrong = [p.relative_to(TESTS).as_posix() for p in files if _marked_gpu(p) != p.name.endswith("_gpu.py")]
    assert not wrong, f"marked gpu but not named *_gpu.py, or the other way round: {wrong}"
    assert sum(p.name.endswith("_gpu.py") for p in files) >= 15


def test_basenames_are_unique():
    """pytest's default (prepend) import mode imports a test module by its basename."""
    dup = [n for n, c in Counter(p.name for p in _test_files()).items() if c > 1]
    assert not dup, dup
