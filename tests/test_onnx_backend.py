"""The ONNX project's own backend node tests, run through ``InferenceSession``.

The ``onnx`` package builds its node test cases in memory
(``onnx.backend.test.loader.load_node_model_tests()``): each case is a small model plus input
and expected output arrays. Every case whose every node (subgraphs included) is an op that
``supported_ops()`` claims, at the model's opset, runs here in-process and is compared like
onnx's own runner compares it: same number of outputs, same shapes and dtypes, values within
the case's tolerances (``rtol`` 1e-3, ``atol`` 1e-7 unless the case says otherwise) with NaN at
the same positions.

Cases that use what the runtime documents as unsupported are excluded by rule, with the rule
as the skip reason (see ``exclusion_reason``): non-tensor types (sequence, optional, map,
sparse), element types the runtime has no dtype for (strings, complex, 8/4/2-bit floats and
ints), model-local functions and training ops. A claimed case that fails is a bug: it is either
fixed in the op kernel or listed in ``KNOWN_GAPS`` (strict xfail, so a fix flips it).

Building the cases takes onnx several seconds, so the in-scope cases are cached on disk per onnx
version (``OLKV_ONNX_BACKEND_CACHE`` overrides the directory; the default is pytest's cache
folder in the repository).
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

import onnx_light_kv as olkv  # noqa: E402
from onnx_light_kv.session import supported_ops  # noqa: E402

# Element types (TensorProto.DataType) the runtime has a dtype for.
_RUNTIME_ELEM = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8, onnx.TensorProto.INT8,
    onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.BOOL,
    onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
}
# Element types the runtime lacks but is meant to gain (not excluded: their cases are known gaps).
_GAP_ELEM = {onnx.TensorProto.UINT64}
_TRAINING_DOMAINS = {"ai.onnx.preview.training"}

# Claimed cases that fail today: case name -> reason. Each runs as xfail(strict=True), so a fix
# that makes one pass fails the suite until its entry is removed.
_QK_CAUSAL = ("Attention qk_matmul_output_mode=1 with is_causal: onnx's expected output includes the causal "
              "mask's -inf, onnxruntime 1.32 (which this runtime matches, tests/test_attention_vs_ort.py) "
              "writes Q*K^T + bias without it")
KNOWN_GAPS: Dict[str, str] = {
    "test_add_uint64": "element type uint64 is not a runtime dtype",
    "test_top_k_uint64": "element type uint64 is not a runtime dtype",
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal": _QK_CAUSAL,
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal": _QK_CAUSAL,
    "test_attention_4d_causal_fp16_expanded": "float16 expanded graph: our fp32 internal precision differs from the per-op fp16 rounding by 1.2e-3 relative",
    "test_div_uint64": "element type uint64 is not a runtime dtype",
    "test_training_dropout_default": "Dropout in training mode with a nonzero ratio (random) is not implemented",
    "test_training_dropout_default_mask": "Dropout in training mode with a nonzero ratio (random) is not implemented",
    "test_training_dropout": "Dropout in training mode with a nonzero ratio (random) is not implemented",
    "test_training_dropout_mask": "Dropout in training mode with a nonzero ratio (random) is not implemented",
    "test_equal_uint64": "element type uint64 is not a runtime dtype",
    "test_greater_uint64": "element type uint64 is not a runtime dtype",
    "test_greater_equal_uint64": "element type uint64 is not a runtime dtype",
    "test_greater_equal_uint64_expanded": "element type uint64 is not a runtime dtype",
    "test_less_uint64": "element type uint64 is not a runtime dtype",
    "test_less_equal_uint64": "element type uint64 is not a runtime dtype",
    "test_less_equal_uint64_expanded": "element type uint64 is not a runtime dtype",
    "test_max_uint64": "element type uint64 is not a runtime dtype",
    "test_min_uint64": "element type uint64 is not a runtime dtype",
    "test_mod_uint64": "element type uint64 is not a runtime dtype",
    "test_mul_uint64": "element type uint64 is not a runtime dtype",
    "test_pow_types_float32_uint64": "element type uint64 is not a runtime dtype",
    "test_sub_uint64": "element type uint64 is not a runtime dtype",
}


# Bump when Case, the exclusion rules or the conversion change (the disk cache is keyed on it).
_CACHE_FORMAT = 4


@dataclass(frozen=True)
class Case:
    """One backend node case, reduced to what the test needs (picklable)."""

    name: str
    model: bytes
    ops: Tuple[Tuple[str, str, int], ...]  # (domain, op_type, opset of that domain)
    inputs: Tuple[Tuple[np.ndarray, ...], ...]
    outputs: Tuple[Tuple[np.ndarray, ...], ...]
    rtol: float
    atol: float
    excluded: Optional[str]  # the rule that excludes the case, or None


def _elem_name(t: int) -> str:
    return onnx.TensorProto.DataType.Name(t).lower()


def _type_reason(tp: "onnx.TypeProto") -> Optional[str]:
    kind = tp.WhichOneof("value")
    if kind is None:
        return None
    if kind != "tensor_type":
        return f"{kind.replace('_type', '')} types are not supported"
    e = tp.tensor_type.elem_type
    if e == onnx.TensorProto.STRING:
        return "string tensors are not supported"
    if e not in _RUNTIME_ELEM and e not in _GAP_ELEM:
        return f"element type {_elem_name(e)} is not a runtime dtype"
    return None


def _graphs(g: "onnx.GraphProto"):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _graphs(sub)


def _newest_opsets() -> Dict[str, int]:
    """The newest opset of each versioned domain the runtime knows ("" = ai.onnx)."""
    known = olkv.build_info()["newest_opsets"]
    return {("" if d == "ai.onnx" else d): int(v) for d, v in known.items()}


def exclusion_reason(model: "onnx.ModelProto") -> Optional[str]:
    """The documented-unsupported feature the model uses, or None."""
    newest = _newest_opsets()
    for o in model.opset_import:
        d = "" if o.domain == "ai.onnx" else o.domain
        if d in newest and o.version > newest[d]:
            return (f"opset {o.version} of {o.domain or 'ai.onnx'} is newer than the runtime knows "
                    f"({newest[d]}): such models are refused at session creation")
    if len(model.functions):
        return "model-local functions are not supported"
    for g in _graphs(model.graph):
        if len(g.sparse_initializer):
            return "sparse tensors are not supported"
        for n in g.node:
            if n.domain in _TRAINING_DOMAINS:
                return "training ops are not supported"
            for a in n.attribute:
                if a.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
                    return "sparse tensors are not supported"
                if a.type == onnx.AttributeProto.TENSOR:
                    r = _type_reason(onnx.helper.make_tensor_type_proto(a.t.data_type, None))
                    if r:
                        return r
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            r = _type_reason(vi.type)
            if r:
                return r
        for init in g.initializer:
            r = _type_reason(onnx.helper.make_tensor_type_proto(init.data_type, None))
            if r:
                return r
    return None


# Op versions newer than the runtime's opsets that only widened the op's types (read from the
# onnx changelog): a case of such a version means what it meant at the version before.
_TYPES_ONLY = {("OneHot", 28): "opset 28 added bfloat16 values, nothing else"}


def _downgraded(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """``model`` with its ai.onnx opset import lowered to the newest the runtime knows, when it
    is newer and every node's op has the same definition at both (the same ``since_version``,
    or a newer version listed in ``_TYPES_ONLY``): the same model under an opset number the
    runtime accepts (onnx 1.23 writes OneHot's cases at opset 28). Else ``model`` itself."""
    newest = _newest_opsets().get("")
    imp = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if newest is None or len(imp) != 1 or imp[0].version <= newest:
        return model
    for g in _graphs(model.graph):
        for n in g.node:
            if n.domain not in ("", "ai.onnx"):
                continue
            try:
                now = onnx.defs.get_schema(n.op_type, imp[0].version, "").since_version
                then = onnx.defs.get_schema(n.op_type, newest, "").since_version
            except onnx.defs.SchemaError:
                return model
            if now != then and not ((n.op_type, now) in _TYPES_ONLY
                                    and onnx.defs.get_schema(n.op_type, now - 1, "").since_version == then):
                return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = newest
    return out


def _node_ops(model: "onnx.ModelProto") -> Tuple[Tuple[str, str, int], ...]:
    opset = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    ops = set()
    for g in _graphs(model.graph):
        for n in g.node:
            d = "" if n.domain == "ai.onnx" else n.domain
            ops.add((d, n.op_type, opset.get(d, 0)))
    return tuple(sorted(ops))


def _as_array(v) -> Optional[np.ndarray]:
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, np.generic):
        return np.asarray(v)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    return None  # sequences, optionals, maps: excluded by the type rule


