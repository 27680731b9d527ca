"""Differential tests, op by op: our InferenceSession vs onnxruntime on single-node models.

Every case builds a one-node (or tiny multi-node) ONNX model with onnx.helper, runs it in both
runtimes with the same feeds and compares every output: same shape, same dtype, values within
the tolerance of the case's class and dtype (absolute + relative, ``|got - want| <= atol +
rtol * |want|``; NaN and infinities must match exactly):

=============  ===================  ===================  =====================================
class          float32 (rtol/atol)  float16 (rtol/atol)  why
=============  ===================  ===================  =====================================
exact          0 / 0                0 / 0                data movement, integer and bool math
ew             1e-6 / 1e-7          1e-3 / 1e-4          one rounding per element (IEEE ops)
transc         2e-5 / 2e-6          2e-3 / 2e-3          exp/erf/tanh/sigmoid: libm vs SIMD
                                                         polynomials differ by a few ulps
reduce         1e-4 / 1e-5          1e-2 / 1e-2          sums over an axis: order of summation
                                                         (blocked/SIMD vs sequential); fp16
                                                         inputs may be widened to fp32 or not
=============  ===================  ===================  =====================================

Large-tensor cases ("Big-*") run our session with two threads to reach SIMD tails and parallel
paths. bfloat16 cases compare against onnxruntime in float32 (see ``BF16_TOL``). Attention has
its own grid in ``test_attention_vs_ort.py``; bad models and feeds are in
``test_session_errors.py``. Shape inputs (Reshape shape, Slice starts, axes...) are
initializers, as exporters write them, except where a case says "dynamic".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import _ort_compare as oc

TOL: Dict[Tuple[str, str], Tuple[float, float]] = {
    ("exact", "float32"): (0.0, 0.0), ("exact", "float16"): (0.0, 0.0),
    ("ew", "float32"): (1e-6, 1e-7), ("ew", "float16"): (1e-3, 1e-4),
    ("transc", "float32"): (2e-5, 2e-6), ("transc", "float16"): (2e-3, 2e-3),
    ("reduce", "float32"): (1e-4, 1e-5), ("reduce", "float16"): (1e-2, 1e-2),
}
F32, F16, I64, I32 = np.float32, np.float16, np.int64, np.int32
RNG_SEED = 1234


@dataclass
class Case:
    """One model + feeds + tolerance class; built lazily so collection stays fast."""

    model: onnx.ModelProto
    feeds: Dict[str, np.ndarray]
    tol: str = "ew"
    threads: int = 1


def _r(shape: Sequence[int], dtype: Any = F32, lo: float = -2.0, hi: float = 2.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(RNG_SEED + seed + 31 * len(shape))
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def node_model(op: str, inputs: Sequence[Tuple[str, Optional[np.ndarray]]], n_out: int = 1,
               inits: Sequence[str] = (), opset: int = 23, domain: str = "", **attrs: Any) -> Case:
    """A one-node model. ``inputs``: (name, value); a ``None`` value is an omitted optional input
    (empty name); names in ``inits`` become initializers, the rest graph inputs fed with value."""
    names = [n if v is not None else "" for n, v in inputs]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], domain=domain, **attrs)
    return graph_model([node], inputs, [f"y{i}" for i in range(n_out)], inits, opset,
                       extra_opsets=[(domain, 1)] if domain else [])


def graph_model(nodes: List[onnx.NodeProto], inputs: Sequence[Tuple[str, Optional[np.ndarray]]],
                outputs: Sequence[str], inits: Sequence[str] = (), opset: int = 23,
                extra_opsets: Sequence[Tuple[str, int]] = ()) -> Case:
    """A model of several nodes; output types are taken from an onnxruntime run."""
    graph_inputs, initializers, feeds = [], [], {}
    for name, value in inputs:
        if value is None:
            continue
        if name in inits:
            initializers.append(numpy_helper.from_array(np.asarray(value), name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(np.shape(value))))
            feeds[name] = np.asarray(value)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    untyped = helper.make_model(helper.make_graph(nodes, "g", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                                                  initializer=initializers), opset_imports=opsets, ir_version=10)
    results = oc.ort(untyped).run(list(outputs), feeds)
    typed_outputs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(r.dtype), None)
                     for o, r in zip(outputs, results)]
    untyped.graph.ClearField("output")
    untyped.graph.output.extend(typed_outputs)
    return Case(untyped, feeds)


def _tol(case: Case, tol: str) -> Case:
    case.tol = tol
    return case


CASES: Dict[str, Callable[[], Case]] = {}


def case(name: str, tol: str = "ew") -> Callable[[Callable[[], Case]], Callable[[], Case]]:
    """Register a case factory under ``name`` with tolerance class ``tol``."""
    def deco(fn: Callable[[], Case]) -> Callable[[], Case]:
        CASES[name] = lambda: _tol(fn(), tol)
        return fn
    return deco


def _add(name: str, tol: str, fn: Callable[[], Case]) -> None:
    CASES[name] = lambda: _tol(fn(), tol)


# ---------------------------------------------------------------- elementwise binary, broadcasting
BCAST = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((), (2, 3)),
         ((2, 3, 4, 5), (2, 1, 4, 1)), ((4, 1), (1, 5)), ((0, 3), (3,))]
for _op in ("Add", "Sub", "Mul", "Div"):
    for _dt in (F32, F16):
        for _i, (_a, _b) in enumerate(BCAST):
            _add(f"{_op}-{np.dtype(_dt).name}-{_a}x{_b}", "ew",
                 lambda op=_op, dt=_dt, a=_a, b=_b: node_model(op, [("a", _r(a, dt)), ("b", _r(b, dt, 0.5, 2.0, 1))]))
    for _dt in (I64, I32):
        _add(f"{_op}-{np.dtype(_dt).name}", "exact",
             lambda op=_op, dt=_dt: node_model(op, [("a", _r((2, 3, 4), dt, -50, 50)), ("b", _r((3, 1), dt, 1, 7, 1))]))
for _dt in (F32, F16):
    _add(f"Pow-{np.dtype(_dt).name}", "transc",
         lambda dt=_dt: node_model("Pow", [("a", _r((2, 3, 4), dt, 0.1, 3.0)), ("b", _r((4,), dt, -2, 2, 1))]))
    _add(f"Pow-{np.dtype(_dt).name}-square-scalar", "ew",
         lambda dt=_dt: node_model("Pow", [("a", _r((3, 5), dt)), ("b", np.array(2.0, dt))], inits=["b"]))
_add("Pow-float32-int64-exponent", "ew",
     lambda: node_model("Pow", [("a", _r((3, 5))), ("b", np.array([3], I64))]))
_add("Div-int64-negative-truncates", "exact",
     lambda: node_model("Div", [("a", np.array([-7, 7, -8, 9], I64)), ("b", np.array([2, -2, 3, 4], I64))]))

# ---------------------------------------------------------------- unary
UNARY = {"Sqrt": (0.0, 9.0, "ew"), "Reciprocal": (0.2, 5.0, "ew"), "Neg": (-3, 3, "ew"),
         "Exp": (-10.0, 10.0, "transc"), "Sigmoid": (-30.0, 30.0, "transc"), "Tanh": (-8.0, 8.0, "transc"),
         "Erf": (-4.0, 4.0, "transc")}
for _op, (_lo, _hi, _tol_cls) in UNARY.items():
    for _dt in (F32, F16):
        for _shape in ((7,), (2, 3, 33), ()):
            _add(f"{_op}-{np.dtype(_dt).name}-{_shape}", _tol_cls,
                 lambda op=_op, dt=_dt, s=_shape, lo=_lo, hi=_hi: node_model(op, [("x", _r(s, dt, lo, hi))]))
_add("Neg-int64", "exact", lambda: node_model("Neg", [("x", _r((5,), I64, -9, 9))]))
_add("Exp-float32-overflow-underflow", "transc",
     lambda: node_model("Exp", [("x", np.array([-200.0, -88.0, 0.0, 88.0, 200.0], F32))]))
_add("Sqrt-float32-negative-is-nan", "ew", lambda: node_model("Sqrt", [("x", np.array([-1.0, 4.0], F32))]))
for _dt in (F32, F16):
    for _approx in ("none", "tanh"):
        _add(f"Gelu-{_approx}-{np.dtype(_dt).name}", "transc",
             lambda dt=_dt, a=_approx: node_model("Gelu", [("x", _r((2, 3, 40), dt, -6, 6))], opset=20, approximate=a))

# ---------------------------------------------------------------- softmax and reductions
for _dt in (F32, F16):
    n = np.dtype(_dt).name
    for _axis in (-1, 0, 1):
        _add(f"Softmax-{n}-axis{_axis}", "reduce", lambda dt=_dt, ax=_axis: node_model("Softmax", [("x", _r((2, 3, 37), dt, -5, 5))], axis=ax))
    _add(f"Softmax-{n}-large-logits", "reduce",
         lambda dt=_dt: node_model("Softmax", [("x", (_r((3, 9), F32, -5, 5) + np.array([[1000.0], [-1000.0], [60000.0]])).astype(dt))]))
    _add(f"Softmax-{n}-neg-inf-column", "reduce",
         lambda dt=_dt: node_model("Softmax", [("x", np.where(np.arange(8) % 3 == 0, -np.inf, _r((2, 8), dt)).astype(dt))]))
    for _op in ("ReduceMean", "ReduceSum"):
        for _axes, _keep in (([-1], 1), ([0, 2], 0), ([1], 0), (None, 1), (None, 0)):
            _add(f"{_op}-{n}-axes{_axes}-keep{_keep}", "reduce",
                 lambda op=_op, dt=_dt, ax=_axes, k=_keep: node_model(
                     op, [("x", _r((3, 4, 65), dt)), ("axes", None if ax is None else np.array(ax, I64))],
                     inits=["axes"], opset=18, keepdims=k))
        _add(f"{_op}-{n}-empty-axes-noop", "exact",
             lambda op=_op, dt=_dt: node_model(op, [("x", _r((3, 4), dt)), ("axes", np.array([], I64))], inits=["axes"],
                                               opset=18, noop_with_empty_axes=1))
        _add(f"{_op}-{n}-dynamic-axes", "reduce",
             lambda op=_op, dt=_dt: node_model(op, [("x", _r((3, 4, 5), dt)), ("axes", np.array([1], I64))], opset=18))
_add("ReduceSum-int64", "exact", lambda: node_model("ReduceSum", [("x", _r((3, 5), I64, -9, 9)), ("axes", np.array([1], I64))],
                                                    inits=["axes"], keepdims=0))

# ---------------------------------------------------------------- normalizations
for _dt in (F32, F16):
    n = np.dtype(_dt).name
    for _axis, _sshape in ((-1, (64,)), (1, (4, 64)), (-2, (4, 64))):
        _add(f"RMSNormalization-{n}-axis{_axis}", "reduce",
             lambda dt=_dt, ax=_axis, ss=_sshape: node_model("RMSNormalization", [("x", _r((2, 4, 64), dt)), ("s", _r(ss, dt, 0.5, 1.5, 1))],
                                                             inits=["s"], axis=ax, epsilon=1e-5))
        _add(f"LayerNormalization-{n}-axis{_axis}", "reduce",
             lambda dt=_dt, ax=_axis, ss=_sshape: node_model("LayerNormalization",
                                                             [("x", _r((2, 4, 64), dt, -3, 5)), ("s", _r(ss, dt, 0.5, 1.5, 1)), ("b", _r(ss, dt, -1, 1, 2))],
                                                             inits=["s", "b"], opset=17, axis=ax, epsilon=1e-5))
    _add(f"RMSNormalization-{n}-scalar-scale-eps", "reduce",
         lambda dt=_dt: node_model("RMSNormalization", [("x", _r((3, 5), dt, -0.01, 0.01)), ("s", np.array([2.0], dt))], epsilon=1e-2))
    _add(f"LayerNormalization-{n}-no-bias", "reduce",
         lambda dt=_dt: node_model("LayerNormalization", [("x", _r((5, 32), dt)), ("s", _r((32,), dt))], opset=17))
    _add(f"SimplifiedLayerNormalization-{n}", "reduce",
         lambda dt=_dt: node_model("SimplifiedLayerNormalization", [("x", _r((2, 3, 48), dt)), ("s", _r((48,), dt, 0.5, 1.5))],
                                   inits=["s"], axis=-1, epsilon=1e-6))
_add("LayerNormalization-float32-mean-invstd-outputs", "reduce",
     lambda: node_model("LayerNormalization", [("x", _r((4, 16), F32)), ("s", _r((16,), F32)), ("b", _r((16,), F32))],
                        n_out=3, opset=17, axis=-1))

# ---------------------------------------------------------------- matmul / gemm / gather
MATMUL = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
          ((2, 3, 4), (2, 4, 5)), ((17, 33), (33, 19)), ((1, 1, 256), (256, 96)), ((64, 128), (128, 96)), ((2, 0, 4), (4, 3))]
for _dt in (F32, F16):
    for _a, _b in MATMUL:
        _add(f"MatMul-{np.dtype(_dt).name}-{_a}x{_b}", "reduce",
             lambda dt=_dt, a=_a, b=_b: node_model("MatMul", [("a", _r(a, dt, -1, 1)), ("b", _r(b, dt, -1, 1, 1))]))
    _add(f"MatMul-{np.dtype(_dt).name}-weight-initializer", "reduce",
         lambda dt=_dt: node_model("MatMul", [("a", _r((1, 3, 64), dt, -1, 1)), ("w", _r((64, 200), dt, -1, 1, 1))], inits=["w"]))
    for _ta, _tb in ((0, 0), (1, 0), (0, 1), (1, 1)):
        for _c in ((), (5,), (3, 1), (3, 5), None):
            _add(f"Gemm-{np.dtype(_dt).name}-tA{_ta}-tB{_tb}-C{_c}", "reduce",
                 lambda dt=_dt, ta=_ta, tb=_tb, c=_c: node_model(
                     "Gemm", [("a", _r((4, 3) if ta else (3, 4), dt, -1, 1)), ("b", _r((5, 4) if tb else (4, 5), dt, -1, 1, 1)),
                              ("c", None if c is None else _r(c, dt, -1, 1, 2))],
                     transA=ta, transB=tb, alpha=0.5, beta=2.0))
for _dt, _idt in ((F32, I64), (F16, I64), (I64, I64), (F32, I32)):
    n = f"{np.dtype(_dt).name}-{np.dtype(_idt).name}"
    _add(f"Gather-{n}-axis0", "exact", lambda dt=_dt, it=_idt: node_model("Gather", [("d", _r((10, 4), dt, -9, 9)), ("i", np.array([[0, 3], [9, -1]], it))], axis=0))
    _add(f"Gather-{n}-axis1", "exact", lambda dt=_dt, it=_idt: node_model("Gather", [("d", _r((2, 5, 3), dt, -9, 9)), ("i", np.array([4, -5, 2], it))], axis=1))
    _add(f"Gather-{n}-scalar-index", "exact", lambda dt=_dt, it=_idt: node_model("Gather", [("d", _r((2, 5, 3), dt, -9, 9)), ("i", np.array(-1, it))], axis=-1))
_add("Gather-embedding-initializer", "exact",
     lambda: node_model("Gather", [("emb", _r((1000, 64), F16)), ("ids", np.array([[1, 999, 0, 5]], I64))], inits=["emb"], axis=0))

# ---------------------------------------------------------------- shape manipulation
X234 = _r((2, 3, 4), F32)
for _name, _shape in (("flatten", [-1]), ("copy0", [0, -1]), ("split", [2, 3, 2, 2]), ("to-scalar-like", [1, 1, -1])):
    _add(f"Reshape-{_name}", "exact",
         lambda s=_shape: node_model("Reshape", [("x", X234), ("s", np.array(s, I64))], inits=["s"]))
_add("Reshape-allowzero-zero-dim", "exact",
     lambda: node_model("Reshape", [("x", np.zeros((0, 3, 4), F32)), ("s", np.array([0, 4, 3], I64))], inits=["s"], allowzero=1))
_add("Reshape-dynamic-shape", "exact", lambda: node_model("Reshape", [("x", X234), ("s", np.array([4, -1], I64))]))
for _perm in ([1, 0, 2], [2, 0, 1], [0, 2, 1], None):
    _add(f"Transpose-{_perm}", "exact", lambda p=_perm: node_model("Transpose", [("x", X234)], **({"perm": p} if p else {})))
_add("Transpose-4d-f16", "exact", lambda: node_model("Transpose", [("x", _r((2, 3, 4, 5), F16))], perm=[0, 2, 1, 3]))
for _axis in (0, 1, -1):
    _add(f"Concat-axis{_axis}", "exact",
         lambda ax=_axis: node_model("Concat", [("a", X234), ("b", X234 * 2), ("c", X234 + 1)], axis=ax))
_add("Concat-empty-past", "exact", lambda: node_model("Concat", [("past", np.zeros((1, 2, 0, 4), F16)), ("new", _r((1, 2, 1, 4), F16))], axis=2))
_add("Concat-int64-1d", "exact", lambda: node_model("Concat", [("a", np.array([1], I64)), ("b", np.array([2, 3], I64))], axis=0))
_add("Split-sizes", "exact", lambda: node_model("Split", [("x", _r((2, 10), F32)), ("s", np.array([3, 3, 4], I64))], n_out=3, inits=["s"], axis=1))
_add("Split-num-outputs-uneven", "exact", lambda: node_model("Split", [("x", _r((7, 2), F32))], n_out=3, opset=18, axis=0, num_outputs=3))
_add("Split-equal-no-sizes", "exact", lambda: node_model("Split", [("x", _r((2, 3, 6), F16))], n_out=2, opset=13, axis=-1))
SLICES = [("basic", [0, 1], [2, 3], [0, 1], None), ("negative", [-2], [1000], [2], None), ("steps", [0], [4], [2], [2]),
          ("reverse", [-1], [-1000], [2], [-1]), ("int64-max", [1], [np.iinfo(np.int64).max], [1], None),
          ("no-axes", [0, 0, 1], [1, 2, 3], None, None), ("empty", [2], [1], [0], None)]
for _n, _st, _en, _ax, _sp in SLICES:
    _add(f"Slice-{_n}", "exact",
         lambda st=_st, en=_en, ax=_ax, sp=_sp: node_model(
             "Slice", [("x", X234), ("starts", np.array(st, I64)), ("ends", np.array(en, I64)),
                       ("axes", None if ax is None else np.array(ax, I64)), ("steps", None if sp is None else np.array(sp, I64))],
             inits=["starts", "ends", "axes", "steps"]))
_add("Slice-dynamic", "exact", lambda: node_model("Slice", [("x", X234), ("starts", np.array([1], I64)), ("ends", np.array([3], I64)),
                                                            ("axes", np.array([-1], I64))]))
for _axes in ([0], [0, 3], [-1], [1, -1]):
    _add(f"Unsqueeze-{_axes}", "exact", lambda ax=_axes: node_model("Unsqueeze", [("x", X234), ("a", np.array(ax, I64))], inits=["a"]))
_add("Unsqueeze-scalar", "exact", lambda: node_model("Unsqueeze", [("x", np.array(3, I64)), ("a", np.array([0], I64))], inits=["a"]))
_add("Squeeze-axes", "exact", lambda: node_model("Squeeze", [("x", _r((1, 3, 1, 2), F32)), ("a", np.array([0, -2], I64))], inits=["a"]))
_add("Squeeze-all", "exact", lambda: node_model("Squeeze", [("x", _r((1, 3, 1, 2), F16))]))
_add("Squeeze-to-scalar", "exact", lambda: node_model("Squeeze", [("x", np.array([7], I64)), ("a", np.array([0], I64))], inits=["a"]))
for _st, _en in ((None, None), (1, None), (-2, None), (0, 2), (-1, 10), (2, 1)):
    attrs = {k: v for k, v in (("start", _st), ("end", _en)) if v is not None}
    _add(f"Shape-start{_st}-end{_en}", "exact", lambda a=attrs: node_model("Shape", [("x", _r((2, 3, 4, 5), F16))], **a))
_add("Shape-scalar", "exact", lambda: node_model("Shape", [("x", np.array(1.0, F32))]))
_add("Expand-broadcast", "exact", lambda: node_model("Expand", [("x", _r((3, 1), F32)), ("s", np.array([2, 1, 4], I64))], inits=["s"]))
_add("Expand-smaller-shape", "exact", lambda: node_model("Expand", [("x", _r((2, 3), F16)), ("s", np.array([3], I64))], inits=["s"]))
_add("Expand-int64-dynamic", "exact", lambda: node_model("Expand", [("x", np.array([[1], [2]], I64)), ("s", np.array([2, 5], I64))]))
_add("Identity-f16", "exact", lambda: node_model("Identity", [("x", _r((3, 2), F16))]))
_add("Identity-bool", "exact", lambda: node_model("Identity", [("x", _r((3, 2), np.bool_))]))

# ---------------------------------------------------------------- casts, comparisons, selection
CASTS = [(F32, TensorProto.FLOAT16, (-70000, 70000)), (F16, TensorProto.FLOAT, (-100, 100)), (F32, TensorProto.INT64, (-5.9, 5.9)),
         (I64, TensorProto.FLOAT, (-1000, 1000)), (np.bool_, TensorProto.FLOAT, (0, 1)), (F32, TensorProto.BOOL, (-1, 1)),
         (I64, TensorProto.INT32, (-1000, 1000)), (I32, TensorProto.INT64, (-1000, 1000)), (F16, TensorProto.INT64, (-50, 50)),
         (I64, TensorProto.BOOL, (-2, 2)), (F32, TensorProto.FLOAT, (-1, 1))]
for _src, _to, (_lo, _hi) in CASTS:
    _add(f"Cast-{np.dtype(_src).name}-to-{TensorProto.DataType.Name(_to).lower()}", "exact",
         lambda s=_src, to=_to, lo=_lo, hi=_hi: node_model("Cast", [("x", _r((4, 6), s, lo, hi))], to=to))
_add("Cast-float32-to-float16-rounding", "exact",
     lambda: node_model("Cast", [("x", np.array([1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 65519.0, 65520.0, 1e-8, np.nan, -np.inf], F32))],
                        to=TensorProto.FLOAT16))
for _dt in (F32, I64, np.bool_, F16):
    _add(f"Equal-{np.dtype(_dt).name}", "exact",
         lambda dt=_dt: node_model("Equal", [("a", _r((3, 4), dt, -2, 2)), ("b", _r((4,), dt, -2, 2, 1))]))
for _dt in (F32, F16, I64):
    _add(f"Where-{np.dtype(_dt).name}-broadcast", "exact",
         lambda dt=_dt: node_model("Where", [("c", _r((2, 1, 4), np.bool_)), ("a", _r((3, 4), dt, -5, 5)), ("b", np.array(-1, dt))]))
_add("Where-mask-fill-lowest", "exact",
     lambda: node_model("Where", [("c", _r((1, 1, 3, 5), np.bool_)), ("low", np.array(np.finfo(F32).min, F32)), ("x", _r((2, 4, 3, 5), F32))]))
for _dt, (_s, _l, _d) in ((I64, (0, 10, 3)), (I64, (10, -3, -4)), (I32, (2, 2, 1)), (F32, (0.5, 3.0, 0.75)), (I64, (5, 6, 1))):
    _add(f"Range-{np.dtype(_dt).name}-{_s}-{_l}-{_d}", "exact",
         lambda dt=_dt, s=_s, l=_l, d=_d: node_model("Range", [("s", np.array(s, dt)), ("l", np.array(l, dt)), ("d", np.array(d, dt))]))
for _name, _val in (("default", None), ("float16", helper.make_tensor("v", TensorProto.FLOAT16, [1], [1.5])),
                    ("int64", helper.make_tensor("v", TensorProto.INT64, [1], [-7])),
                    ("bool", helper.make_tensor("v", TensorProto.BOOL, [1], [True]))):
    _add(f"ConstantOfShape-{_name}", "exact",
         lambda v=_val: node_model("ConstantOfShape", [("s", np.array([2, 3], I64))], **({"value": v} if v is not None else {})))
_add("ConstantOfShape-empty-shape-is-scalar", "exact",
     lambda: node_model("ConstantOfShape", [("s", np.array([], I64))], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])))
for _name, _attr in (("tensor", {"value": numpy_helper.from_array(_r((2, 3), F16), "v")}),
                     ("value_float", {"value_float": 1.25}), ("value_ints", {"value_ints": [3, -1, 4]}),
                     ("value_int", {"value_int": 9}), ("value_floats", {"value_floats": [1.0, -2.5]})):
    _add(f"Constant-{_name}", "exact", lambda a=_attr: node_model("Constant", [], **a))
for _upper in (0, 1):
    for _k in (None, 0, 2, -1, -10):
        _add(f"Trilu-upper{_upper}-k{_k}", "exact",
             lambda u=_upper, k=_k: node_model("Trilu", [("x", _r((2, 4, 6), F32)), ("k", None if k is None else np.array(k, I64))],
                                               upper=u))
_add("Trilu-int64-square", "exact", lambda: node_model("Trilu", [("x", _r((5, 5), I64, -9, 9)), ("k", np.array(1, I64))], inits=["k"]))
_add("Trilu-float16", "exact", lambda: node_model("Trilu", [("x", _r((3, 7), F16))], upper=1))

# ---------------------------------------------------------------- beyond the core decoder list
# Ops the runtime registers in addition to the core decoder ops; same contract.
for _dt in (F32, F16):
    n = np.dtype(_dt).name
    for _op in ("Floor", "Ceil", "Round"):
        _add(f"{_op}-{n}", "exact", lambda op=_op, dt=_dt: node_model(op, [("x", (np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4], dt)))]))
    for _op in ("Max", "Min", "Sum"):
        _add(f"{_op}-{n}-3-inputs", "ew", lambda op=_op, dt=_dt: node_model(op, [("a", _r((2, 3), dt)), ("b", _r((3,), dt, seed=1)),
                                                                                  ("c", _r((2, 1), dt, seed=2))]))
    for _op in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        _add(f"{_op}-{n}", "exact", lambda op=_op, dt=_dt: node_model(op, [("a", _r((3, 4), dt, -2, 2)),
                                                                            ("b", np.round(_r((4,), dt, -2, 2, 1)).astype(dt))]))
    _add(f"Clip-{n}", "exact", lambda dt=_dt: node_model("Clip", [("x", _r((3, 5), dt, -3, 3)), ("lo", np.array(-1, dt)), ("hi", np.array(1.5, dt))]))
    _add(f"Clip-{n}-min-only", "exact", lambda dt=_dt: node_model("Clip", [("x", _r((7,), dt, -3, 3)), ("lo", np.array(0, dt))]))
    _add(f"LogSoftmax-{n}", "reduce", lambda dt=_dt: node_model("LogSoftmax", [("x", _r((2, 3, 17), dt, -6, 6))], axis=-1))
    for _op in ("ReduceMax", "ReduceMin"):
        _add(f"{_op}-{n}", "exact", lambda op=_op, dt=_dt: node_model(op, [("x", _r((3, 4, 5), dt)), ("a", np.array([1], I64))], inits=["a"],
                                                                       opset=18, keepdims=0))
    _add(f"CastLike-{n}", "exact", lambda dt=_dt: node_model("CastLike", [("x", _r((3, 4), I64, -9, 9)), ("like", np.zeros((1,), dt))]))
for _op in ("Less", "Greater", "LessOrEqual"):
    _add(f"{_op}-int64", "exact", lambda op=_op: node_model(op, [("a", _r((3, 4), I64, -3, 3)), ("b", _r((3, 1), I64, -3, 3, 1))]))
for _op in ("And", "Or", "Xor"):
    _add(f"{_op}-bool", "exact", lambda op=_op: node_model(op, [("a", _r((3, 4), np.bool_)), ("b", _r((4,), np.bool_, seed=1))]))
_add("Not-bool", "exact", lambda: node_model("Not", [("x", _r((2, 5), np.bool_))]))
_add("Mod-int64", "exact", lambda: node_model("Mod", [("a", np.array([-7, 7, -8, 9, 5], I64)), ("b", np.array([3, -3, 3, 4, 5], I64))]))
for _red in ("add", "mul", "max", "min"):
    for _dt in (F32, I64):
        # repeated indices: the updates combine in order (onnxruntime has no float16 reductions;
        # ours is covered by the onnx backend cases)
        _add(f"ScatterND-{_red}-{np.dtype(_dt).name}", "ew" if _dt != I64 else "exact",
             lambda red=_red, dt=_dt: node_model("ScatterND", [("x", _r((4, 3, 2), dt, -3, 3)), ("i", np.array([[1], [3], [1]], I64)),
                                                               ("u", _r((3, 3, 2), dt, -3, 3, 1))], opset=18, reduction=red))
    _add(f"ScatterND-{_red}-elements", "ew",
         lambda red=_red: node_model("ScatterND", [("x", _r((3, 4), F32)), ("i", np.array([[0, 1], [2, 3], [0, 1]], I64)),
                                                   ("u", _r((3,), F32, seed=2))], opset=18, reduction=red))
for _dt in (np.int16, np.uint16, np.uint32):
    # onnxruntime has no 16-bit Max/Min (the onnx backend cases cover ours)
    for _op in ("Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater") + (("Max", "Min") if _dt == np.uint32 else ()):
        _add(f"{_op}-{np.dtype(_dt).name}", "exact",
             lambda op=_op, dt=_dt: node_model(op, [("a", _r((3, 4), dt, 1, 60)), ("b", _r((4,), dt, 1, 9, 1))], opset=14
                                               if op not in ("Equal", "Less", "Greater") else 19))
    _add(f"Cast-float-to-{np.dtype(_dt).name}", "exact",
         lambda dt=_dt: node_model("Cast", [("x", _r((3, 4), F32, 0, 300))], to=int(helper.np_dtype_to_tensor_dtype(np.dtype(dt)))))
for _mode, _pads in (("constant", [0, 2, 1, 0, 1, 3]), ("edge", [1, 0, 2, 2, 1, 0]), ("reflect", [1, 2, 0, 1, 2, 3]),
                     ("reflect", [0, -1, 1, 1, 1, -2]), ("wrap", [1, 2, 4, 1, 3, 5])):
    for _dt in (F32, I64):
        _add(f"Pad-{_mode}-{'-'.join(map(str, _pads))}-{np.dtype(_dt).name}", "exact",
             lambda mode=_mode, pads=_pads, dt=_dt: node_model("Pad", [("x", _r((2, 3, 4), dt, -5, 5)), ("p", np.array(pads, I64))],
                                                               inits=["p"], opset=19, mode=mode))
for _op in ("ReduceMax", "ReduceMin"):
    _add(f"{_op}-bool", "exact", lambda op=_op: node_model(op, [("x", _r((3, 4, 5), np.bool_)), ("a", np.array([1], I64))],
                                                          inits=["a"], opset=20, keepdims=0))
    for _dt in (F32, I64):  # onnxruntime refuses an empty bool set (onnx backend cases cover it)
        _add(f"{_op}-empty-{np.dtype(_dt).name}", "exact",
             lambda op=_op, dt=_dt: node_model(op, [("x", np.zeros((2, 0, 4), dt)), ("a", np.array([1], I64))],
                                               inits=["a"], opset=20))
_add("Mod-int64-fmod", "exact", lambda: node_model("Mod", [("a", np.array([-7, 7, -8, 9], I64)), ("b", np.array([3, -3, 3, 4], I64))], fmod=1))
_add("Mod-float32-fmod", "ew", lambda: node_model("Mod", [("a", _r((6,), F32, -9, 9)), ("b", np.array([2.5], F32))], fmod=1))
_add("Tile-float32", "exact", lambda: node_model("Tile", [("x", _r((2, 3), F32)), ("r", np.array([2, 3], I64))], inits=["r"]))
_add("Tile-int64-dynamic", "exact", lambda: node_model("Tile", [("x", np.array([[1, 2]], I64)), ("r", np.array([3, 1], I64))]))
for _excl, _rev in ((0, 0), (1, 0), (0, 1), (1, 1)):
    _add(f"CumSum-exclusive{_excl}-reverse{_rev}", "reduce",
         lambda e=_excl, r=_rev: node_model("CumSum", [("x", _r((3, 6), F32)), ("ax", np.array(1, I64))], inits=["ax"], exclusive=e, reverse=r))
_add("CumSum-int64-axis0", "exact", lambda: node_model("CumSum", [("x", _r((4, 3), I64, -5, 5)), ("ax", np.array(0, I64))]))
for _axis in (0, 1, 2, -1):
    _add(f"Flatten-axis{_axis}", "exact", lambda ax=_axis: node_model("Flatten", [("x", X234)], axis=ax))
_add("Size-float16", "exact", lambda: node_model("Size", [("x", _r((2, 3, 5), F16))]))
_add("FastGelu-float32", "transc", lambda: node_model("FastGelu", [("x", _r((2, 3, 16), F32, -4, 4))], domain="com.microsoft"))
for _dt in (F32, F16):
    _add(f"FastGelu-bias-{np.dtype(_dt).name}", "transc",
         lambda d=_dt: node_model("FastGelu", [("x", _r((2, 3, 16), d, -4, 4)), ("b", _r((16,), d, -1, 1, seed=1))],
                                  domain="com.microsoft"))
# Edge values the differential fuzzing found: an odd integer exponent above 2^24 keeps a negative
# base's sign; Gemm's alpha = 0 still lets a NaN/inf of A or B through (0 * (A*B)); Clip without
# bounds clamps infinities to the type's finite range; integer ReduceMean truncates toward zero.
_add("Pow-float32-int64-odd-huge", "ew", lambda: node_model(
    "Pow", [("x", np.array([-1.0, -2.0, -0.5, 3.0], F32)), ("y", np.array([16777217, 1073741823, 2**60 + 1, -3], I64))]))
_add("Pow-float16-int32-odd", "ew", lambda: node_model(
    "Pow", [("x", np.array([-1.0, -2.0, 1.5], F16)), ("y", np.array([16777217, 1073741823, 2], I32))]))
_add("Gemm-alpha0-nonfinite", "ew", lambda: node_model(
    "Gemm", [("a", np.array([[np.nan, 1.0], [np.inf, 1.0], [1.0, 2.0]], F32)), ("b", np.ones((2, 2), F32)),
             ("c", np.array([1.0, 2.0], F32))], alpha=0.0, beta=0.5))
for _dt in (F32, F16):
    _add(f"Clip-no-bounds-inf-{np.dtype(_dt).name}", "exact", lambda d=_dt: node_model(
        "Clip", [("x", np.array([-np.inf, np.inf, 1.0, np.nan], d))]))
_add("Clip-min-only-inf", "exact", lambda: node_model(
    "Clip", [("x", np.array([-np.inf, np.inf, 1.0], F32)), ("lo", np.array(0.0, F32))]))
for _dt in (I64, I32):
    _add(f"ReduceMean-{np.dtype(_dt).name}", "exact", lambda d=_dt: node_model(
        "ReduceMean", [("x", np.array([[1, 2, 2], [-3, -2, -2]], d)), ("ax", np.array([1], I64))], inits=["ax"]))

# ---------------------------------------------------------------- RotaryEmbedding (opset 23)


def _rope_caches(rows: int, half: int, dt: Any) -> Tuple[np.ndarray, np.ndarray]:
    ang = np.arange(rows)[:, None] * (1.0 / 10000 ** (np.arange(half) / half))[None, :]
    return np.cos(ang).astype(dt), np.sin(ang).astype(dt)


for _dt in (F32, F16):
    n = np.dtype(_dt).name
    for _inter in (0, 1):
        for _layout in ("4d", "3d"):
            def _rot(dt: Any = _dt, inter: int = _inter, layout: str = _layout, rdim: int = 0) -> Case:
                b, h, s, d = 2, 3, 5, 8
                x = _r((b, h, s, d) if layout == "4d" else (b, s, h * d), dt)
                cos, sin = _rope_caches(32, (rdim or d) // 2, dt)
                pos = np.array([[0, 1, 2, 3, 4], [7, 9, 11, 13, 31]], I64)
                attrs = {"interleaved": inter, **({"num_heads": h} if layout == "3d" else {}),
                         **({"rotary_embedding_dim": rdim} if rdim else {})}
                return node_model("RotaryEmbedding", [("x", x), ("cos", cos), ("sin", sin), ("pos", pos)], inits=["cos", "sin"], **attrs)
            _add(f"RotaryEmbedding-{n}-{_layout}-interleaved{_inter}", "transc", _rot)
            _add(f"RotaryEmbedding-{n}-{_layout}-interleaved{_inter}-partial", "transc",
                 lambda f=_rot: f(rdim=4))
    _add(f"RotaryEmbedding-{n}-no-position-ids", "transc",
         lambda dt=_dt: node_model("RotaryEmbedding", [("x", _r((2, 3, 4, 6), dt)), ("cos", _rope_caches(8, 3, dt)[0][None, 2:6].repeat(2, 0)),
                                                      ("sin", _rope_caches(8, 3, dt)[1][None, 2:6].repeat(2, 0))]))

# ---------------------------------------------------------------- If and tiny multi-node graphs


def _if_case(cond: bool) -> Case:
    x_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, None)
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"])], "then", [], [x_out])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "else", [], [x_out])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    after = helper.make_node("Add", ["y", "x"], ["z"])
    return graph_model([node, after], [("c", np.array(cond)), ("x", _r((2, 3), F32))], ["z"])


_add("If-then", "ew", lambda: _if_case(True))
_add("If-else", "ew", lambda: _if_case(False))


def _mask_graph() -> Case:
    """The GPT-2 causal-mask chain: Shape -> ConstantOfShape -> Trilu(k=past) -> Equal -> Where."""
    nodes = [
        helper.make_node("Shape", ["q"], ["s"], start=2, end=3),
        helper.make_node("Shape", ["k"], ["t"], start=2, end=3),
        helper.make_node("Sub", ["t", "s"], ["p"]),
        helper.make_node("Squeeze", ["p"], ["p0"]),
        helper.make_node("Concat", ["s", "t"], ["st"], axis=0),
        helper.make_node("ConstantOfShape", ["st"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("Trilu", ["ones", "p0"], ["tri"], upper=0),
        helper.make_node("Equal", ["tri", "zero"], ["blocked"]),
        helper.make_node("Where", ["blocked", "low", "scores"], ["y"]),
    ]
    inputs = [("q", _r((1, 2, 3, 4), F32)), ("k", _r((1, 2, 7, 4), F32)), ("scores", _r((1, 2, 3, 7), F32)),
              ("zero", np.array(0.0, F32)), ("low", np.array(-1e9, F32))]
    return graph_model(nodes, inputs, ["y", "tri"], inits=["zero", "low"])


def _positions_graph() -> Case:
    """Derived position ids: Shape -> Squeeze -> Range -> Unsqueeze -> Expand, int64 only."""
    nodes = [
        helper.make_node("Shape", ["past"], ["pl"], start=2, end=3), helper.make_node("Squeeze", ["pl", "ax0"], ["p"]),
        helper.make_node("Shape", ["ids"], ["sl"], start=1, end=2), helper.make_node("Squeeze", ["sl", "ax0"], ["s"]),
        helper.make_node("Add", ["p", "s"], ["end"]), helper.make_node("Range", ["p", "end", "one"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["r2"]), helper.make_node("Shape", ["ids"], ["ids_shape"]),
        helper.make_node("Expand", ["r2", "ids_shape"], ["pos"]),
    ]
    inputs = [("past", np.zeros((2, 2, 5, 4), F16)), ("ids", np.zeros((2, 3), I64)), ("ax0", np.array([0], I64)), ("one", np.array(1, I64))]
    return graph_model(nodes, inputs, ["pos"], inits=["ax0", "one"])


# ---------------------------------------------------------------- ops the exporters emit
# GatherND (torch.onnx dynamo's padding-mask lookup) over opsets 11/12/13+, index dtypes, negative
# indices and batch_dims; the com.microsoft Skip norms of the onnxruntime-genai builder with their
# optional inputs and outputs.
_GND = [("2d-tuples", (4, 5), np.array([[0, 1], [3, -1], [-4, 2]]), 0),
        ("slices", (4, 3, 2), np.array([[[1], [-1]], [[0], [2]]]), 0),
        ("full-tuple-3d", (2, 3, 4), np.array([[1, 2, 3], [0, -3, -4]]), 0),
        ("batch1", (2, 3, 4), np.array([[[1], [2]], [[0], [-1]]]), 1),
        ("batch2", (2, 3, 4, 5), np.array([[[1, 2], [0, 0], [3, -1]], [[2, 2], [1, 4], [0, 3]]]), 2),
        ("empty", (3, 4), np.zeros((0, 2), np.int64), 0)]
for _nm, _ds, _ix, _bd in _GND:
    for _opset in ((11, 12, 13, 23) if _bd == 0 else (12, 13, 23)):
        _add(f"GatherND-{_nm}-opset{_opset}", "exact",
             lambda ds=_ds, ix=_ix, bd=_bd, op=_opset: node_model(
                 "GatherND", [("d", _r(ds, F32, -9, 9)), ("i", ix.astype(I64))], opset=op, **({"batch_dims": bd} if bd else {})))
for _dt in (F16, I64, I32, np.int8, np.uint8, np.bool_):
    _add(f"GatherND-{np.dtype(_dt).name}", "exact",
         lambda dt=_dt: node_model("GatherND", [("d", _r((3, 4, 2), dt, -9, 9)), ("i", np.array([[2, -1], [0, 1]], I64))], opset=13))

_SKIP_SHAPES = [((2, 5, 32), (2, 5, 32)), ((2, 5, 32), (1, 5, 32)), ((2, 5, 32), (5, 32)), ((7, 48), (7, 48))]
for _dt in (F32, F16):
    _n = np.dtype(_dt).name
    for _xs, _ss in _SKIP_SHAPES:
        _h = _xs[-1]
        _add(f"SkipLayerNormalization-{_n}-{_xs}+{_ss}-beta-bias-all-outputs", "reduce",
             lambda dt=_dt, xs=_xs, ss=_ss, h=_h: node_model(
                 "SkipLayerNormalization", [("x", _r(xs, dt)), ("s", _r(ss, dt, seed=1)), ("g", _r((h,), dt, 0.5, 1.5, 2)),
                                            ("b", _r((h,), dt, seed=3)), ("bias", _r((h,), dt, seed=4))],
                 n_out=4, domain="com.microsoft", epsilon=1e-5))
        _add(f"SkipSimplifiedLayerNormalization-{_n}-{_xs}+{_ss}-bias-all-outputs", "reduce",
             lambda dt=_dt, xs=_xs, ss=_ss, h=_h: node_model(
                 "SkipSimplifiedLayerNormalization", [("x", _r(xs, dt)), ("s", _r(ss, dt, seed=1)), ("g", _r((h,), dt, 0.5, 1.5, 2)),
                                                      ("bias", _r((h,), dt, seed=4))],
                 n_out=4, domain="com.microsoft", epsilon=1e-6))
    _add(f"SkipLayerNormalization-{_n}-no-beta-output-only", "reduce",
         lambda dt=_dt: node_model("SkipLayerNormalization", [("x", _r((3, 4, 64), dt)), ("s", _r((3, 4, 64), dt, seed=1)),
                                                              ("g", _r((64,), dt, seed=2))], domain="com.microsoft"))
    _add(f"SkipLayerNormalization-{_n}-bias-no-beta-sum-output", "reduce",
         lambda dt=_dt: _sum_only("SkipLayerNormalization", dt))
    _add(f"SkipSimplifiedLayerNormalization-{_n}-default-epsilon", "reduce",
         lambda dt=_dt: node_model("SkipSimplifiedLayerNormalization", [("x", _r((1, 1, 96), dt)), ("s", _r((1, 1, 96), dt, seed=1)),
                                                                        ("g", _r((96,), dt, seed=2))], inits=["g"], domain="com.microsoft"))
    _add(f"SkipSimplifiedLayerNormalization-{_n}-sum-output", "reduce",
         lambda dt=_dt: _sum_only("SkipSimplifiedLayerNormalization", dt))


@pytest.mark.parametrize("name,ds,ix,bd", _GND, ids=[g[0] for g in _GND])
def test_gathernd_int32_indices_match_onnxruntime_int64(name: str, ds: Tuple[int, ...], ix: np.ndarray, bd: int) -> None:
    """onnxruntime's GatherND takes int64 indices only; ours also takes int32 (as Gather does) and must
    give what onnxruntime gives for the same indices in int64."""
    data = _r(ds, F32, -9, 9)
    extra = {"batch_dims": bd} if bd else {}
    want = node_model("GatherND", [("d", data), ("i", ix.astype(I64))], opset=13, **extra)
    expected = oc.ort(want.model).run(None, want.feeds)[0]
    node = helper.make_node("GatherND", ["d", "i"], ["y0"], **extra)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("d", TensorProto.FLOAT, list(ds)),
                      helper.make_tensor_value_info("i", TensorProto.INT32, list(ix.shape))],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    got = oc.ours(model).run(None, {"d": data, "i": ix.astype(I32)})[0]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("idx", [np.array([[0, 4]]), np.array([[-5, 0]]), np.array([[0, 0, 0, 0]])], ids=["past-end", "too-negative", "tuple-too-long"])
def test_gathernd_bad_indices_raise_value_error(idx: np.ndarray) -> None:
    """Indices outside [-dim, dim) or tuples longer than the data's rank are errors, never a crash."""
    c = node_model("GatherND", [("d", _r((4, 4), F32)), ("i", np.array([[0, 1]], I64))], opset=13)
    sess = oc.ours(c.model)
    with pytest.raises(ValueError):
        sess.run(None, {"d": c.feeds["d"], "i": idx.astype(I64)})


