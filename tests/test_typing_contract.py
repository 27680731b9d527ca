"""The package ships ``py.typed``: what a type checker sees must match the runtime.

* every name of ``onnx_light_kv.__all__`` that the module loads lazily (``__getattr__``) is
  imported under ``TYPE_CHECKING``, so checkers see its real type (a module ``__getattr__``
  would make it, and any misspelt name, ``Any``), and ``__getattr__`` is hidden from them;
* every ``SessionOptions`` option (they live in ``__slots__``) has a class annotation, so
  ``so.intra_op_num_threads`` is an ``int`` to a checker rather than an attr-defined error.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import onnx_light_kv as olkv
from onnx_light_kv import _session_options

INIT = os.path.join(os.path.dirname(olkv.__file__), "__init__.py")


def _type_checking_names(tree: ast.Module) -> set:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    names.update(a.asname or a.name for a in imp.names)
    return names


def test_lazy_names_are_typed() -> None:
    with open(INIT, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    # a fresh interpreter: the names the import itself defines
    out = subprocess.run([sys.executable, "-c", "import onnx_light_kv as o; print(' '.join(vars(o)))"],
                         capture_output=True, text=True, check=True).stdout.split()
    lazy = set(olkv.__all__) - set(out)
    assert lazy, "expected some lazily loaded names"
    missing = lazy - _type_checking_names(tree)
    assert not missing, f"lazily loaded names without a TYPE_CHECKING import: {sorted(missing)}"
    # a visible module-level __getattr__ would make every attribute Any to a checker
    top = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "__getattr__" not in top
    for name in lazy:  # and the runtime still loads them
        assert getattr(olkv, name) is not None


def test_session_options_annotated() -> None:
    ann = _session_options.SessionOptions.__annotations__
    missing = set(_session_options._OPTIONS) - set(ann)
    assert not missing, f"SessionOptions options without a class annotation: {sorted(missing)}"
    so = olkv.SessionOptions()
    so.intra_op_num_threads = 2
    assert so.intra_op_num_threads == 2
