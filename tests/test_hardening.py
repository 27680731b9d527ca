"""Hostile inputs at the boundary: bounded model reading, refused opsets,
atomic export under concurrent mutation, checkpoint limits, overlapping
output buffers.

Argument validation (one rule per argument kind) is in test_validation.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_light_kv as olkv

_MIB = 1 << 20


def _identity_model(opsets: list[tuple[str, int]]) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10)
    return model.SerializeToString()


# -- bounded model reading -----------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_device_fails_fast_with_bounded_memory(device: str) -> None:
    """Reading a device never trusts its Stat() size (0): the read stops on the
    first bytes that cannot start a ModelProto, or at the size limit. Run in a
    child interpreter so the peak RSS it reports is this load's alone."""
    if not os.path.exists(device):
        pytest.skip(f"{device} is missing")
    child = textwrap.dedent(f"""
        import resource, sys, time
        import onnx_light_kv as olkv
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        try:
            olkv.InferenceSession({device!r})
        except ValueError as e:
            kind = "ValueError: " + str(e)
        except BaseException as e:
            kind = type(e).__name__ + ": " + str(e)
        else:
            kind = "loaded"
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(kind.splitlines()[0])
        print(grew * 1024)
        print(time.perf_counter() - t)
    """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    kind, grew, took = r.stdout.strip().splitlines()[-3:]
    assert kind.startswith("ValueError: "), kind
    assert device in kind
    assert int(grew) < 64 * _MIB, f"peak RSS grew by {int(grew) / _MIB:.0f} MiB"
    assert float(took) < 30


def test_model_through_a_pipe_loads(tmp_path) -> None:
    """Non-regular files are read up to EOF: a model streamed through a named pipe loads."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes")
    data = _identity_model([("", 17)])
    fifo = tmp_path / "model.pipe"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "wb") as f:
            for i in range(0, len(data), 5):
                f.write(data[i:i + 5])
                f.flush()

    t = threading.Thread(target=writer)
    t.start()
    try:
        sess = olkv.InferenceSession(str(fifo))
    finally:
        t.join(timeout=30)
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)


@pytest.mark.parametrize("domain,version,newest", [("", 99, 25), ("ai.onnx", 26, 25),
                                                   ("com.microsoft", 2, 1), ("ai.onnx.ml", 6, 5)])
def test_newer_opset_is_refused_naming_both_versions(domain: str, version: int, newest: int) -> None:
    opsets = [("", 17), (domain, version)] if domain not in ("", "ai.onnx") else [(domain, version)]
    with pytest.raises(NotImplementedError) as ei:
        olkv.InferenceSession(_identity_model(opsets))
    msg = str(ei.value)
    assert f"opset {version}" in msg and f"up to {newest}" in msg, msg


@pytest.mark.parametrize("opsets", [[("", 25)], [("", 13), ("com.microsoft", 1)], [("", 17), ("ai.onnx.ml", 5)]])
def test_known_opsets_load(opsets: list[tuple[str, int]]) -> None:
    olkv.InferenceSession(_identity_model(opsets))


# -- atomic export ---------------------------------------------------------------

def test_export_is_atomic_under_concurrent_append_and_reset() -> None:
    """Another thread appends and resets while this one exports: every export
    is one consistent state (the length and the rows agree, no zero rows at
    the end, every row holds the value appended)."""
    cap = 64
    cache = olkv.KVCache(1, 2, 8, capacity=cap)
    row = np.ones((1, 2, 1, 8), np.float32)
    stop = threading.Event()
    failures: list[BaseException] = []

    def mutate() -> None:
        i = 0
        try:
            while not stop.is_set():
                if cache.lengths[0] >= cap or i % 13 == 0:
                    cache.reset()
                cache.append(row, 2 * row)
                i += 1
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    t = threading.Thread(target=mutate)
    t.start()
    exports = 0
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and exports < 3000:
            k, v = cache.export()
            n = k.shape[2]
            assert k.shape == (1, 2, n, 8) and v.shape == (1, 2, n, 8)
            assert (k == 1).all() and (v == 2).all(), f"export of length {n} holds other values"
            exports += 1
    finally:
        stop.set()
        t.join()
    assert not failures, failures
    assert exports > 0


def test_export_after_growth_between_length_and_copy() -> None:
    """The Go export reports the length it saw under the lock; the wrapper
    retries when the cache grew after its first length probe."""
    from onnx_light_kv.cache import _export_presents

    cache = olkv.KVCache(2, 1, 4, capacity=16)
    cache.append(np.ones((2, 1, 5, 4), np.float32), np.ones((2, 1, 5, 4), np.float32))
    h = cache._h
    calls = []

    def export(*a):
        calls.append(a[-1])
        return olkv.cache._call(olkv.cache._f("CacheExport"), h, *a)

    k, v = _export_presents(export, 2, (2, 1, 4), (2, 1, 4), np.dtype(np.float32))  # stale hint 2 < 5
    assert calls == [2, 5]
    assert k.shape == (2, 1, 5, 4) and (k == 1).all() and (v == 1).all()
    # a cache that shrank exports only its valid rows, into the bigger buffer's prefix
    cache.truncate(3)
    k, v = _export_presents(export, 5, (2, 1, 4), (2, 1, 4), np.dtype(np.float32))
    assert k.shape == (2, 1, 3, 4) and (k == 1).all()


# -- checkpoint limit ---------------------------------------------------------------

def test_checkpoint_dropped_past_64_says_so() -> None:
    cache = olkv.KVCache(1, 1, 4, capacity=8)
    cache.append(np.ones((1, 1, 2, 4), np.float32), np.ones((1, 1, 2, 4), np.float32))
    cks = [cache.checkpoint() for _ in range(64)]
    cache.rollback(cks[0])  # 64 live: the oldest still restores
    cks.append(cache.checkpoint())
    with pytest.raises(olkv.StaleCheckpointError) as ei:
        cache.rollback(cks[0])
    msg = str(ei.value)
    assert "dropped" in msg and "64 newest" in msg and "64 newer" in msg, msg
    cache.rollback(cks[1])
    released = cks[2]
    released.release()
    with pytest.raises(olkv.StaleCheckpointError, match="released"):
        cache.rollback(released)
    cache.reset()
    with pytest.raises(olkv.StaleCheckpointError, match="invalidated by reset/reorder"):
        cache.rollback(cks[-1])


# -- overlapping output -------------------------------------------------------------

def _cache_for_attention(d: int = 8) -> olkv.KVCache:
    rng = np.random.default_rng(5)
    cache = olkv.KVCache(1, 2, d, capacity=16)
    cache.append(rng.standard_normal((1, 2, 6, d)).astype(np.float32),
                 rng.standard_normal((1, 2, 6, d)).astype(np.float32))
    return cache


@pytest.mark.parametrize("kernel", ["auto", "reference"])
@pytest.mark.parametrize("shift", [1, 8, 32, -8, -32])
def test_out_partially_overlapping_q_is_computed_through_a_temporary(shift: int, kernel: str) -> None:
    """``out`` a view ``shift`` floats into q's buffer (either direction): the
    result equals the non-overlapping one (without the temporary, positive
    shifts gave errors near 1.0)."""
    cache = _cache_for_attention()
    shape = (1, 4, 2, 8)
    n = int(np.prod(shape))
    rng = np.random.default_rng(7)
    buf = np.zeros(n + abs(shift), np.float32)
    qoff, ooff = (0, shift) if shift > 0 else (-shift, 0)
    q = buf[qoff:qoff + n].reshape(shape)
    q[...] = rng.standard_normal(shape).astype(np.float32)
    want = olkv.attention(q.copy(), cache, kernel="reference")
    out = buf[ooff:ooff + n].reshape(shape)
    assert np.shares_memory(out, q) and out.ctypes.data != q.ctypes.data
    got = olkv.attention(q, cache, out=out, kernel=kernel)
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_out_is_q_computes_in_place() -> None:
    cache = _cache_for_attention()
    q = np.random.default_rng(3).standard_normal((1, 4, 2, 8)).astype(np.float32)
    for kernel in ("auto", "reference"):
        want = olkv.attention(q.copy(), cache, kernel="reference")
        qq = q.copy()
        got = olkv.attention(qq, cache, out=qq, kernel=kernel)
        assert got is qq
        np.testing.assert_allclose(qq, want, rtol=1e-5, atol=1e-5)


def test_out_disjoint_views_of_one_buffer_need_no_temporary() -> None:
    cache = _cache_for_attention()
    buf = np.random.default_rng(4).standard_normal(2 * 64).astype(np.float32)
    q, out = buf[:64].reshape(1, 4, 2, 8), buf[64:].reshape(1, 4, 2, 8)
    want = olkv.attention(q.copy(), cache, kernel="reference")
    assert olkv.attention(q, cache, out=out, kernel="reference") is out
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