def _sum_only(op: str, dt: Any) -> Case:
    """Outputs 0 and 3 (the residual sum the next layer consumes), 1 and 2 omitted, as the builder emits."""
    names = ["x", "s", "g"] + (["", "bias"] if op == "SkipLayerNormalization" else ["bias"])
    node = helper.make_node(op, names, ["y0", "", "", "y3"], domain="com.microsoft", epsilon=1e-6)
    return graph_model([node], [("x", _r((2, 3, 40), dt)), ("s", _r((2, 3, 40), dt, seed=1)), ("g", _r((40,), dt, seed=2)),
                                ("bias", _r((40,), dt, seed=3))], ["y0", "y3"], extra_opsets=[("com.microsoft", 1)])


# ---------------------------------------------------------------- large tensors, two threads
# Sizes past SIMD widths and parallel thresholds, odd tails; run with threads=2.


def _big(fn: Callable[[], Case]) -> Callable[[], Case]:
    def make() -> Case:
        c = fn()
        c.threads = 2
        return c
    return make


_add("Big-Add-float32-broadcast-row", "ew", _big(lambda: node_model("Add", [("a", _r((257, 1031), F32)), ("b", _r((1031,), F32, seed=1))])))
_add("Big-Mul-float16-broadcast-col", "ew", _big(lambda: node_model("Mul", [("a", _r((1031, 257), F16)), ("b", _r((1031, 1), F16, seed=1))])))
_add("Big-Exp-float32", "transc", _big(lambda: node_model("Exp", [("x", _r((100003,), F32, -20, 20))])))
_add("Big-Sigmoid-float16", "transc", _big(lambda: node_model("Sigmoid", [("x", _r((3, 33331), F16, -12, 12))])))
_add("Big-Gelu-float32", "transc", _big(lambda: node_model("Gelu", [("x", _r((64, 3001), F32, -5, 5))], opset=20)))
_add("Big-Softmax-float32", "reduce", _big(lambda: node_model("Softmax", [("x", _r((4, 16, 1001), F32, -8, 8))], axis=-1)))
_add("Big-ReduceSum-float32-axis0", "reduce", _big(lambda: node_model("ReduceSum", [("x", _r((513, 1025), F32)), ("a", np.array([0], I64))],
                                                                      inits=["a"], keepdims=0)))
