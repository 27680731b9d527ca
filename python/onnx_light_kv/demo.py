"""The demo job: a synthetic decode loop over a KVCache, checked and timed.

It fills a cache token by token as a generation loop does (prefill, then one
token per step), runs decode attention each step, checks the result against
a numpy reference on a sample of steps, and prints the cache's info table,
the append/attention counters and timing figures (median and p90 per step,
effective K+V bandwidth).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the demo's command-line options."""
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--prompt", type=int, default=512, help="prefill tokens")
    p.add_argument("--steps", type=int, default=256, help="decode steps")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--threads", type=int, default=0, help="kernel threads (0: all CPUs)")
    p.add_argument("--check-every", type=int, default=32, help="compare with numpy every N steps")
    p.add_argument("--seed", type=int, default=0)


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """numpy decode attention for one new token: q [B,Hq,1,D], k/v [B,Hkv,L,D]."""
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) * scale
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, vv).astype(np.float32)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n):,} B"
        n /= 1024
    return str(n)


def run(args: Any) -> int:
    """Run the demo; returns the process exit code (1 if a check failed)."""
    import onnx_light_kv as olkv

    olkv.set_threads(args.threads or None)
    info = olkv.build_info()
    print(f"onnx-light-kv {info['version']} | {info['cpu']} | kernel {info['attention_kernel']} | "
          f"threads {olkv.get_threads()}")
    rng = np.random.default_rng(args.seed)
    B, Hq, Hkv, D = args.batch, args.q_heads, args.kv_heads, args.head_dim
    cap = args.prompt + args.steps
    cache = olkv.KVCache(B, Hkv, D, dtype=args.dtype, capacity=cap)
    k0 = rng.standard_normal((B, Hkv, args.prompt, D), dtype=np.float32)
    v0 = rng.standard_normal((B, Hkv, args.prompt, D), dtype=np.float32)
    t0 = time.perf_counter()
    cache.append(k0, v0)
    prefill = time.perf_counter() - t0
    print(f"prefill: appended {args.prompt} tokens in {prefill * 1e3:.2f} ms")

    tol = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}[args.dtype]
    scale = 1.0 / np.sqrt(D)
    t_append, t_attn = [], []
    worst = 0.0
    out = np.empty((B, Hq, 1, D), dtype=np.float32)
    cache.reset_counters()
    for step in range(args.steps):
        k = rng.standard_normal((B, Hkv, 1, D), dtype=np.float32)
        v = rng.standard_normal((B, Hkv, 1, D), dtype=np.float32)
        q = rng.standard_normal((B, Hq, 1, D), dtype=np.float32)
        a = time.perf_counter()
        cache.append(k, v)
        b = time.perf_counter()
        olkv.attention(q, cache, out=out)
        c = time.perf_counter()
        t_append.append(b - a)
        t_attn.append(c - b)
        if args.check_every and (step % args.check_every == 0 or step == args.steps - 1):
            kk, vv = cache.export(dtype="float32")
            ref = reference_attention(q, kk, vv, scale)
            worst = max(worst, float(np.max(np.abs(out - ref))))
    counters = cache.counters
    i = cache.info()
    print("\ncache info")
    for key in ("dtype", "layout", "batch", "kv_heads", "head_dim_k", "capacity", "committed_bytes",
                "live_bytes", "page_table_bytes"):
        val = i[key]
        print(f"  {key:<17} {_fmt_bytes(val) if key.endswith('bytes') else val}")
    print(f"  {'lengths':<17} {i['lengths']}")
    row = B * Hkv * 2 * D * cache.dtype.itemsize
    print("\ncounters over the decode loop")
    print(f"  append bytes     {_fmt_bytes(counters['append_bytes'])} "
          f"(= {counters['append_bytes'] // row} tokens x {_fmt_bytes(row)}: only new tokens copied)")
    print(f"  attention bytes  {_fmt_bytes(counters['attention_bytes'])} read in {counters['attention_calls']} calls")
    ta, tt = np.array(t_append) * 1e6, np.array(t_attn) * 1e6
    last_bytes = cap * row
    print("\nper decode step (microseconds)      median      p90")
    print(f"  append 1 token                 {np.median(ta):9.1f} {np.percentile(ta, 90):8.1f}")
    print(f"  attention (len {args.prompt}..{cap}) {np.median(tt):9.1f} {np.percentile(tt, 90):8.1f}")
    print(f"  effective K+V read at the last step: {last_bytes / (tt[-16:].mean() * 1e-6) / 1e9:.1f} GB/s")
    ok = worst <= tol
    print(f"\ncheck vs numpy reference: max |diff| = {worst:.2e} (tolerance {tol:g} for {args.dtype}) -> "
          f"{'OK' if ok else 'FAILED'}")
    cache.close()
    return 0 if ok else 1
