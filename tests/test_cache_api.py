"""KVCache Python API against a numpy model of the cache.

The model keeps, per sequence, the list of K and V rows (already rounded to
the cache dtype) plus the sliding-window start; every operation is applied to
both and ``export`` must equal the model exactly after each step.
"""

from __future__ import annotations

import gc

import threading

import numpy as np
import pytest

import onnx_light_kv as olkv
from _races import fast_thread_switches, race_pair, race_readers  # noqa: F401 - a fixture

DTYPES = ["float32", "float16", "bfloat16"]


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to the storage dtype, back in float32 (what the cache holds)."""
    return x.astype(olkv._dtypes.cache_dtype(dtype)).astype(np.float32)


class Model:
    """numpy model of a KVCache."""

    def __init__(self, batch: int, heads: int, dk: int, dv: int, cap: int, dtype: str) -> None:
        self.B, self.H, self.dk, self.dv, self.cap, self.dtype = batch, heads, dk, dv, cap, dtype
        self.k = [np.zeros((heads, 0, dk), np.float32) for _ in range(batch)]
        self.v = [np.zeros((heads, 0, dv), np.float32) for _ in range(batch)]
        self.win = [0] * batch

    def lengths(self) -> list[int]:
        return [k.shape[1] for k in self.k]

    def copy(self) -> "Model":
        m = Model(self.B, self.H, self.dk, self.dv, self.cap, self.dtype)
        m.k = [x.copy() for x in self.k]
        m.v = [x.copy() for x in self.v]
        m.win = list(self.win)
        return m

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        for b in range(self.B):
            self.k[b] = np.concatenate([self.k[b], rounded(k[b], self.dtype)], axis=1)
            self.v[b] = np.concatenate([self.v[b], rounded(v[b], self.dtype)], axis=1)

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        L = max(self.lengths())
        K = np.zeros((self.B, self.H, L, self.dk), np.float32)
        V = np.zeros((self.B, self.H, L, self.dv), np.float32)
        for b in range(self.B):
            n, w = self.k[b].shape[1], self.win[b]
            K[b, :, w:n] = self.k[b][:, w:]
            V[b, :, w:n] = self.v[b][:, w:]
        return K, V


def check(cache: olkv.KVCache, m: Model) -> None:
    assert cache.lengths.tolist() == m.lengths()
    k, v = cache.export(dtype="float32")
    K, V = m.export()
    np.testing.assert_array_equal(k, K)
    np.testing.assert_array_equal(v, V)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_operations_match_numpy_model(seed: int, dtype: str) -> None:
    rng = np.random.default_rng(seed)
    B, H = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    dk = int(rng.integers(1, 9))
    dv = dk if seed % 2 else int(rng.integers(1, 9))
    cap = int(rng.integers(4, 24))
    drive_random_ops([olkv.KVCache(B, H, dk, head_dim_v=dv, dtype=dtype, capacity=cap)],
                     Model(B, H, dk, dv, cap, dtype), rng, 40, 2)


def drive_random_ops(caches: list, m: Model, rng: np.random.Generator, steps: int, block: int) -> None:
    """Apply ``steps`` random operations (append, truncate, reorder with repeats, checkpoint and
    rollback, evict, select, fork) to every cache of ``caches`` (of one geometry, empty) and to the
    model ``m``, checking every cache against the model after each step; ``block`` sizes the
    appends (up to ``2 * block`` tokens) and windows (up to ``3 * block``). Closes the caches."""
    cks: list = []
    for _ in range(steps):
        op = int(rng.integers(0, 10))
        if op <= 2:
            n = int(rng.integers(0, 2 * block))
            k = rng.standard_normal((m.B, m.H, n, m.dk)).astype(np.float32)
            v = rng.standard_normal((m.B, m.H, n, m.dv)).astype(np.float32)
            for c in caches:
                if max(m.lengths()) + n > m.cap:
                    with pytest.raises(olkv.CapacityError):
                        c.append(k, v)
                else:
                    c.append(k, v)
            if max(m.lengths()) + n <= m.cap:
                m.append(k, v)
        elif op == 3:
            lo, hi = max(m.win), min(m.lengths())
            if hi >= lo:
                n = int(rng.integers(lo, hi + 1))
                for c in caches:
                    c.truncate(n)
                m.k = [x[:, :n] for x in m.k]
                m.v = [x[:, :n] for x in m.v]
        elif op == 4:
            idx = rng.integers(0, m.B, size=m.B)
            for c in caches:
                c.reorder(idx)
            old = m.copy()
            m.k = [old.k[i].copy() for i in idx]
            m.v = [old.v[i].copy() for i in idx]
            m.win = [old.win[i] for i in idx]
            cks = []
        elif op == 5:
            cks.append(([c.checkpoint() for c in caches], m.copy()))
        elif op == 6 and cks:
            pair, snap = cks[int(rng.integers(0, len(cks)))]
            ok = []
            for c, ck in zip(caches, pair):
                try:
                    c.rollback(ck)
                    ok.append(True)
                except olkv.StaleCheckpointError:
                    ok.append(False)
            assert len(set(ok)) == 1, ok
            if ok[0]:
                m = snap.copy()
        elif op == 7:
            keep = int(rng.integers(0, 3 * block))
            for c in caches:
                c.evict(keep)
            m.win = [max(w, n - keep) for w, n in zip(m.win, m.lengths())]
        elif op == 8:
            idx = rng.permutation(m.B)[:int(rng.integers(1, m.B + 1))]
            for c in caches:
                c.select(idx)
                assert c.batch == idx.size
            old = m.copy()
            m.B = idx.size
            m.k = [old.k[i] for i in idx]
            m.v = [old.v[i] for i in idx]
            m.win = [old.win[i] for i in idx]
            cks = []
        elif op == 9:
            for c in caches:
                f = c.fork()
                check(f, m)
                f.close()
        for c in caches:
            check(c, m)
    for c in caches:
        c.close()




def ref_attention(q, K, V, lengths, win_starts=None, scale=None, softcap=0.0, window=None):
    """numpy attention with causal alignment to the end of each sequence."""
    B, Hq, Lq, D = q.shape
    Hkv = K.shape[1]
    g = Hq // Hkv
    scale = 1 / np.sqrt(D) if scale is None else scale
    out = np.zeros((B, Hq, Lq, V.shape[-1]), np.float64)
    for b in range(B):
        L = lengths[b]
        for h in range(Hq):
            for i in range(Lq):
                p = L - Lq + i
                lo = 0 if win_starts is None else win_starts[b]
                if window:
                    lo = max(lo, p - window + 1)
                s = K[b, h // g, lo:p + 1].astype(np.float64) @ q[b, h, i].astype(np.float64) * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ V[b, h // g, lo:p + 1]
    return out.astype(np.float32)


TOL = {"float32": 2e-5, "float16": 2e-5, "bfloat16": 2e-5}  # vs model of the rounded cache


@pytest.mark.parametrize("kernel", ["auto", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])  # MHA, GQA, MQA
@pytest.mark.parametrize("dk,dv", [(16, 16), (8, 12)])
def test_attention_matches_numpy(kernel, dtype, hq, hkv, dk, dv) -> None:
    rng = np.random.default_rng(hq * 7 + dk)
    B, cap = 2, 64
    cache = olkv.KVCache(B, hkv, dk, head_dim_v=dv, dtype=dtype, capacity=cap)
    k = rng.standard_normal((B, hkv, 20, dk)).astype(np.float32)
    v = rng.standard_normal((B, hkv, 20, dv)).astype(np.float32)
    cache.append(k, v, counts=[20, 13])
    K, V = cache.export(dtype="float32")
    for lq in (1, 3, 13):  # 13: every query of the shorter sequence (a prompt)
        q = rng.standard_normal((B, hq, lq, dk)).astype(np.float32)
        for kw in ({}, {"scale": 0.3}, {"softcap": 2.0}, {"window": 5}):
            got = olkv.attention(q, cache, kernel=kernel, **kw)
            want = ref_attention(q, K, V, [20, 13], **kw)
            np.testing.assert_allclose(got, want, atol=TOL[dtype], rtol=1e-4)


@pytest.mark.parametrize("kernel", ["auto", "reference"])
@pytest.mark.parametrize("lq", [16, 17, 40, 64])
def test_attention_takes_long_queries(kernel, lq) -> None:
    """Beyond 16 query tokens (a prompt) the kernel runs on tiles of query rows: the result is
    the causal attention of every row, windows and softcap included."""
    rng = np.random.default_rng(lq)
    B, hq, hkv, d = 2, 4, 2, 16
    cache = olkv.KVCache(B, hkv, d, dtype="float16", capacity=96)
    k = rng.standard_normal((B, hkv, 80, d)).astype(np.float32)
    cache.append(k, -k, counts=[80, 70])
    K, V = cache.export(dtype="float32")
    q = rng.standard_normal((B, hq, lq, d)).astype(np.float32)
    for kw in ({}, {"window": 7, "softcap": 3.0}):
        want = ref_attention(q, K, V, [80, 70], **kw)
        got = olkv.attention(q, cache, kernel=kernel, **kw)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
        inplace = q.copy()  # out=q: every tile reads its query rows before its output replaces them
        assert olkv.attention(inplace, cache, kernel=kernel, out=inplace, **kw) is inplace
        np.testing.assert_array_equal(inplace, got)


def test_attention_respects_evicted_window() -> None:
    rng = np.random.default_rng(1)
    cache = olkv.KVCache(1, 2, 8, capacity=32)
    cache.append(rng.standard_normal((1, 2, 12, 8)), rng.standard_normal((1, 2, 12, 8)))
    K, V = cache.export()
    cache.evict(5)
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    np.testing.assert_allclose(olkv.attention(q, cache), ref_attention(q, K, V, [12], win_starts=[7]), atol=2e-5)


def test_attention_reads_cache_in_place() -> None:
    cache = olkv.KVCache(1, 2, 8, capacity=100)
    cache.append(np.ones((1, 2, 50, 8), np.float32), np.ones((1, 2, 50, 8), np.float32))
    cache.reset_counters()
    olkv.attention(np.ones((1, 4, 1, 8), np.float32), cache)
    c = cache.counters
    assert c["export_bytes"] == 0 and c["copy_bytes"] == 0
    assert c["attention_bytes"] == 50 * 2 * 2 * 8 * 4  # every K/V byte once, GQA heads share reads


@pytest.mark.parametrize("dtype", DTYPES)
def test_append_cost_proportional_to_new_tokens(dtype: str) -> None:
    B, H, D = 2, 4, 32
    cache = olkv.KVCache(B, H, D, dtype=dtype, capacity=600)
    cache.append(np.zeros((B, H, 500, D), np.float32), np.zeros((B, H, 500, D), np.float32))
    cache.reset_counters()
    one = B * H * 2 * D * np.dtype(olkv._dtypes.cache_dtype(dtype)).itemsize
    for n in range(1, 51):
        cache.append(np.ones((B, H, 1, D), np.float32), np.ones((B, H, 1, D), np.float32))
        assert cache.counters["append_bytes"] == n * one  # independent of the 500+ tokens already there


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_caches_round_like_numpy(dtype: str) -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 1, 64, 16)) * 1e3).astype(np.float32)
    x.flat[:4] = [np.nan, np.inf, -np.inf, 1e-8]
    cache = olkv.KVCache(1, 1, 16, dtype=dtype, capacity=64)
    cache.append(x, x)
    k, _ = cache.export()
    want = x.astype(olkv._dtypes.cache_dtype(dtype))
    np.testing.assert_array_equal(k.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
    assert np.isnan(k.astype(np.float32).flat[0])


def test_native_half_input_is_copied_bit_exact() -> None:
    x = np.random.default_rng(2).standard_normal((1, 2, 3, 4)).astype(np.float16)
    cache = olkv.KVCache(1, 2, 4, dtype="float16", capacity=8)
    cache.append(x, x)
    np.testing.assert_array_equal(cache.export()[0], x)
    bf = x.astype(olkv.bfloat16)
    cache2 = olkv.KVCache(1, 2, 4, dtype="bfloat16", capacity=8)
    cache2.append(bf, bf)
    assert cache2.export()[0].dtype == olkv.bfloat16
    np.testing.assert_array_equal(cache2.export()[0].view(np.uint16), bf.view(np.uint16))


def test_fork_is_independent_and_counted() -> None:
    cache = olkv.KVCache(2, 1, 4, capacity=10)
    cache.append(np.ones((2, 1, 3, 4)), np.ones((2, 1, 3, 4)))
    f = cache.fork()
    f.append(np.zeros((2, 1, 1, 4)), np.zeros((2, 1, 1, 4)))
    assert cache.lengths.tolist() == [3, 3] and f.lengths.tolist() == [4, 4]
    cache.truncate(1)
    np.testing.assert_array_equal(f.export()[0][:, :, :3], np.ones((2, 1, 3, 4)))
    assert cache.counters["copy_bytes"] == 2 * 3 * 2 * 4 * 4


def test_reorder_permutation_copies_nothing() -> None:
    cache = olkv.KVCache(3, 1, 4, capacity=10)
    data = np.arange(3 * 5 * 4, dtype=np.float32).reshape(3, 1, 5, 4)
    cache.append(data, -data)
    cache.reorder([2, 0, 1])
    assert cache.counters["copy_bytes"] == 0
    np.testing.assert_array_equal(cache.export()[0], data[[2, 0, 1]])
    cache.reorder([1, 1, 1])
    np.testing.assert_array_equal(cache.export()[1], -data[[0, 0, 0]])
    assert cache.counters["copy_bytes"] == 2 * 5 * 2 * 4 * 4


def test_speculative_checkpoint_truncate_rollback() -> None:
    cache = olkv.KVCache(1, 1, 4, capacity=16)
    cache.append(np.ones((1, 1, 4, 4)), np.ones((1, 1, 4, 4)))
    ck = cache.checkpoint()
    cache.append(np.full((1, 1, 3, 4), 2.0), np.full((1, 1, 3, 4), 2.0))  # draft
    cache.rollback(ck)
    assert cache.lengths.tolist() == [4]
    cache.append(np.full((1, 1, 2, 4), 3.0), np.full((1, 1, 2, 4), 3.0))
    ck2 = cache.checkpoint()
    cache.truncate(5)  # accept one draft token
    cache.rollback(ck2)  # truncated rows come back: nothing overwrote them
    assert cache.lengths.tolist() == [6]
    cache.truncate(5)
    cache.append(np.zeros((1, 1, 1, 4)), np.zeros((1, 1, 1, 4)))  # overwrites position 5
    with pytest.raises(olkv.StaleCheckpointError):
        cache.rollback(ck2)
    ck2.release()
    with pytest.raises(olkv.StaleCheckpointError):
        cache.rollback(ck2)
    other = olkv.KVCache(1, 1, 4, capacity=4)
    with pytest.raises(ValueError):
        other.rollback(ck)


BAD_APPENDS = [
    ("wrong dtype int", lambda: (np.ones((1, 2, 1, 4), np.int32), np.ones((1, 2, 1, 4), np.int32)), TypeError),
    ("complex", lambda: (np.ones((1, 2, 1, 4), np.complex64), np.ones((1, 2, 1, 4), np.complex64)), TypeError),
    ("mixed dtypes", lambda: (np.ones((1, 2, 1, 4), np.float32), np.ones((1, 2, 1, 4), np.float16)), TypeError),
    ("rank 3", lambda: (np.ones((2, 1, 4), np.float32), np.ones((2, 1, 4), np.float32)), ValueError),
    ("wrong heads", lambda: (np.ones((1, 3, 1, 4), np.float32), np.ones((1, 3, 1, 4), np.float32)), ValueError),
    ("wrong head_dim", lambda: (np.ones((1, 2, 1, 5), np.float32), np.ones((1, 2, 1, 5), np.float32)), ValueError),
    ("k/v token mismatch", lambda: (np.ones((1, 2, 1, 4), np.float32), np.ones((1, 2, 2, 4), np.float32)), ValueError),
    ("past capacity", lambda: (np.ones((1, 2, 7, 4), np.float32), np.ones((1, 2, 7, 4), np.float32)), olkv.CapacityError),
]


@pytest.mark.parametrize("name,make,exc", BAD_APPENDS, ids=[b[0] for b in BAD_APPENDS])
def test_bad_appends_raise_and_leave_cache_intact(name, make, exc) -> None:
    cache = olkv.KVCache(1, 2, 4, capacity=8)
    cache.append(np.full((1, 2, 2, 4), 0.5, np.float32), np.full((1, 2, 2, 4), 0.25, np.float32))
    before = cache.export()
    k, v = make()
    with pytest.raises(exc):
        cache.append(k, v)
    after = cache.export()
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert cache.counters["append_calls"] == 1


def test_nan_and_noncontiguous_inputs_are_accepted() -> None:
    cache = olkv.KVCache(1, 2, 4, capacity=8)
    k = np.full((1, 2, 4, 2), np.nan, np.float32).transpose(0, 1, 3, 2)  # non-contiguous [1,2,2,4]
    v = np.arange(16, dtype=np.float64).reshape(1, 2, 2, 4)  # float64 is converted
    cache.append(k, v)
    K, V = cache.export()
    assert np.isnan(K).all()
    np.testing.assert_array_equal(V, v.astype(np.float32))


@pytest.mark.parametrize(
    "call,exc",
    [
        (lambda c: c.truncate(-1), ValueError),
        (lambda c: c.truncate(4), ValueError),
        (lambda c: c.truncate([1, 2, 3]), ValueError),
        (lambda c: c.truncate(1.5), TypeError),
        (lambda c: c.reorder([0, 2]), IndexError),
        (lambda c: c.reorder([-1, 0]), IndexError),
        (lambda c: c.reorder([0]), ValueError),
        (lambda c: c.evict(-1), ValueError),
        (lambda c: c.append(np.ones((2, 1, 1, 4)), np.ones((2, 1, 1, 4)), counts=[2, 0]), ValueError),
        (lambda c: c.append(np.ones((2, 1, 1, 4)), np.ones((2, 1, 1, 4)), counts=[-1, 0]), ValueError),
        (lambda c: olkv.attention(np.ones((2, 3, 1, 4), np.float32), c), ValueError),  # 3 % 2 kv heads
        (lambda c: olkv.attention(np.ones((2, 2, 4, 4), np.float32), c), ValueError),  # q_len > length
        (lambda c: olkv.attention(np.ones((2, 2, 1, 5), np.float32), c), ValueError),  # head_dim
        (lambda c: olkv.attention(np.ones((1, 2, 1, 4), np.float32), c), ValueError),  # batch
        (lambda c: olkv.attention(np.ones((2, 2, 4), np.float32), c), ValueError),  # rank
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.int64), c), TypeError),
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.float32), c, window=0), ValueError),
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.float32), c, scale=0.0), ValueError),  # not the default
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.float32), c, scale=1e-46), ValueError),  # 0 in float32
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.float32), c, scale=-0.5), ValueError),
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.float32), c, kernel="fast"), ValueError),
        (lambda c: olkv.attention(np.ones((2, 2, 1, 4), np.float32), c, out=np.empty((2, 2, 1, 3), np.float32)), ValueError),
    ],
)
def test_bad_arguments(call, exc) -> None:
    cache = olkv.KVCache(2, 2, 4, capacity=8)
    cache.append(np.ones((2, 2, 3, 4)), np.ones((2, 2, 3, 4)))
    before = cache.export()
    with pytest.raises(exc):
        call(cache)
    after = cache.export()
    np.testing.assert_array_equal(before[0], after[0])
    assert cache.lengths.tolist() == [3, 3]


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        olkv.KVCache(0, 1, 4, capacity=4)
    with pytest.raises(ValueError):
        olkv.KVCache(1, 1, 4, capacity=-3)
    with pytest.raises(TypeError):
        olkv.KVCache(1, 1, 4, capacity=4, dtype="int8")
    with pytest.raises(TypeError):
        olkv.KVCache(1, 1, 4.0, capacity=4)  # type: ignore[arg-type]


def test_budget_error_is_memory_error_with_numbers_and_changes_nothing() -> None:
    arena = olkv.Arena(budget=100_000)
    a = olkv.KVCache(1, 2, 64, capacity=64, arena=arena)  # 65,536 bytes
    with pytest.raises(MemoryError) as ei:
        olkv.KVCache(1, 2, 64, capacity=64, arena=arena)
    assert isinstance(ei.value, olkv.BudgetError)
    assert "65536" in str(ei.value) and "100000" in str(ei.value)
    with pytest.raises(olkv.BudgetError):
        a.fork()
    st = arena.stats()
    assert st["allocated_bytes"] == 65536
    a.append(np.ones((1, 2, 3, 64)), np.ones((1, 2, 3, 64)))
    assert arena.stats()["live_bytes"] == 3 * 2 * 64 * 4 * 2
    a.close()
    assert arena.stats()["allocated_bytes"] == 0
    b = olkv.KVCache(1, 2, 64, capacity=64, arena=arena)  # fits again
    assert b.lengths.tolist() == [0]


def test_cache_larger_than_the_machine_raises_budget_error() -> None:
    """Without a budget, a cache the machine cannot hold is refused with BudgetError (a
    MemoryError) before anything is touched, instead of the process running out of memory;
    the default arena keeps working."""
    arena = olkv.Arena()
    with pytest.raises(olkv.BudgetError) as ei:
        olkv.KVCache(1, 8, 128, dtype="float32", capacity=10**8, arena=arena)  # 819 GB
    assert isinstance(ei.value, MemoryError) and "available" in str(ei.value)
    assert arena.stats()["allocated_bytes"] == 0
    c = olkv.KVCache(1, 8, 128, capacity=16, arena=arena)
    assert c.lengths.tolist() == [0]
    c.close()


@pytest.mark.parametrize("kw", [dict(batch=10**9), dict(kv_heads=10**6), dict(head_dim=10**7)])
def test_absurd_geometry_raises_value_error(kw: dict) -> None:
    """Geometries no model has are refused before anything is allocated (a billion sequences
    of a tiny cache used to exhaust the memory on per-sequence state alone)."""
    args = dict(batch=1, kv_heads=1, head_dim=8, capacity=4)
    args.update(kw)
    with pytest.raises(ValueError):
        olkv.KVCache(**args)


def test_closed_cache_raises_value_error() -> None:
    c = olkv.KVCache(1, 1, 4, capacity=4)
    c.close()
    c.close()  # idempotent
    assert c.closed and repr(c) == "KVCache(closed)"
    with pytest.raises(ValueError, match="the cache is closed"):
        c.append(np.ones((1, 1, 1, 4)), np.ones((1, 1, 1, 4)))
    with pytest.raises(ValueError, match="the cache is closed"):
        c.info()
    with pytest.raises(ValueError, match="the cache is closed"):
        olkv.attention(np.ones((1, 1, 1, 4), np.float32), c)


def test_garbage_collected_caches_release_handles() -> None:
    from onnx_light_kv import _lib

    gc.collect()
    before = _lib.fn("LiveCaches")()
    for _ in range(50):
        c = olkv.KVCache(1, 1, 4, capacity=4)
        c.fork()
    del c
    gc.collect()
    assert _lib.fn("LiveCaches")() == before


def test_repr_info_and_html() -> None:
    c = olkv.KVCache(2, 2, 8, head_dim_v=4, dtype="bfloat16", capacity=16)
    c.append(np.ones((2, 2, 3, 8)), np.ones((2, 2, 3, 4)))
    r = repr(c)
    assert "bfloat16" in r and "lengths=[3, 3]" in r and "head_dim_v=4" in r
    i = c.info()
    assert i["layout"] == "contiguous" and i["committed_bytes"] == 2 * 2 * 16 * (8 + 4) * 2
    assert i["live_bytes"] == 2 * 2 * 3 * (8 + 4) * 2
    h = c._repr_html_()
    assert "<table" in h and "1.5 KiB" in h and "geometry" in h and "counters" in h  # committed: 1536 B


def test_gopy_gc_hook_removed() -> None:
    assert not [cb for cb in gc.callbacks if getattr(cb, "__name__", "").startswith("_gopy")]


# -- select under concurrency -------------------------------------------------


def _labelled_cache(batch: int, length: int = 8, layout: str = "contiguous") -> olkv.KVCache:
    """A cache whose sequence b holds only the value b + 1 (K) and -(b + 1) (V)."""
    c = olkv.KVCache(batch, 1, 4, capacity=16, layout=layout)
    ids = np.arange(1, batch + 1, dtype=np.float32).reshape(batch, 1, 1, 1)
    k = np.broadcast_to(ids, (batch, 1, length, 4))
    c.append(k, -k)
    return c


def _state_of(k: np.ndarray, v: np.ndarray, states: list) -> bool:
    """Whether an export (k, v) of a :func:`_labelled_cache` is exactly one of
    ``states`` (lists of the kept sequences' labels)."""
    for ids in states:
        want = np.broadcast_to(np.asarray(ids, np.float32).reshape(-1, 1, 1, 1), (len(ids),) + k.shape[1:])
        if k.shape[0] == len(ids) and np.array_equal(k, want) and np.array_equal(v, -want):
            return True
    return False


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_select_is_atomic_for_export_lengths_checkpoint_and_fork(layout: str, fast_thread_switches) -> None:
    """Threads exporting, reading lengths, checkpointing and forking while another
    selects always see the batch before or after a select, never a mix (export used to
    size its buffers from a stale batch and return uninitialized rows)."""
    chain = [list(range(1, 17)), [2, 4, 6, 8, 10, 12, 14, 16], [4, 8, 12, 16], [16, 4], [4]]
    picks = [[1, 3, 5, 7, 9, 11, 13, 15], [1, 3, 5, 7], [3, 0], [1]]  # indices into the previous state
    sizes = {len(s) for s in chain}
    for _ in range(25):
        c = _labelled_cache(16, layout=layout)

        def check() -> list:
            problems: list = []
            k, v = c.export()
            if not _state_of(k, v, chain):
                problems.append(("export", k.shape))
            n = len(c.lengths)
            ck = c.checkpoint()
            f = c.fork()
            fk, fv = f.export()
            f.close()
            if n not in sizes or len(ck.lengths) not in sizes:
                problems.append(("lengths", n, len(ck.lengths)))
            if not _state_of(fk, fv, chain):
                problems.append(("fork", fk.shape))
            return problems

        problems = race_readers(check, lambda: [c.select(p) for p in picks])
        assert not problems, problems[:5]
        assert c.batch == c.info()["batch"] == 1 and _state_of(*c.export(), [[4]])
        c.close()


def test_concurrent_selects_keep_python_and_go_batch_equal(fast_thread_switches) -> None:
    """Of two racing selects, the one that runs second either fails (its indices no
    longer fit) or wins; the wrapper's batch always ends equal to the Go cache's (it
    used to keep the size of whichever select updated it last)."""
    for _ in range(300):
        c = _labelled_cache(4)
        race_pair(lambda: c.select([0, 1, 2]), lambda: c.select([0]))
        assert c.batch == c.info()["batch"] == len(c.lengths) == 1  # [0, 1, 2] then [0], or [0] alone
        assert _state_of(*c.export(), [[1]]), c.export()[0][:, 0, 0, 0]
        c.close()


def test_stale_batch_on_unlocked_paths_raises_and_changes_nothing() -> None:
    """append, attention, truncate and reorder take no Python lock: while a select from
    another thread is under way they may still see the old batch. The Go side checks
    every size, so such a call raises ValueError and leaves the cache as it was."""
    c = _labelled_cache(4)
    c.select([1, 3])
    before = c.export()
    c._batch = 4  # what a thread sees between select's Go call and its update of the batch
    k = np.ones((4, 1, 1, 4), np.float32)
    calls = [lambda: c.append(k, k), lambda: c.append(k, k, counts=[1, 1, 1, 1]),
             lambda: olkv.attention(np.ones((4, 2, 1, 4), np.float32), c),
             lambda: olkv.attention(np.ones((4, 2, 1, 4), np.float32), c, kernel="reference"),
             lambda: c.truncate([1, 1, 1, 1]), lambda: c.reorder([0, 1, 1, 0])]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    c._batch = 2
    after = c.export()
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert c.counters["append_calls"] == 1 and c.lengths.tolist() == [8, 8]


def test_failed_checkpoint_leaves_no_native_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint() that raises after Go took the snapshot releases it (no Python
    object would own it: it would pin rows until 64 newer checkpoints push it out)."""
    c = _labelled_cache(2)

    def fail(*args: object) -> None:
        raise ValueError("simulated failure")

    monkeypatch.setattr(olkv.cache, "Checkpoint", fail)
    with pytest.raises(ValueError, match="simulated"):
        c.checkpoint()
    monkeypatch.undo()
    assert c.info()["checkpoints"] == 0
    ck = c.checkpoint()
    assert c.info()["checkpoints"] == 1 and ck.lengths.tolist() == [8, 8]


# -- pickling and copies --------------------------------------------------------


def test_cache_arena_and_checkpoint_refuse_pickling() -> None:
    """Handles are numbers valid in one process: pickling one would alias whatever
    has that number elsewhere."""
    import pickle

    arena = olkv.Arena()
    c = olkv.KVCache(1, 1, 4, capacity=8, arena=arena)
    ck = c.checkpoint()
    for obj, name in [(c, "KVCache"), (arena, "Arena"), (ck, "Checkpoint")]:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            with pytest.raises(TypeError, match=f"{name} cannot be pickled: it holds native memory"):
                pickle.dumps(obj, protocol=protocol)
    with pytest.raises(TypeError, match="export\\(\\) its contents"):
        pickle.dumps(c)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("how", ["copy", "deepcopy"])
def test_copy_and_deepcopy_of_a_cache_fork_it(layout: str, how: str) -> None:
    """copy.copy and copy.deepcopy return fork(): an independent cache in the same
    arena that outlives the original (they used to share its handle, or return a
    closed cache)."""
    import copy

    c = _labelled_cache(2, length=3, layout=layout)
    c.evict(2)
    k0, v0 = c.export()
    d = getattr(copy, how)(c)
    assert isinstance(d, olkv.KVCache) and d is not c and d._h != c._h
    assert d.arena is c.arena and d.layout == layout and d.batch == 2 and not d.closed
    d.append(np.zeros((2, 1, 1, 4)), np.zeros((2, 1, 1, 4)))
    c.select([1])
    np.testing.assert_array_equal(c.export()[0], k0[1:])
    del c
    gc.collect()
    k, v = d.export()
    np.testing.assert_array_equal(k[:, :, :3], k0)
    np.testing.assert_array_equal(v[:, :, :3], v0)
    assert d.lengths.tolist() == [4, 4]
    holder = copy.deepcopy({"a": d, "b": d})  # the memo keeps one copy per cache
    assert holder["a"] is holder["b"] and holder["a"] is not d
    d.close()
    with pytest.raises(ValueError, match="closed"):
        getattr(copy, how)(d)


def test_arena_cannot_be_copied_and_checkpoint_copies_are_itself() -> None:
    import copy

    arena = olkv.Arena(budget=1 << 20)
    for fn in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="Arena cannot be copied"):
            fn(arena)
    c = olkv.KVCache(1, 1, 4, capacity=8, arena=arena)
    c.append(np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)))
    ck = c.checkpoint()
    assert copy.copy(ck) is ck and copy.deepcopy(ck) is ck
    c.append(np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)))
    c.rollback(copy.copy(ck))
    assert c.lengths.tolist() == [2] and arena.budget == 1 << 20


# -- messages ---------------------------------------------------------------------


def test_dtype_none_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="dtype must be .*got None") as ei:
        olkv.KVCache(1, 1, 8, capacity=4, dtype=None)
    assert "float64" not in str(ei.value)


class _Sub(np.ndarray):
    pass


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("make,exc,match", [
    (lambda: np.empty((1, 2, 1, 8), np.float32).view(_Sub), TypeError, "not a subclass \\(got _Sub\\)"),
    (lambda: np.ma.masked_array(np.empty((1, 2, 1, 8), np.float32)), TypeError, "not a subclass \\(got MaskedArray\\)"),
    (lambda: [0.0] * 16, TypeError, "must be a numpy array, got list"),
    (lambda: np.empty((1, 2, 1, 8), np.float64), ValueError, "got dtype float64"),
    (lambda: np.empty((1, 2, 1, 7), np.float32), ValueError, "got shape \\(1, 2, 1, 7\\)"),
    (lambda: np.empty((1, 2, 1, 16), np.float32)[..., ::2], ValueError, "C-contiguous"),
    (lambda: np.broadcast_to(np.float32(0), (1, 2, 1, 8)), ValueError, "C-contiguous"),
    (lambda: _readonly(np.empty((1, 2, 1, 8), np.float32)), ValueError, "writeable"),
])
def test_attention_out_errors_name_the_reason(make, exc, match) -> None:
    c = olkv.KVCache(1, 1, 8, capacity=4)
    c.append(np.ones((1, 1, 1, 8)), np.ones((1, 1, 1, 8)))
    out = make()
    with pytest.raises(exc, match=match):
        olkv.attention(np.ones((1, 2, 1, 8), np.float32), c, out=out)
    if isinstance(out, np.ndarray) and type(out) is not np.ndarray:  # the advice works
        got = olkv.attention(np.ones((1, 2, 1, 8), np.float32), c, out=out.view(np.ndarray))
        np.testing.assert_allclose(np.asarray(out), got)


def test_arena_pool_stays_bounded_over_caches_of_changing_sizes() -> None:
    """Caches created and closed one at a time, each of another capacity: the arena keeps at most
    about twice the largest one pooled (it kept every size it saw: 2 GB after 40 caches of ~50 MB),
    and a cache of the size just freed still reuses its buffers."""
    arena = olkv.Arena()
    largest = total = 0
    for i in range(40):
        c = olkv.KVCache(1, 2, 64, capacity=1000 + 37 * i, arena=arena)
        size = c.info()["committed_bytes"]
        largest, total = max(largest, size), total + size
        c.close()
        st = arena.stats()
        assert st["allocated_bytes"] == 0 and st["pooled_bytes"] <= 2 * largest, st
    assert 4 * 2 * largest < total  # (the bound is far below what was freed)
    n = arena.stats()["allocations"]
    pooled = arena.stats()["pooled_bytes"]
    olkv.KVCache(1, 2, 64, capacity=1000 + 37 * 39, arena=arena).close()  # the size just freed
    st = arena.stats()
    assert st["pooled_bytes"] == pooled and st["peak_bytes"] == largest and st["allocations"] > n


def test_checkpoint_is_atomic_with_concurrent_reorder() -> None:
    """checkpoint() takes the snapshot and its lengths in one call: a reorder on another thread
    cannot invalidate it in between (about 1 in 1,000 calls raised ValueError 'not live')."""
    c = olkv.KVCache(2, 1, 8, capacity=64)
    c.append(np.ones((2, 1, 4, 8), np.float32), np.ones((2, 1, 4, 8), np.float32))
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            c.reorder([1, 0])

    t = threading.Thread(target=other)
    t.start()
    try:
        for _ in range(5000):
            ck = c.checkpoint()
            assert ck.lengths.tolist() == [4, 4]
    finally:
        stop.set()
        t.join()