_add("Big-ReduceMean-float16", "reduce", _big(lambda: node_model("ReduceMean", [("x", _r((8, 4097), F16)), ("a", np.array([-1], I64))],
                                                                  inits=["a"], opset=18)))
_add("Big-RMSNormalization-float32", "reduce", _big(lambda: node_model("RMSNormalization", [("x", _r((1, 128, 1024), F32)), ("s", _r((1024,), F32))],
                                                                       inits=["s"])))
_add("Big-LayerNormalization-float16", "reduce", _big(lambda: node_model("LayerNormalization", [("x", _r((128, 1024), F16)), ("s", _r((1024,), F16)),
                                                                                                 ("b", _r((1024,), F16))], inits=["s", "b"], opset=17)))
_add("Big-Transpose-float32", "exact", _big(lambda: node_model("Transpose", [("x", _r((33, 65, 129), F32))], perm=[2, 0, 1])))
_add("Big-Cast-float32-to-float16", "exact", _big(lambda: node_model("Cast", [("x", _r((100003,), F32, -70000, 70000))], to=TensorProto.FLOAT16)))
_add("Big-Concat-kv-float16", "exact", _big(lambda: node_model("Concat", [("p", _r((1, 8, 2047, 64), F16)), ("n", _r((1, 8, 1, 64), F16))], axis=2)))
_add("Big-Gather-embedding", "exact", _big(lambda: node_model("Gather", [("e", _r((32000, 256), F32)), ("i", _r((4, 33), I64, 0, 31999))],
                                                               inits=["e"])))
