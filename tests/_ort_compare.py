"""Shared helpers of the differential suites (our InferenceSession vs onnxruntime).

Import from test files as ``import _ort_compare as oc`` (pytest puts ``tests/`` on sys.path).

Skipping policy: :func:`ours_session_class` skips the calling test only while the package has no
``session.py`` yet (our InferenceSession not landed). Any other import failure is raised,
so a broken build fails the suite instead of silently skipping it. Set
``ONNX_LIGHT_KV_REQUIRE_RUNTIME=1`` (CI) to turn the skip into a failure as well.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import onnx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODELS: Optional[ModuleType] = None


def models() -> ModuleType:
    """``onnx_light_kv.models``; loaded from the source file when the package cannot import yet."""
    global _MODELS
    if _MODELS is not None:
        return _MODELS
    try:
        _MODELS = importlib.import_module("onnx_light_kv.models")
    except Exception:  # the package (native part) may be mid-build; models.py needs only numpy + onnx
        path = os.path.join(ROOT, "python", "onnx_light_kv", "models.py")
        spec = importlib.util.spec_from_file_location("_olkv_models_src", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses need the module registered
        spec.loader.exec_module(mod)
        _MODELS = mod
    return _MODELS


def ours_session_class() -> Any:
    """``onnx_light_kv.InferenceSession``, or skip the test while it does not exist yet.

    ``ONNX_LIGHT_KV_SELFTEST_ORT=1`` substitutes onnxruntime for our session: a check of the
    harness itself (every comparison must then pass), never a test of our runtime.
    """
    if os.environ.get("ONNX_LIGHT_KV_SELFTEST_ORT", "") not in ("", "0"):
        return lambda src, threads=1: ort(src, threads or 1)
    required = os.environ.get("ONNX_LIGHT_KV_REQUIRE_RUNTIME", "") not in ("", "0")
    spec = importlib.util.find_spec("onnx_light_kv")  # locates the package without running it
    dirs = list(spec.submodule_search_locations or []) if spec else []
    if not required and not any(os.path.exists(os.path.join(d, "session.py")) for d in dirs):
        pytest.skip("onnx_light_kv.session (InferenceSession) does not exist yet")
    try:
        pkg = importlib.import_module("onnx_light_kv")
        cls = getattr(pkg, "InferenceSession", None)
        if cls is None:
            cls = importlib.import_module("onnx_light_kv.session").InferenceSession
        return cls
    except ModuleNotFoundError as exc:
        if required or not (exc.name or "").startswith("onnx_light_kv"):
            raise
        pytest.skip(f"onnx_light_kv InferenceSession not available yet ({exc})")


def ours(model: Any, threads: Optional[int] = 1) -> Any:
    """Our session on a ModelProto (serialized to bytes), bytes or a path."""
    cls = ours_session_class()
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return cls(src, threads=threads)


def ort(model: Any, threads: int = 1) -> Any:
    """An onnxruntime CPU session with a fixed thread count and all graph optimizations."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return onnxruntime.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def as_f32(a: Any) -> np.ndarray:
    """Float32 view of a float result (bool/int left as they are)."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a


def assert_close(name: str, got: Any, want: Any, rtol: float, atol: float, check_dtype: bool = True) -> None:
    """Same shape (and dtype), then values within ``atol + rtol * |want|``; NaN/inf must match.

    The failure message names the output, the worst element and its index.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != expected {want.shape}"
    if check_dtype:
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != expected {want.dtype}"
    if want.dtype.kind in "biu" or want.dtype == np.bool_:
        mism = np.flatnonzero(got.ravel() != want.ravel())
        assert mism.size == 0, (f"{name}: {mism.size} of {want.size} elements differ; first at flat index "
                                f"{mism[0]}: got {got.ravel()[mism[0]]}, expected {want.ravel()[mism[0]]}")
        return
    g, w = as_f32(got).astype(np.float64), as_f32(want).astype(np.float64)
    fin = np.isfinite(w)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{name}: NaN positions differ"
    assert np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)]), f"{name}: infinities differ"
    if not fin.any():
        return
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(fin, np.abs(g - w) - (atol + rtol * np.abs(w)), -np.inf)
    worst = int(np.argmax(err))
    assert err.ravel()[worst] <= 0, (
        f"{name}: max |got - expected| = {np.max(np.abs(g[fin] - w[fin])):.3g} exceeds atol={atol} rtol={rtol}; "
        f"worst at {np.unravel_index(worst, w.shape)}: got {g.ravel()[worst]!r}, expected {w.ravel()[worst]!r}")


def compare_runs(model: onnx.ModelProto, feeds: Dict[str, np.ndarray], rtol: float, atol: float,
                 output_names: Optional[Sequence[str]] = None, reference: Optional[List[np.ndarray]] = None,
                 threads: int = 1) -> None:
    """Run ``model`` in onnxruntime and in our runtime (``threads``) and compare every requested output.

    ``reference`` replaces onnxruntime's outputs (used where onnxruntime cannot run the case,
    e.g. bfloat16, which is then computed by onnxruntime in float32 by the caller).
    """
    names = list(output_names) if output_names else [o.name for o in model.graph.output]
    want = reference if reference is not None else ort(model).run(names, feeds)
    got = ours(model, threads=threads).run(names, feeds)
    assert len(got) == len(want), f"{len(got)} outputs returned, {len(want)} expected"
    for n, g, w in zip(names, got, want):
        assert_close(n, g, w, rtol, atol, check_dtype=reference is None)