def _build_cases() -> List[Case]:
    from onnx.backend.test import loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = loader.load_node_model_tests()
    out = []
    for c in raw:
        m = _downgraded(c.model)
        excluded = exclusion_reason(m)
        ins: List[Tuple[np.ndarray, ...]] = []
        outs: List[Tuple[np.ndarray, ...]] = []
        if excluded is None:
            for i, o in c.data_sets:
                ai = [_as_array(x) for x in i]
                ao = [_as_array(x) for x in o]
                if any(x is None for x in ai + ao):
                    excluded = "sequence/optional/map values are not supported"
                    break
                ins.append(tuple(ai))
                outs.append(tuple(ao))
        if excluded is not None:
            ins, outs = [], []
        out.append(Case(c.name, m.SerializeToString(), _node_ops(m), tuple(ins), tuple(outs),
                        float(c.rtol), float(c.atol), excluded))
    return out


def astuple_shallow(c: Case) -> tuple:
    """c's fields as a plain tuple (the pickle then names no test-module class)."""
    return tuple(getattr(c, f.name) for f in fields(c))


def _cache_path() -> Path:
    base = os.environ.get("OLKV_ONNX_BACKEND_CACHE")
    d = Path(base) if base else Path(__file__).resolve().parent.parent / ".pytest_cache" / "onnx_backend"
    known = "-".join(f"{k or 'ai.onnx'}{v}" for k, v in sorted(_newest_opsets().items()))
    return d / f"cases-{onnx.__version__}-{known}-v{_CACHE_FORMAT}.pkl"