_add("Big-RotaryEmbedding-float32", "transc", _big(lambda: node_model(
    "RotaryEmbedding", [("x", _r((1, 16, 129, 64), F32)), ("cos", _rope_caches(256, 32, F32)[0]), ("sin", _rope_caches(256, 32, F32)[1]),
                        ("pos", np.arange(129, dtype=I64)[None, :] + 100)], inits=["cos", "sin"])))
_add("Big-MatMul-float32-decode-projection", "reduce", _big(lambda: node_model("MatMul", [("a", _r((1, 1, 1024), F32, -1, 1)),
                                                                                          ("w", _r((1024, 2736), F32, -1, 1, 1))], inits=["w"])))
_add("Big-MatMul-float32-prefill", "reduce", _big(lambda: node_model("MatMul", [("a", _r((1, 67, 1024), F32, -1, 1)),
                                                                                 ("w", _r((1024, 513), F32, -1, 1, 1))], inits=["w"])))
_add("Big-MatMul-float16-batched", "reduce", _big(lambda: node_model("MatMul", [("a", _r((2, 8, 33, 64), F16, -1, 1)),
                                                                                 ("b", _r((2, 8, 64, 65), F16, -1, 1, 1))])))
_add("Big-Gemm-float32-transB", "reduce", _big(lambda: node_model("Gemm", [("a", _r((37, 1024), F32, -1, 1)), ("b", _r((515, 1024), F32, -1, 1, 1)),
                                                                           ("c", _r((515,), F32))], inits=["b", "c"], transB=1)))
