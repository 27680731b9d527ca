"""The streaming decode kernel (``onnx_light_kv.attention``) vs onnxruntime's
``com.microsoft.GroupQueryAttention`` on the same inputs.

Each case fills a ``KVCache`` and onnxruntime's past/present buffer (bound to one OrtValue
through IOBinding, the shared-buffer contract) with the same past K/V, appends the same new
token(s) on both sides and compares the attention outputs. Every kernel path the build offers
(portable Go, AVX2, AVX-512) and the reference kernel are checked, with one and two threads.

Mapping of the options: our ``window=W`` (each query sees its last W positions, itself
included) is GQA's ``local_window_size=W`` (observed with onnxruntime 1.32: the query at
position p sees keys p-W+1..p); ``softcap`` and ``scale`` are the same attributes.
Batches have different lengths per sequence (GQA's ``seqlens_k`` per batch row).

Tolerances (``|got - want| <= atol + rtol * |want|``):
* float32 cache: 2e-5 + 2e-5 -- fp32 on both sides, summation order and exp differ.
* float16 cache: 2e-3 + 2e-3 -- both sides read the same fp16-rounded K/V and accumulate in
  fp32, but onnxruntime also rounds q, the scores path and the output to fp16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

olkv = pytest.importorskip("onnx_light_kv")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3)}


@dataclass(frozen=True)
class Case:
    lens: Tuple[int, ...]  # tokens per sequence after the step (new ones included)
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    q_len: int = 1
    dtype: str = "float32"
    window: Optional[int] = None
    softcap: float = 0.0
    scale: Optional[float] = None

    @property
    def id(self) -> str:
        extra = (f"-w{self.window}" if self.window else "") + (f"-cap{self.softcap:g}" if self.softcap else "") \
            + (f"-s{self.scale:g}" if self.scale else "")
        return (f"{self.dtype}-h{self.q_heads}_{self.kv_heads}-d{self.head_dim}-L{'_'.join(map(str, self.lens))}"
                f"-q{self.q_len}{extra}")


CASES = [
    Case(lens=(1,)),
    Case(lens=(7,), q_heads=4, kv_heads=4),
    Case(lens=(33, 5), head_dim=128),
    Case(lens=(300,), q_heads=8, kv_heads=1),
    Case(lens=(65, 64, 63), q_heads=12, kv_heads=4, head_dim=96),
    Case(lens=(129,), q_heads=32, kv_heads=8, head_dim=128),
    Case(lens=(200,), q_len=4),  # GQA takes S > 1 with a past only for batch 1
    Case(lens=(50,), q_len=16, q_heads=4, kv_heads=1),
    Case(lens=(300, 40), window=64),
    Case(lens=(100,), window=1),
    Case(lens=(90,), q_len=3, window=20),
    Case(lens=(80, 12), softcap=3.0, scale=0.4),
    Case(lens=(1000,), q_heads=32, kv_heads=8, head_dim=128),
    Case(lens=(150, 3), dtype="float16"),
    Case(lens=(257,), dtype="float16", q_heads=32, kv_heads=8, head_dim=128),
    # the unrolled single-row (MHA) loops of head dims 80, 96 and 256 (Phi-2, Phi-3, Gemma)
    Case(lens=(70, 9), q_heads=4, kv_heads=4, head_dim=80),
    Case(lens=(131,), q_heads=4, kv_heads=4, head_dim=96),
    Case(lens=(130, 3), q_heads=2, kv_heads=2, head_dim=256),
    Case(lens=(67,), dtype="float16", q_heads=4, kv_heads=4, head_dim=96),
    Case(lens=(45,), dtype="float16", q_heads=2, kv_heads=2, head_dim=256),
]


def _gqa_model(c: Case, capacity: int) -> bytes:
    dt = TensorProto.FLOAT16 if c.dtype == "float16" else TensorProto.FLOAT
    b, d = len(c.lens), c.head_dim
    attrs: Dict[str, Any] = {"num_heads": c.q_heads, "kv_num_heads": c.kv_heads}
    if c.window:
        attrs["local_window_size"] = c.window
    if c.softcap:
        attrs["softcap"] = c.softcap
    if c.scale:
        attrs["scale"] = c.scale
    node = helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"], domain="com.microsoft", **attrs)
    io = lambda n, shape: helper.make_tensor_value_info(n, dt, shape)  # noqa: E731
    graph = helper.make_graph(
        [node], "gqa",
        [io("query", [b, c.q_len, c.q_heads * d]), io("key", [b, c.q_len, c.kv_heads * d]),
         io("value", [b, c.q_len, c.kv_heads * d]), io("past_key", [b, c.kv_heads, capacity, d]),
         io("past_value", [b, c.kv_heads, capacity, d]),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [b]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])],
        [io("output", [b, c.q_len, c.q_heads * d]), io("present_key", [b, c.kv_heads, capacity, d]),
         io("present_value", [b, c.kv_heads, capacity, d])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def _inputs(c: Case) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(abs(hash(c.id)) % (2 ** 32))
    np_dt = np.float16 if c.dtype == "float16" else np.float32
    b, L, d = len(c.lens), max(c.lens), c.head_dim
    # Values rounded to the storage type once, so both sides see identical numbers.
    rnd = lambda *shape: rng.standard_normal(shape, np.float32).astype(np_dt).astype(np.float32)  # noqa: E731
    return {"past_k": rnd(b, c.kv_heads, L, d), "past_v": rnd(b, c.kv_heads, L, d),
            "k": rnd(b, c.kv_heads, c.q_len, d), "v": rnd(b, c.kv_heads, c.q_len, d),
            "q": rnd(b, c.q_heads, c.q_len, d) * (3.0 if c.softcap else 1.0)}


def _run_ort(c: Case, x: Dict[str, np.ndarray]) -> np.ndarray:
    """GQA over a shared past/present buffer; returns [B, Hq, S, D] float32."""
    np_dt = np.float16 if c.dtype == "float16" else np.float32
    b, d, s = len(c.lens), c.head_dim, c.q_len
    cap = max(c.lens) + 1
    kbuf = np.zeros((b, c.kv_heads, cap, d), np_dt)
    vbuf = np.zeros((b, c.kv_heads, cap, d), np_dt)
    for i, L in enumerate(c.lens):
        kbuf[i, :, :L - s] = x["past_k"][i, :, :L - s]
        vbuf[i, :, :L - s] = x["past_v"][i, :, :L - s]
    # GQA's batch rows are right-padded: row i's new tokens are its first S query rows.
    flat = lambda a, h: np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(b, s, h * d).astype(np_dt))  # noqa: E731
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(_gqa_model(c, cap), so, providers=["CPUExecutionProvider"])
    ov = ort.OrtValue.ortvalue_from_numpy
    kv, vv = ov(kbuf), ov(vbuf)
    out = ov(np.zeros((b, s, c.q_heads * d), np_dt))
    bind = sess.io_binding()
    feeds = {"query": flat(x["q"], c.q_heads), "key": flat(x["k"], c.kv_heads), "value": flat(x["v"], c.kv_heads),
             "seqlens_k": np.array([L - 1 for L in c.lens], np.int32),
             "total_sequence_length": np.array(max(c.lens), np.int32)}
    keep = {n: ov(a) for n, a in feeds.items()}
    for n, val in keep.items():
        bind.bind_ortvalue_input(n, val)
    bind.bind_ortvalue_input("past_key", kv)
    bind.bind_ortvalue_input("past_value", vv)
    bind.bind_ortvalue_output("output", out)
    bind.bind_ortvalue_output("present_key", kv)
    bind.bind_ortvalue_output("present_value", vv)
    sess.run_with_iobinding(bind)
    # The new key must have landed in the shared buffer (no silent copy).
    for i, L in enumerate(c.lens):
        np.testing.assert_array_equal(kbuf[i, :, L - s:L].astype(np.float32), x["k"][i])
    return out.numpy().astype(np.float32).reshape(b, s, c.q_heads, d).transpose(0, 2, 1, 3)


def _cache(c: Case, x: Dict[str, np.ndarray]) -> Any:
    b, s = len(c.lens), c.q_len
    cache = olkv.KVCache(b, c.kv_heads, c.head_dim, dtype=c.dtype, capacity=max(c.lens))
    past = [L - s for L in c.lens]
    if max(past) > 0:
        cache.append(np.ascontiguousarray(x["past_k"][:, :, :max(past)]),
                     np.ascontiguousarray(x["past_v"][:, :, :max(past)]), counts=past)
    cache.append(x["k"], x["v"])
    assert list(cache.lengths) == list(c.lens)
    return cache


def _kernels() -> List[str]:
    return list(olkv.build_info().get("attention_kernels", ["go"]))


def _paths_and_threads() -> Iterator[Tuple[str, int]]:
    """Set each kernel path of this CPU with 1 and 2 threads in turn, yielding (path, threads);
    the path and thread count are put back at the end."""
    before = olkv.get_threads()
    try:
        for path in _kernels():
            olkv.set_kernel(path)
            for threads in (1, 2):
                olkv.set_threads(threads)
                yield path, threads
    finally:
        olkv.set_kernel("auto")
        olkv.set_threads(before)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_kernel_matches_onnxruntime_gqa(c: Case) -> None:
    x = _inputs(c)
    try:
        want = _run_ort(c, x)
    except Exception as e:  # pragma: no cover - depends on the onnxruntime build
        if c.dtype == "float16" and "NOT_IMPLEMENTED" in str(e):
            pytest.skip(f"onnxruntime CPU GroupQueryAttention has no float16 kernel: {e}")
        raise
    cache = _cache(c, x)
    rtol, atol = TOL[c.dtype]
    try:
        for path, threads in _paths_and_threads():
            got = olkv.attention(x["q"], cache, scale=c.scale, softcap=c.softcap, window=c.window)
            err = np.abs(got - want)
            bad = err > atol + rtol * np.abs(want)
            assert not bad.any(), (f"path {path} threads {threads}: {int(bad.sum())} elements off, "
                                   f"max |diff| {float(err.max()):.3g}")
        ref = olkv.attention(x["q"], cache, scale=c.scale, softcap=c.softcap, window=c.window, kernel="reference")
        np.testing.assert_allclose(ref, want, rtol=rtol, atol=atol)
    finally:
        cache.close()


def test_kernel_reads_each_kv_byte_once() -> None:
    """One decode step over a GQA cache reads K+V exactly once (the cache's counter)."""
    c = Case(lens=(500, 77), q_heads=8, kv_heads=2, head_dim=64)
    cache = _cache(c, _inputs(c))
    try:
        cache.reset_counters()
        olkv.attention(_inputs(c)["q"], cache)
        want = sum(c.lens) * c.kv_heads * 2 * c.head_dim * 4
        assert cache.counters["attention_bytes"] == want
    finally:
        cache.close()


def test_bandwidth_probes() -> None:
    """read_bandwidth and stream_read return positive rates; bad arguments raise the
    documented exception classes and change nothing."""
    assert olkv.read_bandwidth(4, 1, 1) > 0
    buf = np.ones(1 << 20, np.float32)
    for threads in (1, 2, 3):
        assert olkv.stream_read(buf, threads) > 0
    assert olkv.stream_read(np.ones(3, np.float32), 8) > 0  # more threads than elements
    with pytest.raises(ValueError):
        olkv.read_bandwidth(0, 1, 1)
    with pytest.raises(ValueError):  # more than the machine holds: refused, not attempted
        olkv.read_bandwidth(10 ** 9, 1, 1)
    with pytest.raises(ValueError):
        olkv.read_bandwidth(4, 5000, 1)
    with pytest.raises(ValueError):
        olkv.stream_read(buf, 5000)
    with pytest.raises(TypeError):
        olkv.stream_read(buf.astype(np.float64))
    with pytest.raises(TypeError):
        olkv.stream_read(list(range(4)))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        olkv.stream_read(buf.reshape(1024, 1024)[:, ::2])
    with pytest.raises(ValueError):
        olkv.stream_read(np.ones(0, np.float32))
    with pytest.raises(ValueError):
        olkv.stream_read(buf, 0)
    assert (buf == 1).all()


def test_set_threads_bounds() -> None:
    """More than 1024 kernel threads is refused (each would be a polling helper); the
    setting is unchanged."""
    before = olkv.get_threads()
    with pytest.raises(ValueError):
        olkv.set_threads(5000)
    assert olkv.get_threads() == before
    olkv.set_threads(3)
    try:
        assert olkv.get_threads() == 3
    finally:
        olkv.set_threads(before)


@pytest.mark.parametrize("extra", [{}, {"dtype": "bfloat16"}, {"layout": "paged", "block_size": 16}],
                         ids=["fp32", "bf16", "paged"])
def test_a_key_far_below_the_maximum_weighs_nothing(extra: dict) -> None:
    """A key scoring 100 below the others gets weight exp(-100) ~ 4e-44, which is 0 in float32:
    its huge finite V row (3e38) must not reach the output (a weight floored at the smallest
    normal float32 added 0.11 here), on every path and thread count."""
    d, n = 16, 32
    cache = olkv.KVCache(1, 1, d, capacity=64, **extra)
    k = np.zeros((1, 1, n, d), np.float32)
    k[0, 0, :, 0] = 100.0
    k[0, 0, 0, 0] = 0.0
    v = np.zeros((1, 1, n, d), np.float32)
    v[0, 0, 0, :] = 3e38
    cache.append(k, v)
    q = np.zeros((1, 1, 1, d), np.float32)
    q[0, 0, 0, 0] = 1.0
    try:
        for path, threads in _paths_and_threads():
            got = olkv.attention(q, cache, scale=1.0)
            assert float(np.abs(got).max()) < 1e-5, f"path {path} threads {threads}: {float(got.max())}"
    finally:
        cache.close()
