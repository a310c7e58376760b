"""The source fingerprint of a Triton kernel: which source of a kernel a cubin (or a proxy run) was built from.

    source_key(fn) -> str                     16 hex digits for one ``@triton.jit`` kernel
    source_keys(module, names) -> {name: key} the same for several kernels of one module

What the fingerprint covers (the source part of what Triton's ``JITFunction.cache_key`` covers), and nothing more:

- the kernel's text from its ``def`` line to its end (decorators dropped, the block dedented, trailing blanks of each
  line dropped; comments and the docstring are part of it, as in Triton's key);
- the same for every ``@triton.jit`` function it calls, transitively: each name (or ``module.attr`` chain) in a
  body that resolves, in that function's globals or closure, to a jit function; a helper taken from another
  module (both Triton families import ``triton_common``'s helpers) counts as the function it is;
- the values of the globals a body reads that are ``tl.constexpr`` or plain numbers, strings or tuples of them
  (Triton folds these into the kernel), and a helper's ``noinline`` flag.

What it leaves out, unlike Triton's key, so that it depends on the source alone: the line numbers (an edit above
a kernel moves it without changing it), the module names (the AOT build loads the modules under other names
than the package does), the Triton version, and everything a specialization adds (signature, constexpr
arguments, warps, stages, target arch): one kernel has one fingerprint for every arch and variant. The digest is
sha256 over the kernel's entry followed by its callees' entries in sorted order, cut to 16 hex digits.

Needs the kernel objects, hence Triton (or its interpreter) to have imported the module; imports nothing itself
beyond the standard library.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import textwrap

__all__ = ["source_key", "source_keys"]

_TRITON_MODULES = ("triton", "math", "copy")  # names resolved into these are Triton's language, not the source


def _is_jit(obj) -> bool:
    """A ``@triton.jit`` function (compiled, or the interpreter's stand-in under TRITON_INTERPRET=1)."""
    mod = type(obj).__module__ or ""
    return mod.startswith("triton.runtime.") and inspect.isfunction(getattr(obj, "fn", None))


def _constant(obj):
    """The canonical text of a global a kernel reads when Triton folds it in (constexpr, number, string), else None."""
    if type(obj).__name__ == "constexpr" and (type(obj).__module__ or "").startswith("triton."):
        obj = obj.value
    if isinstance(obj, (bool, int, float, str)) or (isinstance(obj, tuple) and all(
            isinstance(v, (bool, int, float, str)) for v in obj)):
        return repr(obj)
    return None


def _def_source(fn) -> str:
    src = textwrap.dedent(inspect.getsource(fn))
    m = re.search(r"^def\s+\w+\s*\(", src, re.M)
    if m is None:
        raise ValueError(f"no 'def' line in the source of {fn.__qualname__}")
    return "\n".join(line.rstrip() for line in src[m.start():].splitlines()) + "\n"


def _entries(jf, out: dict[int, str]) -> None:
    """Add ``jf`` and every jit function it reaches to ``out`` (id -> entry text)."""
    if id(jf) in out:
        return
    out[id(jf)] = ""  # placeholder: recursion ends here
    fn = jf.fn
    src = _def_source(fn)
    tree = ast.parse(src)
    fdef = tree.body[0]
    args = {a.arg for a in (*fdef.args.posonlyargs, *fdef.args.args, *fdef.args.kwonlyargs)}
    scope = dict(fn.__globals__)
    if fn.__closure__:
        scope.update(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
    consts, calls = {}, []
    for node in ast.walk(fdef):
        if isinstance(node, ast.Attribute):
            chain = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if not isinstance(node, ast.Name) or node.id in args or node.id not in scope:
                continue
            obj = scope[node.id]
            if (getattr(obj, "__name__", "") or "").split(".")[0] in _TRITON_MODULES:
                continue
            name = node.id
            for attr in reversed(chain):
                obj, name = getattr(obj, attr, None), f"{name}.{attr}"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in args:
            if node.id not in scope:
                continue
            obj, name = scope[node.id], node.id
        else:
            continue
        if _is_jit(obj):
            calls.append(obj)
        elif (c := _constant(obj)) is not None:
            consts[name] = c
    for c in calls:
        _entries(c, out)
    noinline = " noinline" if getattr(jf, "noinline", False) else ""
    out[id(jf)] = (f"{fn.__name__}{noinline}\n{src}"
                   + "".join(f"global {k} = {v}\n" for k, v in sorted(consts.items())))


def source_key(fn) -> str:
    """16 hex digits: sha256 of the source of the ``@triton.jit`` kernel ``fn`` and of every jit function it calls
    (module docstring: what is covered). Raises TypeError when ``fn`` is not a jit function."""
    if not _is_jit(fn):
        raise TypeError(f"fn must be a @triton.jit function, got {type(fn).__name__}")
    out: dict[int, str] = {}
    _entries(fn, out)
    root = out.pop(id(fn))
    h = hashlib.sha256(root.encode())
    for e in sorted(out.values()):
        h.update(b"\0" + e.encode())
    return h.hexdigest()[:16]


def source_keys(module, names) -> dict[str, str]:
    """{name: source_key(module.name)} for kernels of one imported kernel module."""
    return {n: source_key(getattr(module, n)) for n in names}