_add("Graph-gpt2-causal-mask", "exact", _mask_graph)
_add("Graph-derived-position-ids", "exact", _positions_graph)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnxruntime(name: str) -> None:
    c = CASES[name]()
    out_dtypes = {o.type.tensor_type.elem_type for o in c.model.graph.output}
    dtype = "float16" if TensorProto.FLOAT16 in out_dtypes or any(v.dtype == F16 for v in c.feeds.values()) else "float32"
    rtol, atol = TOL[(c.tol, dtype)]
    oc.compare_runs(c.model, c.feeds, rtol, atol, threads=c.threads)


def test_every_issue_op_has_cases() -> None:
    """The grid covers every op the runtime issue lists (guards against silently dropped cases)."""
    ops = {"Gather", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Exp", "Sigmoid",
           "Tanh", "Erf", "Gelu", "Softmax", "ReduceMean", "ReduceSum", "RMSNormalization", "LayerNormalization",
           "SimplifiedLayerNormalization", "RotaryEmbedding", "Reshape", "Transpose", "Concat", "Split", "Slice", "Unsqueeze",
           "Squeeze", "Shape", "Cast", "Expand", "Where", "Equal", "Range", "ConstantOfShape", "Constant", "Identity", "Trilu", "If"}
    covered = {name.split("-")[0] for name in CASES} | {name.split("-")[1] for name in CASES if name.startswith("Big-")}
    assert ops <= covered, f"ops without cases: {sorted(ops - covered)}"


