"""Differential tests of the routing ops of mixture-of-experts decoders (TopK, NonZero, OneHot,
ScatterElements, ArgMax/ArgMin) as torch.onnx writes them: our InferenceSession vs onnxruntime on
single-node models over a grid of shapes, dtypes, axes and attributes. Every result is exact
(data movement and index math), except ScatterElements' add/mul reductions in float16, which
onnxruntime rounds after every update and we after the last (one ``ew`` float16 tolerance).

TopK with ``sorted=0`` leaves the order unspecified: those cases compare the (index, value) pairs
of each row as sets.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np
import pytest
from onnx import TensorProto

import _ort_compare as oc
from test_ops_vs_ort import F16, F32, I32, I64, TOL, Case, _r, _tol, node_model

CASES: Dict[str, Callable[[], Case]] = {}


def _add(name: str, tol: str, fn: Callable[[], Case]) -> None:
    CASES[name] = lambda: _tol(fn(), tol)


def _ties(shape: Any, dt: Any, seed: int = 0) -> np.ndarray:
    """Small integers as dt: many equal values, to check the order of ties."""
    return _r(shape, I64, -3, 3, seed).astype(dt)


# ---------------------------------------------------------------- TopK
for dt in (F32, F16, I64, I32, np.float64):
    dn = np.dtype(dt).name
    for shape, axis, k in (((4, 8), -1, 2), ((4, 8), 1, 8), ((3, 5, 6), 1, 3), ((3, 5, 6), 0, 1), ((2, 7), -1, 0),
                           ((0, 6), -1, 2), ((1, 40), -1, 20), ((6,), 0, 6)):
        for largest in (1, 0):
            name = f"TopK-{dn}-{'x'.join(map(str, shape))}-axis{axis}-k{k}-{'largest' if largest else 'smallest'}"
            _add(name, "exact", lambda dt=dt, shape=shape, axis=axis, k=k, largest=largest: node_model(
                "TopK", [("x", _ties(shape, dt)), ("k", np.array([k], I64))], n_out=2, inits=["k"], opset=20,
                axis=axis, largest=largest, sorted=1))
    _add(f"TopK-{dn}-random-router", "exact", lambda dt=dt: node_model(
        "TopK", [("x", _r((5, 8), dt, -4, 4)), ("k", np.array([2], I64))], n_out=2, inits=["k"], opset=20))
_add("TopK-float32-dynamic-k", "exact", lambda: node_model(
    "TopK", [("x", _ties((3, 9), F32)), ("k", np.array([4], I64))], n_out=2, opset=11))
_add("TopK-float32-opset10", "exact", lambda: node_model(
    "TopK", [("x", _ties((3, 9), F32)), ("k", np.array([3], I64))], n_out=2, inits=["k"], opset=10))
_add("TopK-float32-opset1-attr", "exact", lambda: node_model("TopK", [("x", _ties((3, 9), F32))], n_out=2, opset=9, k=3))
_NAN = np.array([[1, np.nan, 3, np.nan, 2, 3, -np.inf, np.inf], [np.nan] * 8], F32)
for k in (1, 3, 8):
    for largest in (1, 0):
        _add(f"TopK-float32-nan-k{k}-{'largest' if largest else 'smallest'}", "exact", lambda k=k, largest=largest: node_model(
            "TopK", [("x", _NAN), ("k", np.array([k], I64))], n_out=2, inits=["k"], opset=20, largest=largest))

# ---------------------------------------------------------------- NonZero
for dt in (F32, F16, I64, I32, np.bool_, np.uint8):
    dn = np.dtype(dt).name
    for shape in ((7,), (3, 4), (2, 3, 4), (0, 3), (1, 1)):
        _add(f"NonZero-{dn}-{'x'.join(map(str, shape))}", "exact", lambda dt=dt, shape=shape: node_model(
            "NonZero", [("x", (_r(shape, I64, -1, 1) != 0) if dt == np.bool_ else _r(shape, I64, 0, 1).astype(dt))], opset=13))
_add("NonZero-float32-scalar", "exact", lambda: node_model("NonZero", [("x", np.array(2.5, F32))], opset=13))
_add("NonZero-float32-nan-negzero", "exact", lambda: node_model("NonZero", [("x", np.array([np.nan, -0.0, 0.0, 1], F32))], opset=9))

# ---------------------------------------------------------------- OneHot
for idt in (I64, I32, F32):
    for vdt in (F32, I64, F16):
        for axis in (-1, 0, 1, -2):
            name = f"OneHot-{np.dtype(idt).name}-{np.dtype(vdt).name}-axis{axis}"
            _add(name, "exact", lambda idt=idt, vdt=vdt, axis=axis: node_model(
                "OneHot", [("i", _r((3, 4), I64, -5, 5).astype(idt)), ("d", np.array(4, I64)), ("v", np.array([-1, 3], vdt))],
                inits=["d", "v"], opset=11, axis=axis))
_add("OneHot-depth-1d-float", "exact", lambda: node_model(
    "OneHot", [("i", np.array([0, 2, 1, 2], I64)), ("d", np.array([3.0], F32)), ("v", np.array([0, 1], I64))], opset=11))
_add("OneHot-empty", "exact", lambda: node_model(
    "OneHot", [("i", np.zeros((0, 2), I64)), ("d", np.array(3, I64)), ("v", np.array([0, 1], F32))], opset=11))
_add("OneHot-opset9", "exact", lambda: node_model(
    "OneHot", [("i", np.array([[1, 0], [2, 1]], I64)), ("d", np.array([3], I64)), ("v", np.array([0, 1], F32))], opset=9))

# ---------------------------------------------------------------- ScatterElements
for dt in (F32, F16, I64, I32):
    dn = np.dtype(dt).name
    for red, opset in (("none", 11), ("none", 13), ("add", 16), ("mul", 16), ("max", 18), ("min", 18)):
        for axis, dshape, ishape in ((0, (4, 5), (3, 5)), (1, (4, 5), (4, 3)), (-1, (2, 3, 4), (2, 2, 6)), (1, (3, 4), (0, 4))):
            if opset == 11 and dt == F16:
                continue
            tol = "ew" if (dt == F16 and red in ("add", "mul")) else "exact"
            name = f"ScatterElements-{dn}-{red}-opset{opset}-axis{axis}-{'x'.join(map(str, ishape))}"

            def mk(dt=dt, red=red, opset=opset, axis=axis, dshape=dshape, ishape=ishape) -> Case:
                dim = dshape[axis]
                idx = _r(ishape, I64, -dim, dim - 1, 5)  # negative ones and duplicates
                attrs: Dict[str, Any] = {"axis": axis}
                if red != "none":
                    attrs["reduction"] = red
                return node_model("ScatterElements", [("d", _r(dshape, I64, -4, 4, 1).astype(dt)), ("i", idx),
                                                      ("u", _r(ishape, I64, -4, 4, 2).astype(dt))], opset=opset, **attrs)
            _add(name, tol, mk)
_add("ScatterElements-float32-int32-indices", "exact", lambda: node_model(
    "ScatterElements", [("d", _r((4, 5), F32)), ("i", np.array([[1, -1, 0]], I32)), ("u", _r((1, 3), F32))], opset=13, axis=0))

# ---------------------------------------------------------------- ArgMax / ArgMin
for op in ("ArgMax", "ArgMin"):
    for dt in (F32, F16, I64, I32):
        for axis in (0, 1, -1):
            for keep in (1, 0):
                for last in (0, 1):
                    name = f"{op}-{np.dtype(dt).name}-axis{axis}-keep{keep}-last{last}"
                    _add(name, "exact", lambda op=op, dt=dt, axis=axis, keep=keep, last=last: node_model(
                        op, [("x", _ties((3, 5, 4), dt))], opset=13, axis=axis, keepdims=keep, select_last_index=last))
    _add(f"{op}-float32-opset11", "exact", lambda op=op: node_model(op, [("x", _ties((3, 5), F32))], opset=11, axis=-1))

# NaN as onnxruntime treats it: a running best replaced only by a value comparing greater (less)
_ARG_NAN = np.array([[1, np.nan, 3, np.nan, 2], [np.nan, 1, 2, 3, 4], [1, 2, 3, 4, np.nan]], F32)
for op in ("ArgMax", "ArgMin"):
    for last in (0, 1):
        _add(f"{op}-float32-nan-last{last}", "exact", lambda op=op, last=last: node_model(
            op, [("x", _ARG_NAN)], opset=13, axis=1, select_last_index=last))


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_elements_max_min_nan_and_signed_zero_as_onnxruntime(reduction: str) -> None:
    """onnxruntime's max is ``a > b ? a : b``: a NaN already there gives way to the next update,
    -0 and +0 keep whichever comes first; compared value, NaN and sign bit."""
    c = node_model("ScatterElements", [("d", np.array([[1, np.nan, -0.0, 2]], F32)),
                                       ("i", np.array([[0, 1, 2, 3, 0, 2]], I64)),
                                       ("u", np.array([[np.nan, 3, 0.0, np.nan, 5, -0.0]], F32))],
                   opset=18, axis=1, reduction=reduction)
    want = oc.ort(c.model).run(None, c.feeds)[0]
    got = oc.ours(c.model).run(None, c.feeds)[0]
    np.testing.assert_array_equal(got, want)  # (NaN equal to NaN)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("name", sorted(CASES))
def test_moe_op_matches_onnxruntime(name: str) -> None:
    try:
        c = CASES[name]()
    except Exception as e:  # onnxruntime lacks some OneHot types and float16 ScatterElements add/mul
        if "NOT_IMPLEMENTED" in str(e) or "is not supported with" in str(e):
            pytest.skip(f"onnxruntime: {str(e)[:120]}")
        raise
    out_dtypes = {o.type.tensor_type.elem_type for o in c.model.graph.output}
    dtype = "float16" if TensorProto.FLOAT16 in out_dtypes or any(v.dtype == F16 for v in c.feeds.values()) else "float32"
    rtol, atol = TOL[(c.tol, dtype)]
    oc.compare_runs(c.model, c.feeds, rtol, atol, threads=c.threads)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_unsorted_selects_the_same_elements(k: int, largest: int) -> None:
    """sorted=0: the order is unspecified; the selected (index, value) pairs must be onnxruntime's."""
    x = np.concatenate([_ties((3, 8), F32), _NAN[:1]], axis=0)
    c = node_model("TopK", [("x", x), ("k", np.array([k], I64))], n_out=2, inits=["k"], opset=20, largest=largest, sorted=0)
    want = oc.ort(c.model).run(None, c.feeds)
    got = oc.ours(c.model).run(None, c.feeds)
    for row in range(x.shape[0]):
        w = sorted(zip(want[1][row].tolist(), want[0][row].tolist()))
        g = sorted(zip(got[1][row].tolist(), got[0][row].tolist()))
        assert np.array_equal(np.array(w), np.array(g), equal_nan=True), f"row {row}: {g} != {w}"


@pytest.mark.parametrize("op,inputs,attrs,match", [
    ("TopK", [("x", np.zeros((2, 3), F32)), ("k", np.array([4], I64))], {}, "K=4"),
    ("ScatterElements", [("d", np.zeros((2, 3), F32)), ("i", np.array([[3]], I64)), ("u", np.ones((1, 1), F32))], {}, "index 3 out of range"),
    ("ScatterElements", [("d", np.zeros((2, 3), F32)), ("i", np.array([[-3]], I64)), ("u", np.ones((1, 1), F32))], {}, "index -3 out of range"),
])
def test_bad_index_raises_a_clear_error(op: str, inputs: Any, attrs: Dict[str, Any], match: str) -> None:
    from onnx import helper
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for n, v in inputs]
    outs = ["y0", "y1"] if op == "TopK" else ["y0"]
    node = helper.make_node(op, [n for n, _ in inputs], outs, **attrs)
    m = helper.make_model(helper.make_graph([node], "g", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outs]),
                          opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with pytest.raises(Exception, match=match):
        oc.ours(m).run(None, {n: v for n, v in inputs})
