#!/usr/bin/env python3
"""Per-call overhead of the Python API on a 1-token decode step.

For ``KVCache.append`` (one token) and ``attention`` (q_len 1) it times the
Python call and the same work looped inside Go (``AppendLoop`` /
``AttentionLoop`` in the bindings), in one run, and reports the difference:
what the Python layer (argument checks, pointer hand-off, gopy call, GIL
release) costs per call. Raw samples and the environment go to
``benchmarks/results/overhead-<timestamp>.json`` (``--results-dir`` elsewhere).

    python benchmarks/bench_overhead.py [--contexts 1 256 4096] [--threads 1] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import numpy as np

import onnx_light_kv as olkv
from onnx_light_kv import _lib
from onnx_light_kv._dtypes import CODES
import _common
from _common import environment, format_table, summarize, write_json


def py_samples(fn, repeat: int, calls: int = 50) -> list[float]:
    """Per-call microseconds of fn, one sample per batch of ``calls`` calls."""
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return out


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=_common.positive_int, nargs="+", default=[1, 256, 4096])
    p.add_argument("--threads", type=_common.threads_arg, default=1)
    p.add_argument("--repeat", type=_common.positive_int, default=40, help="samples of 50 calls per side")
    _common.add_results_dir(p)
    args = p.parse_args(argv)
    olkv.set_threads(args.threads)
    B, Hq, Hkv, D = 1, 32, 8, 128
    rng = np.random.default_rng(0)
    rows, raw = [], {}
    append_loop, attn_loop = _lib.fn("AppendLoop"), _lib.fn("AttentionLoop")

    # append: one token into a cache that is truncated back between batches
    cache = olkv.KVCache(B, Hkv, D, capacity=64)
    k = rng.standard_normal((B, Hkv, 1, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, 1, D), dtype=np.float32)
    py, go = [], []
    for _ in range(args.repeat):  # alternate, so machine noise hits both alike
        cache.reset()
        py += py_samples(lambda: cache.append(k, v), 1)
        cache.reset()
        ns = append_loop(cache._h, _lib.addr(k), k.nbytes, _lib.addr(v), v.nbytes, CODES[k.dtype], 1, 50)
        go.append(ns / 50 / 1e3)
    rows.append({"call": "append 1 token", "context": "-", "python_us": summarize(py)["median"],
                 "go_us": summarize(go)["median"], "overhead_us": summarize(py)["median"] - summarize(go)["median"]})
    raw["append"] = {"python_us": py, "go_us": go}

    for L in args.contexts:
        cache = olkv.KVCache(B, Hkv, D, capacity=L)
        cache.append(rng.standard_normal((B, Hkv, L, D), dtype=np.float32),
                     rng.standard_normal((B, Hkv, L, D), dtype=np.float32))
        q = rng.standard_normal((B, Hq, 1, D), dtype=np.float32)
        out = np.empty((B, Hq, 1, D), np.float32)
        py, go = [], []
        for _ in range(args.repeat):
            py += py_samples(lambda: olkv.attention(q, cache, out=out), 1)
            ns = attn_loop(cache._h, _lib.addr(q), q.size, _lib.addr(out), out.size, Hq, 1, 0.0, 0.0, 0, 50)
            go.append(ns / 50 / 1e3)
        ps, gs = summarize(py), summarize(go)
        rows.append({"call": "attention q_len 1", "context": L, "python_us": ps["median"], "go_us": gs["median"],
                     "overhead_us": ps["median"] - gs["median"]})
        raw[f"attention_{L}"] = {"python_us": py, "go_us": go}
    print(format_table(rows, floatfmt="{:.2f}"))
    path = write_json("overhead", {"environment": environment(threads=args.threads), "rows": rows, "samples": raw},
                      args.results_dir)
    print("raw samples:", path)


if __name__ == "__main__":
    sys.exit(_common.run_main(main))