# ---------------------------------------------------------------- bfloat16
# onnxruntime's CPU kernels have no bfloat16 versions, so the expected values come from the same
# one-node model run by onnxruntime in float32 on the (exactly) upcast bfloat16 feeds; our result
# must be bfloat16 and within one or two bfloat16 roundings: rtol 2e-2, atol 2e-2 (bfloat16 keeps
# 8 significant bits, one ulp is 2**-7 relative at worst).
BF16_TOL = (2e-2, 2e-2)


def _skip_bf16_in_selftest() -> None:
    if os.environ.get("ONNX_LIGHT_KV_SELFTEST_ORT", "") not in ("", "0"):
        pytest.skip("harness self-check: onnxruntime has no bfloat16 CPU kernels")


def _bf16_case(op: str, inputs: Sequence[Tuple[str, np.ndarray]], inits: Sequence[str] = (), opset: int = 23,
               **attrs: Any) -> Tuple[onnx.ModelProto, Dict[str, np.ndarray], onnx.ModelProto, Dict[str, np.ndarray]]:
    """(bfloat16 model, bfloat16 feeds, float32 model, float32 feeds) of one node."""
    import ml_dtypes

    def model(elem: int, cast: Any) -> Tuple[onnx.ModelProto, Dict[str, np.ndarray]]:
        vis, inis, feeds = [], [], {}
        for name, value in inputs:
            v = value.astype(cast) if value.dtype == F32 else value
            if name in inits:
                inis.append(helper.make_tensor(name, elem, v.shape, v.astype(F32).ravel().tolist()) if value.dtype == F32
                            else numpy_helper.from_array(v, name))
            else:
                vis.append(helper.make_tensor_value_info(name, elem if value.dtype == F32 else helper.np_dtype_to_tensor_dtype(v.dtype),
                                                         list(v.shape)))
                feeds[name] = v
        graph = helper.make_graph([helper.make_node(op, [n for n, _ in inputs], ["y"], **attrs)], "g", vis,
                                  [helper.make_tensor_value_info("y", elem, None)], initializer=inis)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), feeds

    mb, fb = model(TensorProto.BFLOAT16, ml_dtypes.bfloat16)
    m32, _ = model(TensorProto.FLOAT, F32)
    f32 = {k: (v.astype(F32) if v.dtype.name == "bfloat16" else v) for k, v in fb.items()}
    return mb, fb, m32, f32


