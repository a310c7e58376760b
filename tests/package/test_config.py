"""tsct.config is the one place that reads the environment at run time, and the README lists every variable.

The static check parses every module of python/tsct (``ast``): a read of ``os.environ`` (``.get``, ``[...]``,
``in``), ``os.getenv`` or ``from os import environ`` anywhere but tsct.config fails, except in the modules of
``ALLOWED`` (not run by the installed package at run time). Building a child's environment from a copy of this
one (``dict(os.environ, ...)``, ``os.environ.copy()``) and setting a variable are not reads.
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

from tsct import config

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "tsct"
#: module -> why it may read the environment itself
ALLOWED = {
    "tsct/config.py": "the one place",
    "tsct/bench/measure.py": "TSCT_BENCH_GIT_COMMIT, the benchmark's commit override (BUILD_AND_TOOL_VARIABLES)",
    "tsct/kernels/triton_common/aot_build.py": "runs at wheel-build time (sets Triton's variables for its compiles)",
}


def env_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) of every read of the process environment in ``source``."""
    tree = ast.parse(source)
    parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "os" and {a.name for a in n.names} & {"environ", "getenv",
                                                                                              "environb"}:
            out.append((n.lineno, "from os import environ/getenv"))
        if not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os"):
            continue
        if n.attr == "getenv":
            out.append((n.lineno, "os.getenv"))
        if n.attr not in ("environ", "environb"):
            continue
        up = parent.get(n)
        if isinstance(up, ast.Subscript) and not isinstance(up.ctx, ast.Load):
            continue  # os.environ[X] = ... / del os.environ[X]
        if isinstance(up, ast.Attribute) and up.attr == "copy":
            continue
        if isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "dict" and up.args and \
                up.args[0] is n:
            continue  # a child's environment: a copy of this one, with changes
        what = f"os.environ.{up.attr}" if isinstance(up, ast.Attribute) else "os.environ"
        out.append((n.lineno, what))
    return out


def test_the_reader_sees_reads_and_not_copies_or_writes():
    src = ("import os\nfrom os import getenv\na = os.environ.get('X')\nb = os.environ['Y']\nc = 'Z' in os.environ\n"
           "d = os.getenv('W')\nos.environ['V'] = '1'\ne = dict(os.environ, V='1')\nf = os.environ.copy()\n"
           "os.environ.setdefault('U', '1')\n")
    assert sorted(ln for ln, _ in env_reads(src)) == [2, 3, 4, 5, 6, 10]


def test_only_config_reads_the_environment():
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG.parent).as_posix()
        if rel in ALLOWED:
            continue
        bad += [f"{rel}:{ln}: {what}" for ln, what in env_reads(f.read_text())]
    assert not bad, "read the environment through tsct.config instead:\n" + "\n".join(bad)


def _readme_variables() -> dict[str, list[str]]:
    """{variable: its row's cells} of the README's environment-variable tables."""
    text = (ROOT / "README.md").read_text()
    sec = text[text.index("## Configuration"):]
    sec = sec[:sec.index("\n## ", 1)]
    rows = {}
    for line in sec.splitlines():
        m = re.match(r"\|\s*`([A-Z][A-Z0-9_]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
    return rows


def test_readme_lists_every_variable_once_with_its_default():
    rows = _readme_variables()
    want = config.VARIABLES + config.BUILD_AND_TOOL_VARIABLES
    assert sorted(rows) == sorted(v.name for v in want)
    assert len({v.name for v in want}) == len(want)
    for v in want:
        assert rows[v.name] == [v.type, v.meaning, v.default], v.name


def test_every_variable_named_in_the_package_is_listed():
    """A TSCT_* name in the package's code (not a C enum of the native ABI) is a listed variable."""
    listed = {v.name for v in config.VARIABLES + config.BUILD_AND_TOOL_VARIABLES}
    abi = re.compile(r"TSCT_(ERR|LAYOUT|SELFTEST_VERDICT)\w*")
    named = set()
    for f in PKG.rglob("*.py"):
        named |= {m for m in re.findall(r"\bTSCT_[A-Z0-9_]*[A-Z0-9]\b", f.read_text()) if not abi.fullmatch(m)}
    assert named <= listed, sorted(named - listed)


def test_a_bool_variable_takes_the_usual_words_and_warns_on_others(monkeypatch):
    for raw, want in (("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("False", False),
                      ("no", False), ("OFF", False), ("", True)):
        monkeypatch.setenv("TSCT_CHECK_VALUES", raw)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert config._env_flag("TSCT_CHECK_VALUES", True) is want, raw
    for raw in ("disable", "2", "nein"):
        monkeypatch.setenv("TSCT_CHECK_VALUES", raw)
        with pytest.warns(RuntimeWarning, match=f"TSCT_CHECK_VALUES={raw!r} is not a boolean .*using the default 1"):
            assert config._env_flag("TSCT_CHECK_VALUES", True) is True
        with pytest.warns(RuntimeWarning, match="using the default 0"):
            assert config._env_flag("TSCT_CHECK_VALUES", False) is False


def test_call_time_settings_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    assert config.triton_backend() == "auto"
    monkeypatch.setenv("TSCT_TRITON_BACKEND", " JIT ")
    assert config.triton_backend() == "jit"
    monkeypatch.setattr(config, "_warned_timeouts", set())
    for raw, want in (("", 300.0), ("7.5", 7.5), ("-1", 300.0), ("soon", 300.0), ("nan", 300.0), ("0", 300.0),
                      ("inf", config.MAX_SELFTEST_TIMEOUT_S), ("1e12", config.MAX_SELFTEST_TIMEOUT_S)):
        monkeypatch.setenv("TSCT_SELFTEST_TIMEOUT", raw)
        bad = raw in ("-1", "soon", "nan", "0")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert config.selftest_timeout() == want
            assert config.selftest_timeout() == want  # said once per value
        said = [str(w.message) for w in caught]
        assert said == ([f"TSCT_SELFTEST_TIMEOUT={raw!r} is not a positive number of seconds; using the default "
                         "300 s"] if bad else []), (raw, said)
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    assert config.aot_dir() == tmp_path
    monkeypatch.setenv("TSCT_AOT_DIR", "")
    assert config.aot_dir() is None
    monkeypatch.setenv("NVDISASM", "/x/nvdisasm")
    assert config.tool_path("nvdisasm") == "/x/nvdisasm"
    with pytest.raises(ValueError, match="name"):
        config.tool_path("ptxas")
    monkeypatch.setenv(config.ENV_SELFTEST_CHILD, "1")
    assert config.in_selftest_child()
