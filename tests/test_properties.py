"""Property-based tests (hypothesis) over the public API.

For random sequences of calls, valid and invalid: only documented exception classes escape
(``ValueError`` with its subclasses ``CapacityError``/``StaleCheckpointError``, ``TypeError``,
``IndexError``, ``MemoryError``/``BudgetError``, ``NotImplementedError``, ``KeyError`` for an
unknown feed name); a failed call changes nothing (cache lengths and exported bytes identical);
results equal the reference (a numpy model of the cache, ``kernel="reference"`` attention,
numpy for small graphs). Bounded: ``max_examples`` per property and no deadline (a loaded
machine makes per-example timing meaningless); the whole file runs in well under a minute.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import onnx_light_kv as olkv  # noqa: E402

DOCUMENTED = (ValueError, TypeError, IndexError, MemoryError, NotImplementedError, KeyError)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True, database=None)


def _snapshot(cache: olkv.KVCache) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    k, v = cache.export()
    return cache.lengths.copy(), k, v


def _same(a: Tuple[np.ndarray, ...], b: Tuple[np.ndarray, ...]) -> bool:
    return all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def _call(fn: Callable[[], Any]) -> Optional[BaseException]:
    """Run fn; return the documented exception it raised (re-raise any other class)."""
    try:
        fn()
    except DOCUMENTED as e:
        return e
    return None


# -- KVCache operation sequences against a numpy model -----------------------------------------

# a value that is sometimes valid and sometimes hostile, for integer arguments
hostile_int = st.one_of(st.integers(-3, 12), st.sampled_from([2 ** 63, -(2 ** 63), 10 ** 30]),
                        st.sampled_from([1.5, "3", None, True, float("nan")]))

op = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 5), st.sampled_from(["ok", "shape", "dtype", "int", "nan"])),
    st.tuples(st.just("truncate"), hostile_int),
    st.tuples(st.just("reorder"), st.lists(hostile_int, min_size=0, max_size=3)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("rollback"), st.integers(0, 5)),
    st.tuples(st.just("reset")),
)


@SETTINGS
@given(dtype=st.sampled_from(["float32", "float16"]), batch=st.integers(1, 2), ops=st.lists(op, max_size=25))
def test_cache_ops_match_model(dtype: str, batch: int, ops: List[tuple]) -> None:
    kvh, d, cap = 2, 4, 8
    cache = olkv.KVCache(batch=batch, kv_heads=kvh, head_dim=d, dtype=dtype, capacity=cap)
    rng = np.random.default_rng(len(ops))
    # the model: per sequence the list of (k row, v row) as stored (rounded to dtype)
    rows: List[List[Tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(batch)]
    checkpoints: List[Tuple[Any, List[list]]] = []
    for o in ops:
        before = _snapshot(cache)
        name = o[0]
        if name == "append":
            n, kind = o[1], o[2]
            k = rng.standard_normal((batch, kvh, n, d)).astype(np.float32)
            v = rng.standard_normal((batch, kvh, n, d)).astype(np.float32)
            if kind == "shape":
                k = k[:, :, :, :-1]
            elif kind == "dtype":
                k = k.astype(np.complex64)
            elif kind == "int":
                k = k.astype(np.int32)
            elif kind == "nan" and n:
                k[0, 0, 0, 0] = np.nan  # stored as given: NaN is data, not an error
            err = _call(lambda: cache.append(k, v))
            if err is None:
                assert kind in ("ok", "nan") and max(len(r) for r in rows) + n <= cap
                for b in range(batch):
                    for t in range(n):
                        rows[b].append((k[b, :, t].astype(dtype), v[b, :, t].astype(dtype)))
            else:
                assert kind in ("shape", "dtype", "int") or max(len(r) for r in rows) + n > cap, err
        elif name == "truncate":
            err = _call(lambda: cache.truncate(o[1]))
            if err is None:
                rows = [r[:o[1]] for r in rows]
        elif name == "reorder":
            idx = o[1]
            err = _call(lambda: cache.reorder(idx))
            if err is None:
                rows = [list(rows[i]) for i in idx]
                checkpoints.clear()
        elif name == "checkpoint":
            err = _call(lambda: checkpoints.append((cache.checkpoint(), [list(r) for r in rows])))
        elif name == "rollback":
            if not checkpoints:
                continue
            ck, saved = checkpoints[o[1] % len(checkpoints)]
            err = _call(lambda: cache.rollback(ck))
            if err is None:
                rows = [list(r) for r in saved]
            else:
                assert isinstance(err, olkv.StaleCheckpointError), err
        else:
            err = _call(cache.reset)
            rows = [[] for _ in range(batch)]
            checkpoints.clear()
        after = _snapshot(cache)
        if err is not None:
            assert _same(before, after), f"{o} failed with {err!r} but changed the cache"
        assert list(after[0]) == [len(r) for r in rows], (o, after[0])
        for b in range(batch):
            for t, (kr, vr) in enumerate(rows[b]):
                assert after[1][b, :, t].tobytes() == kr.tobytes() and after[2][b, :, t].tobytes() == vr.tobytes()


# -- attention against the reference kernel -----------------------------------------------------

@SETTINGS
@given(
    kvh=st.integers(1, 3), group=st.integers(1, 4), d=st.sampled_from([1, 8, 17, 64]), lens=st.integers(1, 80),
    q_len=st.integers(1, 6), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    scale=st.one_of(st.none(), st.floats(0.01, 1.0), st.sampled_from([0.0, -1.0, float("nan"), float("inf")])),
    softcap=st.one_of(st.just(0.0), st.floats(1.0, 50.0), st.sampled_from([-1.0, float("inf")])),
    window=st.one_of(st.none(), st.integers(-1, 90)),
    special=st.sampled_from([None, np.nan, np.inf, 3e38, 1e-40]),
)
def test_attention_matches_reference(kvh: int, group: int, d: int, lens: int, q_len: int, dtype: str,
                                     scale: Optional[float], softcap: float, window: Optional[int],
                                     special: Optional[float]) -> None:
    rng = np.random.default_rng(d * 131 + lens)
    cache = olkv.KVCache(batch=1, kv_heads=kvh, head_dim=d, dtype=dtype, capacity=128)
    k = rng.standard_normal((1, kvh, lens, d)).astype(np.float32)
    v = rng.standard_normal((1, kvh, lens, d)).astype(np.float32)
    cache.append(k, v)
    q = rng.standard_normal((1, kvh * group, q_len, d)).astype(np.float32)
    if special is not None:
        q[0, 0, 0, 0] = special
    before = _snapshot(cache)
    kw = dict(scale=scale, softcap=softcap, window=window)
    want = got = None
    err_ref: Optional[BaseException] = None
    try:
        want = olkv.attention(q, cache, kernel="reference", **kw)
    except DOCUMENTED as e:
        err_ref = e
    try:
        got = olkv.attention(q, cache, **kw)
    except DOCUMENTED as e:
        assert err_ref is not None and type(e) is type(err_ref), (e, err_ref)
    else:
        assert err_ref is None, f"reference raised {err_ref!r}, the kernel returned"
        assert got.shape == (1, kvh * group, q_len, d)
        finite = np.isfinite(want)
        assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN positions differ from the reference"
        assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
        np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-5)
    assert _same(before, _snapshot(cache)), "attention changed the cache"


# -- InferenceSession on small graphs ------------------------------------------------------------

def _add_model() -> bytes:
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Relu", ["z"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


_SESSION: List[Any] = []


def _session() -> Any:
    if not _SESSION:
        _SESSION.append(olkv.InferenceSession(_add_model()))
    return _SESSION[0]


feed_value = st.one_of(
    st.integers(0, 4).map(lambda n: np.arange(3 * n, dtype=np.float32).reshape(n, 3) - 2),
    st.sampled_from([np.zeros((2, 4), np.float32), np.zeros((2, 3), np.int64), np.zeros((2, 3), np.float64),
                     np.zeros(3, np.float32), None, "x", 3]),
)


@SETTINGS
@given(x=feed_value, y=feed_value, names=st.sampled_from([("x", "y"), ("x",), ("x", "y", "w"), ("y", "x")]),
       outputs=st.sampled_from([None, ["r"], ["nope"], "r"]))
def test_session_run_matches_numpy(x: Any, y: Any, names: tuple, outputs: Any) -> None:
    sess = _session()
    vals = {"x": x, "y": y, "w": x}
    feeds = {n: vals[n] for n in names}
    try:
        res = sess.run(outputs, feeds)
    except DOCUMENTED as e:
        if isinstance(outputs, str):
            assert isinstance(e, TypeError), e  # as onnxruntime: a str is not a list of names
        return
    xa, ya = np.asarray(x), np.asarray(y)
    assert set(names) >= {"x", "y"} and outputs in (None, ["r"])
    np.testing.assert_allclose(res[0], np.maximum(xa.astype(np.float32) + ya.astype(np.float32), 0), rtol=1e-6)


# -- generate arguments ---------------------------------------------------------------------------

_DECODER: List[Any] = []


def _decoder() -> Any:
    if not _DECODER:
        from onnx_light_kv import models as M
        cfg = M.DecoderConfig(layers=1, hidden=32, q_heads=2, kv_heads=1, head_dim=16, vocab=32, max_positions=64)
        _DECODER.append(olkv.InferenceSession(M.model_bytes(M.llama_decoder(cfg)), threads=1))
    return _DECODER[0]


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    max_new_tokens=hostile_int, temperature=st.sampled_from([1.0, 0.0, -1.0, 0.7, float("nan"), "hot"]),
    top_k=hostile_int, top_p=st.sampled_from([1.0, 0.5, 0.0, 1.5, float("nan")]),
    num_beams=st.sampled_from([1, 2, 0, -1]), do_sample=st.booleans(),
    ids=st.sampled_from([[1, 2, 3], [], [[1, 2], [3, 4]], [40], [-1]]),
)
def test_generate_arguments(max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, num_beams: Any,
                            do_sample: bool, ids: list) -> None:
    sess = _decoder()
    try:
        out = olkv.generate(sess, np.asarray(ids, dtype=np.int64), max_new_tokens=max_new_tokens,
                            temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
                            do_sample=do_sample, seed=0)
    except DOCUMENTED:
        return
    seqs = np.asarray(out.sequences)
    assert seqs.ndim == 2 and seqs.shape[1] <= len(np.asarray(ids).reshape(seqs.shape[0], -1)[0]) + max_new_tokens
    assert ((0 <= seqs) & (seqs < 32)).all()