BF16_CASES: Dict[str, Callable[[], Any]] = {
    "Add-broadcast": lambda: _bf16_case("Add", [("a", _r((3, 4))), ("b", _r((4,), seed=1))]),
    "Mul-broadcast": lambda: _bf16_case("Mul", [("a", _r((3, 4))), ("b", _r((3, 1), seed=1))]),
    "Div": lambda: _bf16_case("Div", [("a", _r((3, 4))), ("b", _r((3, 4), F32, 0.5, 2, 1))]),
    "MatMul": lambda: _bf16_case("MatMul", [("a", _r((2, 5, 16), F32, -1, 1)), ("b", _r((16, 7), F32, -1, 1, 1))]),
    "MatMul-weight-initializer": lambda: _bf16_case("MatMul", [("a", _r((1, 3, 64), F32, -1, 1)), ("w", _r((64, 33), F32, -1, 1, 1))],
                                                    inits=["w"]),
    "Softmax": lambda: _bf16_case("Softmax", [("x", _r((3, 9), F32, -4, 4))]),
    "Sigmoid": lambda: _bf16_case("Sigmoid", [("x", _r((11,), F32, -6, 6))]),
    "RMSNormalization": lambda: _bf16_case("RMSNormalization", [("x", _r((2, 3, 16))), ("s", _r((16,), seed=1))], inits=["s"]),
    "LayerNormalization": lambda: _bf16_case("LayerNormalization", [("x", _r((2, 3, 16))), ("s", _r((16,), seed=1)), ("b", _r((16,), seed=2))],
                                             inits=["s", "b"], opset=17),
    "RotaryEmbedding": lambda: _bf16_case("RotaryEmbedding", [("x", _r((1, 2, 3, 8))), ("cos", _rope_caches(8, 4, F32)[0]),
                                                              ("sin", _rope_caches(8, 4, F32)[1]), ("pos", np.array([[1, 2, 5]], I64))]),
    "Transpose": lambda: _bf16_case("Transpose", [("x", _r((2, 3, 4)))], perm=[2, 0, 1]),
    "Concat": lambda: _bf16_case("Concat", [("a", _r((1, 2, 0, 4))), ("b", _r((1, 2, 3, 4), seed=1))], axis=2),
    "Gather": lambda: _bf16_case("Gather", [("d", _r((5, 3))), ("i", np.array([0, 4, -1], I64))]),
    "Where": lambda: _bf16_case("Where", [("c", _r((3, 4), np.bool_)), ("a", _r((3, 4))), ("b", _r((4,), seed=1))]),
    "Reshape": lambda: _bf16_case("Reshape", [("x", _r((2, 6))), ("s", np.array([3, 4], I64))], inits=["s"]),
}