@functools.lru_cache(maxsize=1)
def load_cases() -> List[Case]:
    """Every backend node case (cached on disk per onnx version and this file's text)."""
    p = _cache_path()
    try:
        with p.open("rb") as f:
            return [Case(*row) for row in pickle.load(f)]
    except (OSError, EOFError, pickle.UnpicklingError, TypeError, ValueError):
        pass
    cases = _build_cases()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            pickle.dump([astuple_shallow(c) for c in cases], f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, p)
    except OSError:
        pass
    return cases


_CLAIM = re.compile(r"^(?P<domain>[^/]*)/(?P<op>\S+) \[(?P<since>\d+), (?P<until>\d+)\]$")


@functools.lru_cache(maxsize=1)
def _claims() -> Dict[Tuple[str, str], List[Tuple[int, int]]]:
    claims: Dict[Tuple[str, str], List[Tuple[int, int]]] = {}
    for s in supported_ops():
        m = _CLAIM.match(s)
        assert m, f"unparsable supported_ops() entry {s!r}"
        d = "" if m["domain"] == "ai.onnx" else m["domain"]
        claims.setdefault((d, m["op"]), []).append((int(m["since"]), int(m["until"])))
    return claims


def claimed(domain: str, op: str, opset: int) -> bool:
    """Whether supported_ops() claims op at that opset of its domain."""
    return any(since <= opset and (until == 0 or opset <= until)
               for since, until in _claims().get((domain, op), ()))


def _in_scope(c: Case) -> bool:
    return all(claimed(d, op, v) for d, op, v in c.ops)


def _params():
    params = []
    for c in load_cases():
        if not _in_scope(c):
            continue
        marks = []
        if c.excluded is not None:
            marks.append(pytest.mark.skip(reason=f"excluded by rule: {c.excluded}"))
        elif c.name in KNOWN_GAPS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[c.name]))
        params.append(pytest.param(c, id=c.name, marks=marks))
    return params


def assert_outputs(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                   rtol: float, atol: float) -> None:
    """onnx's runner comparison: count, shape, dtype, then allclose (NaN positions equal)."""
    assert len(got) == len(want), f"{len(got)} outputs, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, want {w.shape}"
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, want {w.dtype}"
        r = rtol
        if w.dtype.name == "bfloat16":
            r = max(rtol, 2 ** -6)
            g, w = g.astype(np.float32), w.astype(np.float32)
        np.testing.assert_allclose(g, w, rtol=r, atol=atol, err_msg=f"output {i}")


@pytest.mark.parametrize("case", _params())
def test_backend_node(case: Case) -> None:
    m = onnx.load_from_string(case.model)
    in_names = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    out_names = [o.name for o in m.graph.output]
    sess = olkv.InferenceSession(case.model)
    for ins, outs in zip(case.inputs, case.outputs):
        feeds = dict(zip(in_names, ins))
        got = sess.run(out_names, feeds)
        assert_outputs(got, outs, case.rtol, case.atol)



def test_every_claimed_onnx_op_has_a_passing_case() -> None:
    """A claimed standard (ai.onnx) op must be exercised by at least one backend case that
    runs and is not a known gap: a claim with no passing case is caught here. Ops outside
    the ONNX standard (com.microsoft contrib ops, the cache domain) have no onnx cases and
    are tested elsewhere."""
    covered = set()
    for c in load_cases():
        if c.excluded is None and c.name not in KNOWN_GAPS and _in_scope(c):
            covered.update((d, op) for d, op, _ in c.ops)
    standard = [(d, op) for d, op in _claims() if d == "" and onnx.defs.has(op, d)]
    assert standard, "supported_ops() claims no standard op"
    missing = sorted(op for d, op in standard if (d, op) not in covered)
    assert not missing, f"claimed ai.onnx ops without a passing backend case: {missing}"
