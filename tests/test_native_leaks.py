"""C-heap growth of the hot bindings: zero per call.

gopy v0.5.0's wrapper of a Go function whose only result is an ``error`` returned a fresh C
string that nothing freed (32 bytes per successful call, more per failing one);
scripts/build_native.py builds gopy with a patch so that it returns NULL on success and the
C caller frees the error string. These tests read glibc's ``mallinfo2().uordblks`` (bytes in
use on the C heap; Go's heap and pymalloc's arenas are not in it) around ``N`` calls of each
hot binding, after a warm-up, at the half and at the end. The allowance ``SLACK`` (16 KiB)
absorbs allocator noise (free lists, a numpy cache); a leak of even one byte per call over
100k calls is 100 KiB, six times more. The positive control shows that the probe sees a
32-byte-per-call leak.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable, Tuple

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv import _lib
from onnx_light_kv import models as M

N = 100_000
SLACK = 16 << 10


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        lib = ctypes.CDLL(name)
        lib.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        pytest.skip("glibc mallinfo2 is not available (glibc >= 2.33 needed)")
    return lib


def _growth(fn: Callable[[], None], n: int = N) -> Tuple[int, int]:
    """C-heap bytes in use after n/2 and after n calls of fn, relative to a warmed-up start."""
    libc = _libc()
    for _ in range(n // 20):
        fn()
    start = libc.mallinfo2().uordblks
    for _ in range(n // 2):
        fn()
    mid = libc.mallinfo2().uordblks
    for _ in range(n - n // 2):
        fn()
    end = libc.mallinfo2().uordblks
    return mid - start, end - start


def _assert_flat(name: str, fn: Callable[[], None], n: int = N) -> None:
    half, full = _growth(fn, n)
    print(f"{name}: C heap +{half} B after {n // 2} calls, +{full} B after {n}")
    assert full <= SLACK and half <= SLACK, f"{name}: the C heap grew {full} B over {n} calls ({full / n:.2f} B/call)"


def test_probe_sees_a_leak() -> None:
    """Positive control: 32 bytes malloc'ed per call and never freed show up as 32 B/call."""
    libc = _libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    kept = []
    half, full = _growth(lambda: kept.append(libc.malloc(32)), 20_000)
    assert full >= 20_000 * 32 * 0.9 and full > 1.8 * half, (half, full)
    libc.free.argtypes = [ctypes.c_void_p]
    for p in kept:
        libc.free(p)


@pytest.fixture(scope="module")
def cache() -> olkv.KVCache:
    return olkv.KVCache(batch=1, kv_heads=2, head_dim=16, capacity=8)


def test_cache_append_reset(cache: olkv.KVCache) -> None:
    k = np.ones((1, 2, 1, 16), np.float32)

    def step() -> None:
        cache.append(k, k)
        cache.reset()

    _assert_flat("append+reset", step)


def test_attention(cache: olkv.KVCache) -> None:
    cache.reset()
    k = np.ones((1, 2, 4, 16), np.float32)
    cache.append(k, k)
    q = np.ones((1, 4, 1, 16), np.float32)
    out = np.empty_like(q)
    _assert_flat("attention", lambda: olkv.attention(q, cache, out=out))


def test_set_threads() -> None:
    n = olkv.get_threads()
    try:
        _assert_flat("set_threads", lambda: olkv.set_threads(1))
    finally:
        olkv.set_threads(n)


def test_checkpoint_rollback_truncate(cache: olkv.KVCache) -> None:
    cache.reset()
    k = np.ones((1, 2, 2, 16), np.float32)
    cache.append(k, k)

    def step() -> None:
        ck = cache.checkpoint()
        cache.rollback(ck)
        cache.truncate(2)

    _assert_flat("checkpoint+rollback+truncate", step, N // 2)


def test_failing_calls() -> None:
    """The error path: a Go error whose message must be freed after it became the exception."""
    reset = _lib.fn("CacheReset")

    def step() -> None:
        try:
            reset(-1)  # no such handle: an error from Go
        except RuntimeError:
            pass
        else:
            raise AssertionError("CacheReset(-1) succeeded")

    _assert_flat("failing CacheReset", step)


def test_state_run_step() -> None:
    """One decode step of a one-layer decoder on a GenerationState (then reset), 20k times:
    every binding of a step (run with state, reset, the output hand-off)."""
    cfg = M.DecoderConfig(layers=1, hidden=32, q_heads=2, kv_heads=1, head_dim=16, vocab=32, max_positions=16)
    model = M.llama_decoder(cfg)
    sess = olkv.InferenceSession(M.model_bytes(model), threads=1)
    names = {i.name for i in sess.get_inputs()}
    feeds = {"input_ids": np.array([[3]], np.int64)}
    if "position_ids" in names:
        feeds["position_ids"] = np.array([[0]], np.int64)
    with sess.create_state(max_length=4) as st:
        def step() -> None:
            sess.run(["logits"], feeds, state=st)
            st.reset()

        _assert_flat("state run step", step, 20_000)
