"""One validation rule per argument kind at the Python boundary.

A table of hostile arguments per public entry point: each call must raise
the documented built-in class (never OverflowError, AttributeError or a
silent truncation by ``int()``), and a failed call must change nothing
(observable state compared before and after).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple, Type

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_light_kv as olkv
from onnx_light_kv import _validate as v

HUGE = [2**63, 10**30, -(2**63) - 1]
NOT_INTEGERS = [1.5, 2.0, "3", b"3", None, np.array(1.5), np.float64(2.0), [1], object(), 1 + 0j]


# -- the validators themselves ---------------------------------------------------

@pytest.mark.parametrize("value,kw,exc", [
    (True, {}, TypeError), (False, {}, TypeError), (1.0, {}, TypeError), ("1", {}, TypeError),
    (np.array(1.5), {}, TypeError), (None, {}, TypeError), (2**63, {}, ValueError),
    (10**30, {}, ValueError), (-(2**63) - 1, {}, ValueError), (0, {"lo": 1}, ValueError),
    (5, {"lo": 1, "hi": 4}, ValueError),
])
def test_integer_rejects(value: Any, kw: Dict[str, Any], exc: Type[Exception]) -> None:
    with pytest.raises(exc):
        v.integer(value, "x", **kw)


@pytest.mark.parametrize("value,want", [(3, 3), (np.int64(7), 7), (np.uint8(255), 255), (np.array(4), 4),
                                        (2**63 - 1, 2**63 - 1), (-(2**63), -(2**63))])
def test_integer_accepts(value: Any, want: int) -> None:
    got = v.integer(value, "x")
    assert got == want and type(got) is int
    assert v.integer(True, "x", allow_bool=True) == 1


@pytest.mark.parametrize("value,kw,exc", [
    (math.inf, {}, ValueError), (-math.inf, {}, ValueError), (math.nan, {}, ValueError),
    (10**400, {}, ValueError), (1e39, {"float32": True}, ValueError), ("1.0", {}, TypeError),
    (True, {}, TypeError), (None, {}, TypeError), (np.array([1.0]), {}, TypeError), (-1.0, {"lo": 0.0}, ValueError),
])
def test_real_rejects(value: Any, kw: Dict[str, Any], exc: Type[Exception]) -> None:
    with pytest.raises(exc):
        v.real(value, "x", **kw)


def test_real_accepts() -> None:
    assert v.real(2, "x") == 2.0 and v.real(np.float32(0.5), "x") == 0.5
    assert v.real(math.inf, "x", finite=False) == math.inf
    assert v.real(3.4e38, "x", float32=True) == 3.4e38


def test_instance_and_choice() -> None:
    with pytest.raises(TypeError, match="must be a Arena, got str"):
        v.instance("x", "arena", olkv.Arena)
    with pytest.raises(TypeError):
        v.choice(None, "kernel", ("auto",))
    with pytest.raises(ValueError, match="one of 'auto'"):
        v.choice("", "kernel", ("auto",))
    assert v.choice("auto", "kernel", ("auto",)) == "auto"


# -- entry points -------------------------------------------------------------------

def _cache() -> olkv.KVCache:
    c = olkv.KVCache(2, 2, 4, capacity=8)
    c.append(np.ones((2, 2, 3, 4), np.float32), np.full((2, 2, 3, 4), 2.0, np.float32))
    return c


def _q() -> np.ndarray:
    return np.ones((2, 2, 1, 4), np.float32)


def _cache_state(c: olkv.KVCache) -> Tuple[Any, ...]:
    k, vv = c.export()
    return (c.lengths.tolist(), k.tobytes(), vv.tobytes(), c.info()["window_starts"] if "window_starts" in c.info()
            else None, c.info()["checkpoints"])


CacheCall = Callable[[olkv.KVCache], Any]


def _cache_calls() -> List[Tuple[str, CacheCall, Type[Exception]]]:
    calls: List[Tuple[str, CacheCall, Type[Exception]]] = []
    for bad in NOT_INTEGERS:
        calls.append((f"evict({bad!r})", lambda c, b=bad: c.evict(b), TypeError))
    calls.append(("evict(True)", lambda c: c.evict(True), TypeError))
    calls.append(("evict(-1)", lambda c: c.evict(-1), ValueError))
    for bad in HUGE:
        calls.append((f"evict({bad})", lambda c, b=bad: c.evict(b), ValueError))
        calls.append((f"truncate({bad})", lambda c, b=bad: c.truncate(b), ValueError))
        calls.append((f"truncate([{bad}, 1])", lambda c, b=bad: c.truncate([b, 1]), ValueError))
        calls.append((f"reorder([{bad}, 0])", lambda c, b=bad: c.reorder([b, 0]), ValueError))
    calls += [
        ("truncate(1.5)", lambda c: c.truncate(1.5), TypeError),
        ("truncate(True)", lambda c: c.truncate(True), TypeError),
        ("truncate('2')", lambda c: c.truncate("2"), TypeError),
        ("truncate([True, False])", lambda c: c.truncate([True, False]), TypeError),
        ("reorder(np.uint64 2**63)", lambda c: c.reorder(np.array([2**63, 0], np.uint64)), ValueError),
        ("rollback(None)", lambda c: c.rollback(None), TypeError),
        ("export(dtype=int8)", lambda c: c.export("int8"), TypeError),
        ("attention(q, None)", lambda c: olkv.attention(_q(), None), TypeError),
        ("attention(q, 'x')", lambda c: olkv.attention(_q(), "x"), TypeError),
        ("attention(q, arena)", lambda c: olkv.attention(_q(), c.arena), TypeError),
        ("scale='1'", lambda c: olkv.attention(_q(), c, scale="1"), TypeError),
        ("scale=True", lambda c: olkv.attention(_q(), c, scale=True), TypeError),
        ("scale=inf", lambda c: olkv.attention(_q(), c, scale=math.inf), ValueError),
        ("scale=nan", lambda c: olkv.attention(_q(), c, scale=math.nan), ValueError),
        ("scale=1e39", lambda c: olkv.attention(_q(), c, scale=1e39), ValueError),
        ("scale=10**400", lambda c: olkv.attention(_q(), c, scale=10**400), ValueError),
        ("softcap=None", lambda c: olkv.attention(_q(), c, softcap=None), TypeError),
        ("softcap=-1", lambda c: olkv.attention(_q(), c, softcap=-1.0), ValueError),
        ("softcap=inf", lambda c: olkv.attention(_q(), c, softcap=math.inf), ValueError),
        ("softcap=nan", lambda c: olkv.attention(_q(), c, softcap=math.nan), ValueError),
        ("softcap=1e-46 (0 in float32)", lambda c: olkv.attention(_q(), c, softcap=1e-46), ValueError),
        ("window=1.5", lambda c: olkv.attention(_q(), c, window=1.5), TypeError),
        ("window=True", lambda c: olkv.attention(_q(), c, window=True), TypeError),
        ("window=0", lambda c: olkv.attention(_q(), c, window=0), ValueError),
        ("window=2**63", lambda c: olkv.attention(_q(), c, window=2**63), ValueError),
        ("window=10**30", lambda c: olkv.attention(_q(), c, window=10**30), ValueError),
        ("kernel=None", lambda c: olkv.attention(_q(), c, kernel=None), TypeError),
        ("kernel=''", lambda c: olkv.attention(_q(), c, kernel=""), ValueError),
        ("out=list", lambda c: olkv.attention(_q(), c, out=[0.0] * 8), TypeError),
    ]
    return calls


CACHE_CALLS = _cache_calls()


@pytest.mark.parametrize("name,call,exc", CACHE_CALLS, ids=[c[0] for c in CACHE_CALLS])
def test_cache_entry_points_reject_and_change_nothing(name: str, call: CacheCall, exc: Type[Exception]) -> None:
    c = _cache()
    before = _cache_state(c)
    with pytest.raises(exc):
        call(c)
    assert _cache_state(c) == before


def _geometry_calls() -> List[Tuple[str, Dict[str, Any], Type[Exception]]]:
    calls: List[Tuple[str, Dict[str, Any], Type[Exception]]] = []
    for field in ("batch", "kv_heads", "head_dim", "head_dim_v", "capacity"):
        calls.append((f"{field}=0", {field: 0}, ValueError))
        calls.append((f"{field}=-1", {field: -1}, ValueError))
        calls.append((f"{field}=True", {field: True}, TypeError))
        for bad in HUGE:
            calls.append((f"{field}={bad}", {field: bad}, ValueError))
        for bad in (1.5, "3", np.array(2.0)) + ((None,) if field != "head_dim_v" else ()):
            calls.append((f"{field}={bad!r}", {field: bad}, TypeError))
    calls += [("arena='x'", {"arena": "x"}, TypeError), ("arena=KVCache", {"arena": "cache"}, TypeError),
              ("arena=1", {"arena": 1}, TypeError), ("dtype='int8'", {"dtype": "int8"}, TypeError)]
    return calls


GEOMETRY_CALLS = _geometry_calls()


@pytest.mark.parametrize("name,kw,exc", GEOMETRY_CALLS, ids=[c[0] for c in GEOMETRY_CALLS])
def test_kvcache_constructor_rejects(name: str, kw: Dict[str, Any], exc: Type[Exception]) -> None:
    arena = olkv.Arena()
    other = olkv.KVCache(1, 1, 4, capacity=4, arena=arena)
    args: Dict[str, Any] = dict(batch=1, kv_heads=1, head_dim=4, capacity=4, arena=arena)
    args.update(kw)
    if args["arena"] == "cache":
        args["arena"] = other
    before = arena.stats()["committed_bytes"]
    with pytest.raises(exc):
        olkv.KVCache(**args)
    assert arena.stats()["committed_bytes"] == before


@pytest.mark.parametrize("bad,exc", [("3", TypeError), (1.5, TypeError), (True, TypeError), (np.array(2.5), TypeError),
                                     (-1, ValueError)] + [(h, ValueError) for h in HUGE])
def test_arena_budget_rejects(bad: Any, exc: Type[Exception]) -> None:
    with pytest.raises(exc):
        olkv.Arena(budget=bad)
    a = olkv.Arena(budget=1 << 20)
    with pytest.raises(exc):
        a.budget = bad
    assert a.budget == 1 << 20
    a.budget = None
    assert a.budget is None


@pytest.mark.parametrize("bad,exc", [(1.5, TypeError), ("2", TypeError), (True, TypeError), (np.array(1.5), TypeError),
                                     (1025, ValueError)] + [(h, ValueError) for h in HUGE[:2]])
def test_set_threads_rejects(bad: Any, exc: Type[Exception]) -> None:
    before = olkv.get_threads()
    with pytest.raises(exc):
        olkv.set_threads(bad)
    assert olkv.get_threads() == before


@pytest.mark.parametrize("bad,exc", [("", ValueError), ("fast", ValueError), (None, TypeError), (3, TypeError),
                                     (b"go", TypeError)])
def test_set_kernel_rejects(bad: Any, exc: Type[Exception]) -> None:
    before = olkv.build_info()["attention_kernel"]
    with pytest.raises(exc):
        olkv.set_kernel(bad)
    assert olkv.build_info()["attention_kernel"] == before


def test_set_kernel_ignores_case() -> None:
    before = olkv.build_info()["attention_kernel"]
    try:
        olkv.set_kernel(" GO ")
        assert olkv.build_info()["attention_kernel"] == "go"
    finally:
        olkv.set_kernel(before)


def test_build_info_names_the_cpu_tuning() -> None:
    info = olkv.build_info()
    simd = [k for k in info["attention_kernels"] if k != "go"]
    assert info["kernel_tuning"] in (("intel", "zen") if simd else ("",))
    if simd:
        amd = info["vendor"] in ("AuthenticAMD", "HygonGenuine")
        assert info["kernel_tuning"] == ("zen" if amd else "intel")


def test_set_kernel_switches_the_matrix_kernels_too() -> None:
    info = olkv.build_info()
    try:
        for name in info["attention_kernels"]:
            olkv.set_kernel(name)
            assert olkv.build_info()["gemm_kernel"] == name
    finally:
        olkv.set_kernel(info["attention_kernel"])


@pytest.mark.parametrize("kw,exc", [({"mib": 1.5}, TypeError), ({"mib": 0}, ValueError), ({"threads": "1"}, TypeError),
                                    ({"threads": 0}, ValueError), ({"iters": 2**63}, ValueError),
                                    ({"threads": 10**30}, ValueError)])
def test_read_bandwidth_rejects(kw: Dict[str, Any], exc: Type[Exception]) -> None:
    with pytest.raises(exc):
        olkv.read_bandwidth(**{"mib": 1, "threads": 1, "iters": 1, **kw})


@pytest.mark.parametrize("bad,exc", [(1.5, TypeError), (True, TypeError), (0, ValueError), (2**63, ValueError)])
def test_stream_read_rejects(bad: Any, exc: Type[Exception]) -> None:
    with pytest.raises(exc):
        olkv.stream_read(np.ones(1024, np.float32), threads=bad)


# -- sessions --------------------------------------------------------------------------

def _model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


@pytest.mark.parametrize("bad,exc", [(1.5, TypeError), ("2", TypeError), (True, TypeError), (-1, ValueError),
                                     (1025, ValueError), (2**63, ValueError), (10**30, ValueError)])
def test_session_threads_rejects(bad: Any, exc: Type[Exception]) -> None:
    with pytest.raises(exc):
        olkv.InferenceSession(_model(), threads=bad)


@pytest.mark.parametrize("bad,exc", [(1.5, TypeError), ("2", TypeError), (-1, ValueError), (10**30, ValueError)])
def test_session_options_threads_rejects(bad: Any, exc: Type[Exception]) -> None:
    opts = olkv.SessionOptions()
    with pytest.raises(exc):
        opts.intra_op_num_threads = bad
    assert opts.intra_op_num_threads == 0


@pytest.mark.parametrize("kw,exc", [({"batch": 1.5}, TypeError), ({"batch": 0}, ValueError), ({"batch": True}, TypeError),
                                    ({"batch": 2**63}, ValueError), ({"max_length": 10**30}, ValueError),
                                    ({"max_length": 0}, ValueError), ({"budget": "3"}, TypeError),
                                    ({"budget": 2**63}, ValueError)])
def test_create_state_rejects_before_planning(kw: Dict[str, Any], exc: Type[Exception]) -> None:
    """Argument errors come first (this model has no cache to rewrite, which
    would be a NotImplementedError)."""
    sess = olkv.InferenceSession(_model())
    with pytest.raises(exc):
        sess.create_state(**kw)
    with pytest.raises(NotImplementedError):
        sess.create_state()


@pytest.mark.parametrize("bad", [1.5, None, ["x"], 3])
def test_inference_session_source_type(bad: Any) -> None:
    with pytest.raises(TypeError):
        olkv.InferenceSession(bad)
