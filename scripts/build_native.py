#!/usr/bin/env python3
"""Build the Go extension module with gopy and place it in the package.

Runs ``gopy build`` (pinned as a Go tool in go.mod) on ``golib/kvgo`` with
GOEXPERIMENT=simd, then copies the generated ``_kvgo*.so``, ``kvgo.py`` and
``go.py`` into ``python/onnx_light_kv/_native/``. Used by setup.py for both
``pip install .`` and ``pip install -e .``; can be run by hand for a quick
rebuild of an editable install. A lock file serializes concurrent builds.

gopy v0.5.0's wrapper of a Go function whose only result is an ``error``
returns a C string that nothing frees (its ``bind/gen_func.go`` says
"leaked string"): 32 bytes per successful call, more per failing one. This
script builds gopy itself from a patched copy of that file (the module
cache stays untouched) so that such a wrapper returns NULL on success and
its C caller frees the error string on failure, as gopy already does for
``string`` results (``_GOPY_PATCHES``; the build fails if the file no longer
matches). ``tests/test_native_leaks.py`` measures the C heap over 100k calls.

The extension is linked without the symbol table and DWARF debug info
(``gopy -symbols=false``: Go's ``-ldflags="-s -w"``); Go stack traces still
name functions. Set ``OLKV_DEBUG_SYMBOLS=1`` to keep them (profilers, gdb).
Each interpreter's ``_kvgo.<abi>.so`` is kept, so editable installs from
several Python versions coexist in one tree.

Needs: Go (1.26+), gcc, Python headers, and the ``pybindgen`` package in the
interpreter that runs this script.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "golib", "kvgo", "_build")
DEST = os.path.join(ROOT, "python", "onnx_light_kv", "_native")


def _run(cmd: list[str], env: dict[str, str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)


# (old, new) replacements in gopy's bind/gen_func.go: error-only wrappers are
# registered like string-returning ones (pybindgen frees the returned char*
# after the call and on failure), and return NULL instead of a fresh empty
# C string on success (Py_BuildValue("s", NULL) is None, free(NULL) a no-op).
_GOPY_PATCHES = [
    ('\t\t\tif t.Kind() == types.String {\n\t\t\t\taddFuncName = "add_checked_string_function"\n\t\t\t}\n\t\t}\n',
     '\t\t\tif t.Kind() == types.String {\n\t\t\t\taddFuncName = "add_checked_string_function"\n\t\t\t}\n\t\t}\n'
     '\t\tif len(res) == 1 && isErrorType(ret.GoType()) {\n\t\t\taddFuncName = "add_checked_string_function"\n\t\t}\n'),
    ('g.gofile.Printf("return C.CString(\\"\\")") // NOTE: leaked string',
     'g.gofile.Printf("return nil")'),
]


def _patched_gopy(tools: str, env: dict[str, str]) -> str:
    """Build gopy (the version go.mod pins) with _GOPY_PATCHES applied;
    return the binary's path."""
    moddir = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", "github.com/go-python/gopy"],
                            cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout.strip()
    src = os.path.join(moddir, "bind", "gen_func.go")
    with open(src, encoding="utf-8") as fh:
        text = fh.read()
    for old, new in _GOPY_PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"gopy's {src} no longer matches the leak patch (looked for {old!r}); "
                               "update _GOPY_PATCHES in scripts/build_native.py for this gopy version")
        text = text.replace(old, new)
    # a patched copy of the module, used through a replace directive in a
    # copy of go.mod (-modfile), so every other dependency keeps its version
    # (go's -overlay may not replace files of the module cache)
    copy = os.path.join(tools, "gopy-src")
    shutil.copytree(moddir, copy)
    for d, _, files in os.walk(copy):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    with open(os.path.join(copy, "bind", "gen_func.go"), "w", encoding="utf-8") as fh:
        fh.write(text)
    modfile = os.path.join(tools, "go.mod")
    shutil.copy(os.path.join(ROOT, "go.mod"), modfile)
    shutil.copy(os.path.join(ROOT, "go.sum"), os.path.join(tools, "go.sum"))
    with open(modfile, "a", encoding="utf-8") as fh:
        fh.write(f"\nreplace github.com/go-python/gopy => {copy}\n")
    exe = os.path.join(tools, "gopy")
    _run(["go", "build", "-modfile=" + modfile, "-o", exe, "github.com/go-python/gopy"], env)
    return exe


def build(python: str = sys.executable, symbols: bool | None = None) -> str:
    """Build the extension for interpreter ``python``; return the .so path.

    ``symbols``: keep the symbol table and debug info (default: only when
    the environment sets ``OLKV_DEBUG_SYMBOLS=1``)."""
    if symbols is None:
        symbols = os.environ.get("OLKV_DEBUG_SYMBOLS", "") not in ("", "0")
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain (1.26+) is needed to build onnx-light-kv: 'go' is not on PATH")
    env = dict(os.environ)
    env["GOEXPERIMENT"] = "simd"
    env["CGO_ENABLED"] = "1"
    env["CGO_LDFLAGS_ALLOW"] = "-fwrapv"
    env.setdefault("GOFLAGS", "-mod=mod")
    tools = tempfile.mkdtemp(prefix="olkv-tools-")
    try:
        # goimports must be on PATH for gopy; build the version pinned in go.mod
        _run(["go", "build", "-o", os.path.join(tools, "goimports"), "golang.org/x/tools/cmd/goimports"], env)
        env["PATH"] = tools + os.pathsep + env.get("PATH", "")
        shutil.rmtree(BUILD, ignore_errors=True)
        gopy = _patched_gopy(tools, env)
        _run([gopy, "build", "-output=" + os.path.relpath(BUILD, ROOT), "-vm=" + python,
              "-dynamic-link=true", "-symbols=" + ("true" if symbols else "false"), "./golib/kvgo"], env)
    finally:
        shutil.rmtree(tools, ignore_errors=True)
    sos = glob.glob(os.path.join(BUILD, "_kvgo*.so"))
    if len(sos) != 1:
        raise RuntimeError(f"gopy produced {len(sos)} extension files in {BUILD}")
    os.makedirs(DEST, exist_ok=True)
    # other interpreters' _kvgo.<abi>.so stay: their editable installs use them
    for f in sos + [os.path.join(BUILD, "kvgo.py"), os.path.join(BUILD, "go.py")]:
        # copy then rename: a process that has the old module loaded keeps
        # its (now unlinked) file intact instead of seeing it rewritten
        tmp = os.path.join(DEST, "." + os.path.basename(f) + ".tmp")
        shutil.copy2(f, tmp)
        os.replace(tmp, os.path.join(DEST, os.path.basename(f)))
    with open(os.path.join(DEST, "__init__.py"), "w") as fh:
        fh.write('"""Generated by scripts/build_native.py (gopy output). Do not edit."""\n')
    shutil.rmtree(BUILD, ignore_errors=True)
    return os.path.join(DEST, os.path.basename(sos[0]))


def main() -> None:
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", ".native.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        print("built", build())


if __name__ == "__main__":
    main()
