"""Quantized KVCache (``quant="int8"|"int4"``) against a numpy model of its storage.

The model holds, per sequence and KV head, the value a read of every position gives
(the value rounded to the cache dtype until the position is sealed, then its dequantized
value, computed here in numpy by the formulas of the format), the lengths, window starts,
the end of the sealed rows and the chunk starts. A truncate or rollback changes only the
lengths; the first append below the sealed end cuts it there; after every append, chunks
of ``quant_group`` tokens are sealed while ``residual + quant_group`` or more tokens are
native. ``export()`` must equal the model bit for bit after every operation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onnx_light_kv as olkv


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to the storage dtype, back in float32."""
    return x.astype(olkv._dtypes.cache_dtype(dtype)).astype(np.float32)


def dequantized(fmt: str, x: np.ndarray, axis: int) -> np.ndarray:
    """What sealed groups read back: x (float32) grouped along ``axis``.

    int8: scale = max|x| / 127, q = rint(x / scale) in [-127, 127], x' = scale * q.
    int4: zero = min x, scale = (max x - min x) / 15, q = rint((x - zero) / scale) in
    [0, 15], x' = scale * q + zero. Scale 0 gives q = 0. Every step is a float32 operation;
    a group with a NaN or an infinity reads back NaN.
    """
    x = np.asarray(x, np.float32)
    bad = ~np.isfinite(x).all(axis=axis, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if fmt == "int8":
            scale = (np.abs(x).max(axis=axis, keepdims=True) / np.float32(127)).astype(np.float32)
            scale = _fit_scale(scale, lambda s: s * np.float32(127))
            q = np.where(scale != 0, np.clip(np.rint(x / scale), -127, 127), 0).astype(np.float32)
            out = (scale * q).astype(np.float32)
        else:
            lo = x.min(axis=axis, keepdims=True)
            scale = ((x.max(axis=axis, keepdims=True) - lo) / np.float32(15)).astype(np.float32)
            scale = _fit_scale(scale, lambda s: np.maximum((s * np.float32(15)).astype(np.float32) + lo,
                                                           (s.astype(np.float64) * 15 + lo).astype(np.float32)))
            q = np.where(scale != 0, np.clip(np.rint((x - lo) / scale), 0, 15), 0).astype(np.float32)
            out = ((scale * q).astype(np.float32) + lo).astype(np.float32)
    return np.where(bad, np.float32(np.nan), out).astype(np.float32)


def _fit_scale(scale: np.ndarray, top: Any) -> np.ndarray:
    """The seal's rule for groups reaching float32's largest value: a finite scale whose
    ``top(scale)`` (the largest integer read back) is infinite steps down a float32 at a time."""
    scale = scale.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        while True:
            over = np.isfinite(scale) & (scale > 0) & np.isinf(top(scale))
            if not over.any():
                return scale
            scale[over] = np.nextafter(scale[over], np.float32(0))


def row_groups(fmt: str, rows: np.ndarray, group: int) -> np.ndarray:
    """Per-token quantization of rows [n, d]: groups of ``group`` elements (the whole row
    when ``group`` does not divide d)."""
    n, d = rows.shape
    g = group if d % group == 0 else d
    return dequantized(fmt, rows.reshape(n, d // g, g), axis=2).reshape(n, d)


class QModel:
    """numpy model of a quantized contiguous KVCache."""

    def __init__(self, B: int, H: int, dk: int, dv: int, cap: int, dtype: str, fmt: str, group: int,
                 k_axis: str, residual: int) -> None:
        self.H, self.dk, self.dv, self.cap, self.dtype = H, dk, dv, cap, dtype
        self.fmt, self.G, self.k_axis, self.res = fmt, group, k_axis, residual
        self.seals = 0
        self.resize(B)

    def resize(self, B: int) -> None:
        self.B = B
        self.k = [np.zeros((self.H, self.cap, self.dk), np.float32) for _ in range(B)]
        self.v = [np.zeros((self.H, self.cap, self.dv), np.float32) for _ in range(B)]
        self.lens, self.win, self.sealed = [0] * B, [0] * B, [0] * B
        self.chunks: list[list[int]] = [[] for _ in range(B)]
        self.cks: list[dict] = []

    def seq(self, b: int, cut: bool = False) -> dict:
        s = dict(k=self.k[b].copy(), v=self.v[b].copy(), len=self.lens[b], win=self.win[b],
                 sealed=self.sealed[b], chunks=list(self.chunks[b]))
        if cut and s["sealed"] > s["len"]:  # rows past the length are not copied
            s["sealed"] = s["len"]
            s["chunks"] = [c for c in s["chunks"] if c < s["len"]]
        return s

    def set_seq(self, b: int, s: dict) -> None:
        self.k[b], self.v[b] = s["k"], s["v"]
        self.lens[b], self.win[b], self.sealed[b], self.chunks[b] = s["len"], s["win"], s["sealed"], s["chunks"]

    def copy(self, cut: bool = False) -> "QModel":
        m = QModel(self.B, self.H, self.dk, self.dv, self.cap, self.dtype, self.fmt, self.G, self.k_axis, self.res)
        m.seals = self.seals
        for b in range(self.B):
            m.set_seq(b, self.seq(b, cut))
        return m

    def append(self, k: np.ndarray, v: np.ndarray, counts=None) -> None:
        n = k.shape[2]
        for b in range(self.B):
            cnt = n if counts is None else counts[b]
            if cnt == 0:
                continue
            pos = self.lens[b]
            for ck in self.cks:
                ck["floor"][b] = min(ck["floor"][b], pos)
            if pos < self.sealed[b]:
                self.sealed[b] = pos
                self.chunks[b] = [c for c in self.chunks[b] if c < pos]
            self.k[b][:, pos:pos + cnt] = rounded(k[b, :, :cnt], self.dtype)
            self.v[b][:, pos:pos + cnt] = rounded(v[b, :, :cnt], self.dtype)
            self.lens[b] = pos + cnt
            while self.lens[b] - self.sealed[b] >= self.res + self.G:
                self.seal(b)

    def seal(self, b: int) -> None:
        s0, G = self.sealed[b], self.G
        for h in range(self.H):
            kc = self.k[b][h, s0:s0 + G]
            if self.k_axis == "channel":
                self.k[b][h, s0:s0 + G] = dequantized(self.fmt, kc, axis=0)
            else:
                self.k[b][h, s0:s0 + G] = row_groups(self.fmt, kc, G)
            self.v[b][h, s0:s0 + G] = row_groups(self.fmt, self.v[b][h, s0:s0 + G], G)
        self.chunks[b].append(s0)
        self.sealed[b] = s0 + G
        self.seals += 1

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        L = max(self.lens)
        K = np.zeros((self.B, self.H, L, self.dk), np.float32)
        V = np.zeros((self.B, self.H, L, self.dv), np.float32)
        for b in range(self.B):
            w, n = self.win[b], self.lens[b]
            K[b, :, w:n] = self.k[b][:, w:n]
            V[b, :, w:n] = self.v[b][:, w:n]
        return K, V

    def tokens(self) -> tuple[int, int]:
        sealed = native = 0
        for b in range(self.B):
            se = min(self.sealed[b], self.lens[b])
            sealed += max(0, se - self.win[b])
            native += self.lens[b] - max(se, self.win[b])
        return sealed, native


def check(cache: olkv.KVCache, m: QModel, where: str) -> None:
    assert cache.lengths.tolist() == m.lens, where
    k, v = cache.export("float32")
    wk, wv = m.export()
    np.testing.assert_array_equal(k, wk, err_msg=f"{where}: K")  # NaN == NaN here
    np.testing.assert_array_equal(v, wv, err_msg=f"{where}: V")
    q = cache.info()["quant"]
    assert (q["sealed_tokens"], q["native_tokens"]) == m.tokens(), where


def kv(rng: np.random.Generator, B: int, H: int, n: int, dk: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian K with a few outlier channels (as real keys have), V with varied scales."""
    k = rng.standard_normal((B, H, n, dk), dtype=np.float32)
    k[..., 1] *= 30
    k[..., dk // 2] += 5
    v = rng.standard_normal((B, H, n, dv), dtype=np.float32) * rng.uniform(0.1, 3, (B, H, n, 1)).astype(np.float32)
    return k, v


CONFIGS = [
    # B, H, dk, dv, cap, dtype, quant, group, k_axis, residual
    (2, 2, 64, 64, 300, "float32", "int8", 32, "channel", 0),
    (2, 1, 64, 32, 360, "float16", "int8", 32, "token", 128),
    (3, 2, 48, 48, 240, "float32", "int4", 32, "token", 5),   # 32 does not divide 48: one group per row
    (1, 2, 128, 64, 400, "float16", "int4", 64, "channel", 128),
    (2, 1, 32, 32, 260, "bfloat16", "int4", 32, "channel", 0),
    (2, 2, 64, 64, 300, "float32", "int8", 64, "token", 17),
]


def new_pair(cfg, layout: str = "contiguous") -> tuple[olkv.KVCache, QModel]:
    B, H, dk, dv, cap, dtype, fmt, group, axis, res = cfg
    c = olkv.KVCache(B, H, dk, head_dim_v=dv, dtype=dtype, capacity=cap, quant=fmt, quant_group=group,
                     k_axis=axis, residual=res, layout=layout)
    return c, QModel(B, H, dk, dv, cap, dtype, fmt, group, axis, res)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[6]}-{c[8]}-g{c[7]}-r{c[9]}-{c[5]}")
@pytest.mark.parametrize("layout, seed", [("contiguous", 0), ("contiguous", 1), ("paged", 2)])
def test_random_operations(cfg, layout: str, seed: int) -> None:
    """Random sequences of every lifecycle operation, export compared after each (the model
    does not know the layout)."""
    rng = np.random.default_rng(seed)
    cache, m = new_pair(cfg, layout)
    G = m.G
    cks: list[tuple[olkv.Checkpoint, dict]] = []
    for step in range(45):
        op = rng.integers(12)
        where = f"step {step} op {op}"
        B = m.B
        if op <= 3:  # append, sometimes ragged, sometimes long
            n = int(rng.integers(0, 3 * G if rng.integers(3) == 0 else G))
            k, v = kv(rng, B, m.H, n, m.dk, m.dv)
            counts = [int(rng.integers(0, n + 1)) for _ in range(B)] if rng.integers(3) == 0 else None
            fits = all(m.lens[b] + (n if counts is None else counts[b]) <= m.cap for b in range(B))
            if fits:
                cache.append(k, v, counts=counts)
                m.append(k, v, counts)
            else:
                with pytest.raises(olkv.CapacityError):
                    cache.append(k, v, counts=counts)
        elif op == 4:  # truncate, often into sealed chunks
            n = [int(rng.integers(m.win[b], m.lens[b] + 1)) for b in range(B)]
            cache.truncate(n)
            m.lens = n
        elif op == 5:  # reorder with repeats
            idx = [int(rng.integers(B)) for _ in range(B)]
            cache.reorder(idx)
            old = m.copy()
            for b, i in enumerate(idx):
                m.set_seq(b, old.seq(i, cut=True))
            cks, m.cks = [], []
        elif op == 6:  # checkpoint
            ck = dict(lens=list(m.lens), win=list(m.win), floor=[1 << 60] * B)
            cks.append((cache.checkpoint(), ck))
            m.cks.append(ck)
        elif op == 7 and cks:  # rollback: stale exactly when the model says so
            handle, ck = cks[int(rng.integers(len(cks)))]
            if all(ck["floor"][b] >= ck["lens"][b] for b in range(B)):
                cache.rollback(handle)
                m.lens, m.win = list(ck["lens"]), list(ck["win"])
            else:
                with pytest.raises(olkv.StaleCheckpointError):
                    cache.rollback(handle)
        elif op == 8:  # evict
            keep = int(rng.integers(3 * G))
            cache.evict(keep)
            m.win = [max(w, n - keep) for w, n in zip(m.win, m.lens)]
        elif op == 9:  # fork, write into the fork
            f = cache.fork()
            fm = m.copy(cut=True)
            fm.cks = []
            n = int(rng.integers(2 * G))
            if max(fm.lens) + n <= fm.cap:
                k, v = kv(rng, B, m.H, n, m.dk, m.dv)
                f.append(k, v)
                fm.append(k, v)
            check(f, fm, where + " fork")
            f.close()
        elif op == 10:  # select a subset
            idx = [int(i) for i in rng.permutation(B)[:1 + int(rng.integers(B))]]
            cache.select(idx)
            old = m.copy()
            m.resize(len(idx))
            for p, i in enumerate(idx):
                m.set_seq(p, old.seq(i))
            cks = []
        elif op == 11 and rng.integers(4) == 0:
            cache.reset()
            m.resize(B)
            cks = []
        check(cache, m, where)
        assert cache.counters["seal_calls"] == m.seals, where
    cache.close()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_non_finite_groups_read_back_nan(fmt: str, axis: str) -> None:
    """A scale group holding NaN or +-inf reads back NaN, the other groups are exact to the model."""
    c, m = new_pair((1, 1, 64, 64, 64, "float32", fmt, 32, axis, 0))
    rng = np.random.default_rng(3)
    k, v = kv(rng, 1, 1, 32, 64, 64)
    k[0, 0, 5, 3] = np.nan
    k[0, 0, 7, 50] = np.inf
    v[0, 0, 9, 40] = -np.inf
    c.append(k, v)
    m.append(k, v)
    check(c, m, "non-finite")
    K, V = c.export("float32")
    assert np.isnan(K[0, 0, 5, 3]) and np.isnan(K[0, 0, 7, 50]) and np.isnan(V[0, 0, 9, 40])
    # per channel: channels 3 and 50 of the chunk; per token: group 0 of row 5, group 1 of row 7
    assert int(np.isnan(K).sum()) == 64 and int(np.isnan(V).sum()) == 32
    if axis == "channel":
        assert np.isfinite(K[0, 0, :, 10]).all()
    else:
        assert np.isfinite(K[0, 0, 6]).all() and np.isfinite(K[0, 0, 5, 32:]).all()


def test_truncate_into_a_chunk_keeps_values() -> None:
    """Truncating into a sealed chunk and appending: the kept rows do not change, the new ones are
    native until the next seal, which starts at the cut."""
    c, m = new_pair((1, 1, 32, 32, 256, "float16", "int4", 32, "channel", 0))
    rng = np.random.default_rng(9)
    k, v = kv(rng, 1, 1, 100, 32, 32)
    c.append(k, v)
    m.append(k, v)
    before = c.export("float32")[0][:, :, :40].copy()
    c.truncate(40)
    m.lens = [40]
    k2, v2 = kv(rng, 1, 1, 10, 32, 32)
    c.append(k2, v2)
    m.append(k2, v2)
    np.testing.assert_array_equal(c.export("float32")[0][:, :, :40], before)
    np.testing.assert_array_equal(c.export("float32")[0][0, 0, 40:50], rounded(k2[0, 0], "float16"))
    assert c.info()["quant"]["sealed_tokens"] == 40
    k3, v3 = kv(rng, 1, 1, 22, 32, 32)
    c.append(k3, v3)
    m.append(k3, v3)
    assert m.chunks[0] == [0, 32, 40]
    check(c, m, "reseal")


def test_info_figures() -> None:
    """info()['quant'] and the counters: options, sealed/native tokens, bytes per token as the
    format says, seal counters; the native window sizes the committed memory, not the capacity."""
    H, D, cap = 8, 128, 4096
    c = olkv.KVCache(1, H, D, dtype="float16", capacity=cap, quant="int8", residual=128)
    q = c.info()["quant"]
    assert (q["format"], q["group"], q["k_axis"], q["residual"]) == ("int8", 32, "channel", 128)
    # rows 2*128 bytes, V 4 scales per row, K 128 per-channel scales per 32 tokens
    assert q["bytes_per_token"] == H * (2 * D + 4 * 4 + 4 * D // 32)
    assert q["native_bytes_per_token"] == H * 2 * D * 2
    committed = c.info()["committed_bytes"]
    assert cap * q["bytes_per_token"] <= committed < cap * q["bytes_per_token"] + H * 160 * 2 * D * 2 + (1 << 16)
    assert committed < 0.65 * cap * q["native_bytes_per_token"]
    rng = np.random.default_rng(0)
    k, v = kv(rng, 1, H, 300, D, D)
    c.append(k, v)
    info = c.info()
    q = info["quant"]
    assert (q["sealed_tokens"], q["native_tokens"]) == (160, 140)
    assert info["counters"]["seal_calls"] == 5
    assert info["counters"]["seal_bytes"] == 5 * H * (32 * D + 4 * D + 32 * D + 32 * 4 * 4)
    assert q["scale_bytes"] == 160 * H * 4 * 4 + 5 * H * 4 * D
    assert c.quant == "int8" and "quant=int8" in repr(c)
    assert "quantization" in c._repr_html_()
    c4 = olkv.KVCache(1, H, D, capacity=256, quant="int4", k_axis="token", quant_group=64)
    # rows 2*64 bytes, 2 scale groups per row (K and V), scale and zero each
    assert c4.info()["quant"]["bytes_per_token"] == H * (D + 2 * 2 * 2 * 4)
    assert olkv.KVCache(1, 1, 8, capacity=8).info()["quant"] is None


@pytest.mark.parametrize("kwargs, exc", [
    (dict(quant="int3"), ValueError),
    (dict(quant=8), TypeError),
    (dict(quant="int8", quant_group=16), ValueError),
    (dict(quant="int8", quant_group=32.0), TypeError),
    (dict(quant="int8", k_axis="row"), ValueError),
    (dict(quant="int8", residual=-1), ValueError),
    (dict(quant="int4", head_dim=63), ValueError),
    (dict(quant="int4", head_dim_v=7), ValueError),
    (dict(quant="int8", layout="paged", block_size=64), ValueError),
    (dict(k_axis="row"), ValueError),  # bad options are errors also without quant
    (dict(quant_group=7), ValueError),
    (dict(residual=-5), ValueError),
])
def test_option_errors(kwargs, exc) -> None:
    args = dict(batch=1, kv_heads=1, head_dim=64, capacity=64)
    args.update(kwargs)
    with pytest.raises(exc):
        olkv.KVCache(**args)


@pytest.fixture
def _int_loops():
    """Restores the integer-loop setting a test changes."""
    was = olkv.get_quant_int_loops()
    yield
    olkv.set_quant_int_loops(*was)


@pytest.mark.parametrize("quant, k_axis, layout", [
    ("int8", "channel", "contiguous"), ("int4", "token", "contiguous"), ("int4", "channel", "paged")])
def test_attention_over_quantized_rows(quant, k_axis, layout, _int_loops) -> None:
    """Attention reads sealed rows in place: the streaming kernel equals the reference kernel over
    the same cache (which dequantizes the rows) and stays close to attention over the unquantized
    rows (the Go tests run every kernel path)."""
    c = olkv.KVCache(1, 2, 64, capacity=256, quant=quant, k_axis=k_axis, residual=16, layout=layout)
    f = olkv.KVCache(1, 2, 64, capacity=256)
    rng = np.random.default_rng(1)
    k, v = (rng.standard_normal((1, 2, 200, 64), dtype=np.float32) for _ in range(2))
    c.append(k, v)
    f.append(k, v)
    assert c.info()["quant"]["sealed_tokens"] > 0
    q = rng.standard_normal((1, 8, 1, 64), dtype=np.float32)
    want = olkv.attention(q, c, kernel="reference")
    # the float loops (integer loops off): float32 rounding only
    olkv.set_quant_int_loops(scores=False, accumulate=False)
    np.testing.assert_allclose(olkv.attention(q, c), want, rtol=2e-5, atol=2e-5)
    # the default integer loops (where the shape and CPU take them): int16 query and weight steps
    olkv.set_quant_int_loops()
    np.testing.assert_allclose(olkv.attention(q, c), want, rtol=0, atol=5e-4)
    # relative error against float32: observed up to 0.008 (int8) and 0.116 (int4) over 5 seeds of
    # this data (Gaussian K and V, 200 tokens, residual 16); bounds about twice that
    f32 = olkv.attention(q, f, kernel="reference")
    assert np.linalg.norm(want - f32) / np.linalg.norm(f32) <= (0.02 if quant == "int8" else 0.25)
    c.close()
    f.close()


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_outlier_k_channels_keep_the_default_kernel_close(quant, _int_loops) -> None:
    """K with outlier channels (as trained models have) and per-channel K scales: on every kernel
    path the CPU has, the default integer loops (both on) stay within 5e-3 of the reference over
    the same dequantized rows, and below a tenth of the quantization's own error against float32
    attention (the score loop rounds the query times the channel scales to int16 per row, so an
    outlier channel's large scale coarsens the other channels' steps only to 1/32767 of it); the
    float loops (both off) equal the reference up to float32 rounding."""
    assert olkv.get_quant_int_loops() == (True, True)
    assert olkv.build_info()["quant_int_loops"] == "scores+accumulate"
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((1, 8, 512, 128), dtype=np.float32) for _ in range(2))
    k[..., 5] *= 30
    k[..., 77] += 20
    q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)
    c = olkv.KVCache(1, 8, 128, dtype="float16", capacity=1024, quant=quant, residual=0)
    f = olkv.KVCache(1, 8, 128, dtype="float16", capacity=1024)
    c.append(k, v)
    f.append(k, v)
    want = olkv.attention(q, c, kernel="reference")
    storage_err = np.abs(want - olkv.attention(q, f, kernel="reference")).max()
    paths = olkv.build_info()["attention_kernels"]
    try:
        for path in paths:
            olkv.set_kernel(path)
            olkv.set_quant_int_loops()
            # observed 1.7e-3 (int8) and 2.6e-3 (int4) on AVX2 and AVX-512, storage error 0.026 and 0.26
            err = np.abs(olkv.attention(q, c) - want).max()
            assert err <= 5e-3 and err <= 0.1 * storage_err, (path, err, storage_err)
            olkv.set_quant_int_loops(scores=False, accumulate=False)
            assert olkv.get_quant_int_loops() == (False, False)
            assert np.abs(olkv.attention(q, c) - want).max() <= 1e-4, path
    finally:
        olkv.set_kernel("auto")
        c.close()
        f.close()
    with pytest.raises(TypeError):
        olkv.set_quant_int_loops(1)  # type: ignore[arg-type]


@pytest.mark.parametrize("quant,change", [("int8", 3e3), ("int8", 3e4), ("int8", 1e5), ("int4", -1e4)])
def test_k_channel_of_large_spread_keeps_the_default_kernel_close(quant: str, change: float) -> None:
    """One K channel offset by a large amount (int8; int4: multiplied, a negative change): its
    per-channel scale is hundreds to thousands of times the others', so the integer score loop's
    int16 query would keep the other channels in a few steps; such chunks (cache.KSpreadMax) take
    the float score loop, and the default kernel stays below a tenth of the quantization's own
    error (it reached 77% of the output at an offset of 1e5 before)."""
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((1, 8, 512, 128), dtype=np.float32) for _ in range(2))
    if change > 0:
        k[..., 77] += np.float32(change)
    else:
        k[..., 77] *= np.float32(-change)
    q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)
    c = olkv.KVCache(1, 8, 128, capacity=1024, quant=quant, residual=0)
    f = olkv.KVCache(1, 8, 128, capacity=1024)
    c.append(k, v)
    f.append(k, v)
    want = olkv.attention(q, c, kernel="reference")
    storage_err = np.abs(want - olkv.attention(q, f, kernel="reference")).max()
    try:
        for path in olkv.build_info()["attention_kernels"]:
            olkv.set_kernel(path)
            err = np.abs(olkv.attention(q, c) - want).max()
            assert err <= 0.1 * storage_err, (path, err, storage_err)
    finally:
        olkv.set_kernel("auto")
        c.close()
        f.close()


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("case", ["tiny V", "V group offset", "V channel x1000"])
def test_default_loops_keep_uneven_v_close(quant, case, _int_loops) -> None:
    """V whose chunk is tiny (steps of the int16 weights would be subnormal) or whose scale groups
    lie far apart (one group's step would swamp the others): the integer accumulation loop hands
    such chunks to the float loop, so every column stays within 1e-3 of the reference relative to
    its own magnitude (before, tiny V came out 0 or 7 times too large, and the small groups of an
    offset one came out 0)."""
    olkv.set_quant_int_loops()
    rng = np.random.default_rng(0)
    k = rng.standard_normal((1, 2, 256, 128), dtype=np.float32)
    v = rng.standard_normal((1, 2, 256, 128), dtype=np.float32)
    if case == "tiny V":
        v *= np.float32(1e-34)
    elif case == "V group offset":
        v[..., :32] += np.float32(1e5)
    else:
        v[..., 5] *= np.float32(1000)
    q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32)
    c = olkv.KVCache(1, 2, 128, capacity=256, quant=quant, quant_group=32, residual=0)
    c.append(k, v)
    want = olkv.attention(q, c, kernel="reference")
    try:
        for path in olkv.build_info()["attention_kernels"]:
            olkv.set_kernel(path)
            got = olkv.attention(q, c)
            for g in range(4):  # each V scale group against its own magnitude
                cols = slice(32 * g, 32 * g + 32)
                err = np.abs(got[..., cols] - want[..., cols]).max() / np.abs(want[..., cols]).max()
                assert err <= 1e-3, (path, g, err)
    finally:
        olkv.set_kernel("auto")
        c.close()


def _decoder_session(mask: bool = False) -> olkv.InferenceSession:
    from onnx_light_kv import models as M
    cfg = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, max_positions=256)
    return olkv.InferenceSession(M.model_bytes(M.llama_decoder(cfg, attention_mask_input=mask)), threads=1)


def test_create_state_and_generate_take_the_options() -> None:
    """create_state(quant=...) makes every layer's cache quantized; generate(state_options=) passes
    the options through. Tokens still in the native window attend as usual (the same tokens as
    an unquantized state); past the window, sealed chunks are read by the fused kernels."""
    sess = _decoder_session()
    st = sess.create_state(max_length=128, quant="int4", quant_group=64, k_axis="token", residual=32)
    info = st.info()
    assert [layer["quant"]["format"] for layer in info["layers"]] == ["int4", "int4"]
    assert {(layer["quant"]["group"], layer["quant"]["k_axis"], layer["quant"]["residual"])
            for layer in info["layers"]} == {(64, "token", 32)}
    assert info["totals"]["seal_calls"] == 0
    st.close()
    prompt = np.array([[3, 17, 42, 5, 99, 7, 250, 31]], np.int64)
    want = olkv.generate(sess, prompt, max_new_tokens=8, state_options={"max_length": 64})
    got = olkv.generate(sess, prompt, max_new_tokens=8,
                        state_options={"max_length": 64, "quant": "int8", "residual": 32})
    np.testing.assert_array_equal(got.sequences, want.sequences)  # 16 tokens: none sealed yet
    got = olkv.generate(sess, prompt, max_new_tokens=40, state_options={"quant": "int8", "residual": 0})
    assert got.sequences.shape == (1, 48)


@pytest.mark.parametrize("kwargs, exc", [
    (dict(quant="int2"), ValueError),
    (dict(quant="int8", quant_group=48), ValueError),
    (dict(quant="int8", k_axis=1), TypeError),
    (dict(quant="int8", residual=-4), ValueError),
    (dict(quant="int8", layout="paged", block_size=64), ValueError),
    (dict(quant="int8", layout="paged", prefix_cache=True), NotImplementedError),
    (dict(k_axis="row", quant_group=7), ValueError),  # also without quant
])
def test_create_state_option_errors(kwargs, exc) -> None:
    with pytest.raises(exc):
        _decoder_session().create_state(max_length=64, **kwargs)


def test_paged_blocks_are_the_sealed_chunks() -> None:
    """layout="paged" with quant: blocks of quant_group tokens taken as chunks are sealed, shared by
    fork without a copy, given back by evict; the state takes the same options."""
    c = olkv.KVCache(2, 2, 64, dtype="float16", capacity=1 << 20, quant="int4", residual=32, layout="paged")
    assert c.block_size == 32 and c.info()["committed_bytes"] < 1 << 20
    rng = np.random.default_rng(5)
    k, v = kv(rng, 2, 2, 200, 64, 64)
    c.append(k, v)
    assert c.info()["blocks_used"] == 2 * 5  # (200 - 32) // 32 chunks per sequence
    f = c.fork()
    assert f.info()["blocks_shared"] == 10
    np.testing.assert_array_equal(f.export("float32")[0], c.export("float32")[0])
    c.evict(64)
    assert c.info()["blocks_used"] == 2
    f.close()
    c.close()
    st = _decoder_session().create_state(max_length=128, quant="int8", layout="paged")
    assert {layer["block_size"] for layer in st.info()["layers"]} == {32}
    st.close()


@pytest.mark.parametrize("block_size", [None, 32])
def test_engine_takes_the_options(block_size) -> None:
    """The serving Engine passes state_options' quantization to its states (contiguous, and paged with
    the chunk-sized blocks); requests that stay in the native window decode like an unquantized Engine, and requests whose prompt seals chunks decode too."""
    from onnx_light_kv.serve import Engine
    sess = _decoder_session(mask=True)
    prompts = [np.array([3, 17, 42, 5], np.int64), np.array([9, 8, 7, 6, 5, 4], np.int64)]

    def run(**opts):
        with Engine(sess, max_batch=2, max_length=64, **opts) as eng:
            ids = [eng.add_request(p, max_new_tokens=6) for p in prompts]
            out = eng.run_until_done()
            return [out[i] for i in ids]

    want = run()
    got = run(block_size=block_size, state_options={"quant": "int8", "residual": 32})
    assert got == want
    prompts = [np.arange(1, 41, dtype=np.int64)]  # 40 tokens: a chunk is sealed with residual 0
    sealed = run(block_size=block_size, state_options={"quant": "int8", "residual": 0})
    vocab = sess.get_outputs()[0].shape[-1]
    assert [len(t) for t in sealed] == [6]
    assert all(0 <= int(t) < vocab for t in sealed[0])


def test_largest_float_reads_back_finite() -> None:
    """A group reaching float32's largest finite value seals to a scale whose largest integer
    reads back finite (it rounded up to an infinity, and attention gave inf/NaN where the
    unquantized cache is finite)."""
    big = np.finfo(np.float32).max
    rng = np.random.default_rng(0)
    k = rng.standard_normal((1, 1, 64, 64)).astype(np.float32)
    v = rng.standard_normal((1, 1, 64, 64)).astype(np.float32)
    v[0, 0, 3, 0] = big
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    c = olkv.KVCache(1, 1, 64, capacity=64, quant="int8", residual=0)
    c.append(k, v)
    assert np.isfinite(c.export("float32")[1]).all()
    assert np.isfinite(olkv.attention(q, c)).all()
    c4 = olkv.KVCache(1, 1, 32, capacity=64, quant="int4", residual=0, k_axis="token")
    x = np.full((1, 1, 32, 32), 1e36, np.float32)
    x[..., 0] = big
    c4.append(x, x)
    back = c4.export("float32")[0]
    assert np.isfinite(back).all()
    np.testing.assert_allclose(back[0, 0, 0, :2], [big, 1e36], rtol=0.08)


def test_paged_scale_bytes_after_evict_count_held_chunks() -> None:
    """info()["quant"]["scale_bytes"] of a paged cache counts the K channel scales of the chunk
    blocks it still holds, not of those a window's evict gave back."""
    k = np.random.default_rng(0).standard_normal((1, 2, 300, 64)).astype(np.float32)
    c = olkv.KVCache(1, 2, 64, capacity=512, quant="int8", residual=0, layout="paged")
    c.append(k, k)
    c.evict(40)
    i = c.info()
    # per-token V scales of the readable sealed rows (2 heads, 2 groups of 32: 4 bytes each)
    # plus the K channel scales (2 heads x 64 x 4 bytes) of each chunk block still held
    assert i["quant"]["scale_bytes"] == i["quant"]["sealed_tokens"] * 2 * 2 * 4 + i["blocks_used"] * 2 * 64 * 4


@pytest.mark.parametrize("group,q_len", [(6, 2), (5, 4), (7, 4), (10, 2), (1, 1), (3, 3)])
def test_integer_loops_with_groups_not_multiple_of_four(group: int, q_len: int) -> None:
    """Query rows per KV head that run four at a time from a row that is not a multiple of four
    (group 6 with two query tokens: rows 6-9) and one at a time: the default integer loops stay
    at the float loops' figure (a run took another run's scales: errors up to 3.7)."""
    rng = np.random.default_rng(0)
    c = olkv.KVCache(1, 1, 128, capacity=128, quant="int8", quant_group=32, residual=0)
    c.append(rng.standard_normal((1, 1, 64, 128), np.float32), rng.standard_normal((1, 1, 64, 128), np.float32))
    q = rng.standard_normal((1, group, q_len, 128), np.float32)
    k, v = (x[0, 0].astype(np.float64) for x in c.export())
    ref = np.empty((group, q_len, 128))
    for h in range(group):
        for i in range(q_len):
            n = 64 - q_len + 1 + i  # causal over the last q_len positions
            s = k[:n] @ q[0, h, i] / np.sqrt(128)
            w = np.exp(s - s.max())
            ref[h, i] = (w / w.sum()) @ v[:n]
    assert olkv.get_quant_int_loops() == (True, True)
    err = np.abs(olkv.attention(q, c)[0] - ref).max()
    assert err < 1e-3, err