@pytest.mark.parametrize("name", sorted(BF16_CASES))
def test_bfloat16_op_matches_onnxruntime_in_float32(name: str) -> None:
    _skip_bf16_in_selftest()
    mb, fb, m32, f32 = BF16_CASES[name]()
    sess = oc.ours(mb)
    (want,) = oc.ort(m32).run(None, f32)
    (got,) = sess.run(None, fb)
    assert np.asarray(got).dtype.name == "bfloat16", f"dtype {np.asarray(got).dtype}, expected bfloat16"
    oc.assert_close("y", got, want, *BF16_TOL, check_dtype=False)


def test_cast_to_and_from_bfloat16_rounds_to_nearest_even() -> None:
    """float32 -> bfloat16 rounds to nearest even like ml_dtypes (onnxruntime cannot return
    bfloat16 arrays, so it only checks the round trip back to float32)."""
    import ml_dtypes

    _skip_bf16_in_selftest()
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -3.14159, 1e-40, 3.0e38, np.inf, np.nan], F32)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16),
                               helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    y, z = oc.ours(model).run(None, {"x": x})
    want = x.astype(ml_dtypes.bfloat16)
    assert np.asarray(y).dtype.name == "bfloat16"
    np.testing.assert_array_equal(np.asarray(y).view(np.uint16)[:-1], want.view(np.uint16)[:-1])
    assert np.isnan(np.asarray(z)[-1])
    (ort_z,) = oc.ort(helper.make_model(helper.make_graph(graph.node, "g", graph.input, [graph.output[1]]),
                                        opset_imports=[helper.make_opsetid("", 23)], ir_version=10)).run(None, {"x": x})
    np.testing.assert_array_equal(z, ort_z)


def _ort_and_ours(m: onnx.ModelProto, feeds: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    from onnx_light_kv.session import InferenceSession

    import onnxruntime as ort

    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = np.asarray(InferenceSession(m.SerializeToString(), threads=1).run(None, feeds)[0])
    return want, got


@pytest.mark.parametrize("scan_shape", [[1], None, ["k"]])
@pytest.mark.parametrize("trips", [2, 0])
def test_loop_scan_output_keeps_its_declared_type(scan_shape: Any, trips: int) -> None:
    """A Loop's scan output keeps the type its body declares when no iteration runs, whether the
    declared shape is fixed, absent or symbolic (it was float32 unless fixed)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["i", "ax"], ["sc"]), helper.make_node("Identity", ["v"], ["vo"])], "body",
        [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), vi("v", TensorProto.FLOAT, [2])],
        [vi("c", TensorProto.BOOL, []), vi("vo", TensorProto.FLOAT, [2]), vi("sc", TensorProto.INT64, scan_shape)],
        initializer=[numpy_helper.from_array(np.array([0], np.int64), "ax")])
    nodes = [helper.make_node("Loop", ["M", "cond", "v0"], ["vf", "scan"], body=body),
             helper.make_node("Flatten", ["scan"], ["flat"], axis=0),
             helper.make_node("Squeeze", ["flat"], ["ids0"]),
             helper.make_node("Concat", ["ids0", "tail"], ["ids"], axis=0)]
    g = helper.make_graph(nodes, "g", [vi("M", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []),
                                       vi("v0", TensorProto.FLOAT, [2]), vi("tail", TensorProto.INT64, [1])],
                          [vi("ids", TensorProto.INT64, ["n"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    feeds = {"M": np.array(trips, np.int64), "cond": np.array(True), "v0": np.array([1.0, 2.0], np.float32),
             "tail": np.array([7], np.int64)}
    want, got = _ort_and_ours(m, feeds)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_rmsnorm_chain_with_a_cast_keeps_its_float32_output() -> None:
    """The RMSNorm chain of a float16 x with Cast(to=float) before the float32 weight outputs
    float32 (the fusion runs only on float32 x), so a float32 residual Add after it runs."""
    n = helper.make_node
    nodes = [n("Pow", ["x", "two"], ["q"]), n("ReduceMean", ["q", "ax"], ["m"], keepdims=1),
             n("Add", ["m", "eps"], ["a"]), n("Sqrt", ["a"], ["s"]), n("Reciprocal", ["s"], ["r"]),
             n("Mul", ["x", "r"], ["yy"]), n("Cast", ["yy"], ["yc"], to=TensorProto.FLOAT),
             n("Mul", ["w", "yc"], ["out"]), n("Add", ["out", "res"], ["z"])]
    inits = [numpy_helper.from_array(np.array(2, np.float16), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "ax"),
             numpy_helper.from_array(np.array(1e-5, np.float16), "eps"),
             numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "w")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3, 8]),
                                       helper.make_tensor_value_info("res", TensorProto.FLOAT, [2, 3, 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = np.random.default_rng(0).uniform(-2, 2, (2, 3, 8)).astype(np.float16)
    want, got = _ort_and_ours(m, {"x": x, "res": np.ones((2, 3, 8), np.float32)})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=4e-3)
