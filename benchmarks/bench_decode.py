"""Decode-step latency: our streaming kernel vs onnxruntime GroupQueryAttention.

Both sides keep the cache in place (onnxruntime with its internal-cache GQA, no copies of the past):

* ours: a contiguous ``KVCache``; one step = ``append`` of the new token's K/V, ``attention``
  of the new query over the whole cache (into a pre-allocated ``out``), then ``truncate`` back
  so every sample sees the same context length.
* onnxruntime: a one-node ``com.microsoft.GroupQueryAttention`` model whose ``past_key`` /
  ``present_key`` (and value) are bound through IOBinding to the SAME pre-allocated
  ``[B, kv_heads, capacity, D]`` OrtValue. One step writes the new token at position L-1 and
  attends positions 0..L-1. After the warm-up the script checks that the new key landed in the
  shared buffer; otherwise onnxruntime copied the past silently and the case is reported as
  invalid.

Both run with the same thread count (1 and 2), measured in alternating blocks of a few calls
(A A A A B B B B ...), so drift from other processes hits both alike. Each block starts after a
50 ms pause and with a settling call that is not recorded, so neither side pays for the other's
worker threads still spinning (both runtimes spin their pools after a call; onnxruntime's for
longer than one of our steps). The machine's streaming-read bandwidth (1 GiB buffer, per
thread count) is measured first; in every case a third side joins the alternating blocks: one
pass of ``onnx_light_kv.stream_read`` over a 256 MiB buffer with the same thread count, so the
bandwidth our step is compared with is measured at the same moment (the machines are shared,
and their bandwidth drifts by 20% or more within minutes). Every case reports median and
p10/p90 of both, the ``speedup`` (onnxruntime time / our time, > 1 means we are faster), the effective K+V GB/s of our step,
its fraction of the bandwidth measured at the start (``bw_frac``) and of the median of the
interleaved probe passes (``bw_frac_paired``), and whether K+V exceed the last-level cache.

Outputs: raw samples + environment to ``benchmarks/results/decode-<UTC>.json``, a printed
summary table, and ``benchmarks/results/decode-<UTC>.png`` (latency vs context).

Usage::

    python benchmarks/bench_decode.py            # the full grid
    python benchmarks/bench_decode.py --quick    # small subset, about a minute
    python benchmarks/bench_decode.py --target   # the target cases only (fp32 GQA 32/8 d128)
    python benchmarks/bench_decode.py --kernel avx2 avx512 --dtypes float32 --heads 32/8 32/32 \
        --head-dims 128 64 --batches 1 4 --contexts 1024 4096 16384 32768

``--kernel`` names the attention kernel paths to run (``auto go avx2 avx512``, default ``auto``):
each one is a side of the same alternating blocks, so the paths are compared at the same moment,
each row names the path it ran (``kernel``), and the output starts with the CPU, its flags and
the paths available (also in the JSON's ``env``). On an AVX-512 machine ``avx2`` forces the AVX2
path. The paired bandwidth probe always reads with the best path. ``--dtypes``, ``--heads``,
``--head-dims`` and ``--batches`` replace the preset grid by their cross product (bfloat16 has
no onnxruntime CPU comparator: ours only).
    python benchmarks/bench_decode.py --layout contiguous paged   # + a paged cache, side by side

With ``--layout contiguous paged`` another side joins the alternating blocks: the same step on a
``KVCache(layout="paged", block_size=--block-size)`` holding the same rows, on the first
``--kernel`` path; that path's rows report ``paged_ms`` and ``paged_ratio`` (paged time /
contiguous time; the target is <= 1.05).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import blocked, environment, format_table, plot_series, summarize, write_json  # noqa: E402


@dataclass(frozen=True)
class Case:
    threads: int
    dtype: str  # "float32", "float16" or "bfloat16" (ours only)
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    context: int  # tokens in the cache after the step, the new one included

    @property
    def label(self) -> str:
        return (f"t{self.threads} {self.dtype} b{self.batch} h{self.q_heads}/{self.kv_heads} "
                f"d{self.head_dim}")

    @property
    def kv_bytes(self) -> int:
        esize = 4 if self.dtype == "float32" else 2
        return self.batch * self.kv_heads * self.context * 2 * self.head_dim * esize


def grid(quick: bool, contexts: Optional[List[int]], threads: List[int], target: bool = False,
         custom: Optional[List[tuple]] = None) -> List[Case]:
    """The full grid of cases (or the quick subset, the target configuration, or the ``custom``
    configurations ``(dtype, batch, q_heads, kv_heads, head_dim)``), in plotting order."""
    ctx = contexts or ([256, 1024, 4096, 16384] if quick else [256, 1024, 4096, 16384, 32768])
    if target and not contexts:
        ctx = [1024, 4096, 16384, 32768]
    cases: List[Case] = []
    for t in threads:
        configs = [("float32", 1, 32, 8, 128)]
        if custom:
            configs = list(custom)
        elif target:
            configs.append(("float32", 4, 32, 8, 128))
        elif not quick:
            configs += [("float32", 4, 32, 8, 128), ("float32", 1, 32, 32, 128), ("float32", 4, 32, 32, 128),
                        ("float32", 1, 32, 1, 128), ("float32", 4, 32, 1, 128), ("float32", 1, 32, 8, 64),
                        ("float16", 1, 32, 8, 128)]
        for dt, b, hq, hkv, d in configs:
            for L in ctx:
                cases.append(Case(t, dt, b, hq, hkv, d, L))
    return cases


# ---------------------------------------------------------------- bandwidth

def read_bandwidth(threads: int) -> Dict[str, Any]:
    """Streaming-read GB/s of a 1 GiB buffer: the Go probe when the extension has it (SIMD
    reads on `threads` goroutines), else numpy sums on `threads` Python threads."""
    try:
        from onnx_light_kv._kernel import read_bandwidth as probe
        return {"gbps": probe(1024, threads, 5), "method": "onnx_light_kv ReadBandwidth (Go, SIMD)"}
    except (ImportError, AttributeError):
        pass
    buf = np.ones(1 << 28, dtype=np.float32)
    parts = np.array_split(buf, threads)
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, buf.nbytes / (time.perf_counter() - t0) / 1e9)
    del buf, parts
    return {"gbps": best, "method": "numpy add.reduce (fallback)"}


_PROBE: List[np.ndarray] = []


def probe_buffer() -> Optional[np.ndarray]:
    """The 256 MiB buffer of the paired bandwidth probe (allocated and touched once), or None
    when the extension has no ``stream_read``."""
    import onnx_light_kv as olkv

    if not hasattr(olkv, "stream_read"):
        return None
    if not _PROBE:
        _PROBE.append(np.ones(64 << 20, np.float32))
    return _PROBE[0]


# ---------------------------------------------------------------- onnxruntime

def gqa_model(c: Case, capacity: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    dt = TensorProto.FLOAT16 if c.dtype == "float16" else TensorProto.FLOAT
    d = c.head_dim
    node = helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"],
        domain="com.microsoft", num_heads=c.q_heads, kv_num_heads=c.kv_heads)
    inputs = [
        helper.make_tensor_value_info("query", dt, [c.batch, 1, c.q_heads * d]),
        helper.make_tensor_value_info("key", dt, [c.batch, 1, c.kv_heads * d]),
        helper.make_tensor_value_info("value", dt, [c.batch, 1, c.kv_heads * d]),
        helper.make_tensor_value_info("past_key", dt, [c.batch, c.kv_heads, capacity, d]),
        helper.make_tensor_value_info("past_value", dt, [c.batch, c.kv_heads, capacity, d]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [c.batch]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    outputs = [
        helper.make_tensor_value_info("output", dt, [c.batch, 1, c.q_heads * d]),
        helper.make_tensor_value_info("present_key", dt, [c.batch, c.kv_heads, capacity, d]),
        helper.make_tensor_value_info("present_value", dt, [c.batch, c.kv_heads, capacity, d]),
    ]
    graph = helper.make_graph([node], "gqa_decode", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


class OrtStep:
    """One GQA decode step over a shared past/present buffer bound through IOBinding."""

    def __init__(self, c: Case, past_k: np.ndarray, past_v: np.ndarray, q: np.ndarray, k: np.ndarray,
                 v: np.ndarray):
        from onnx_light_kv._optional import require

        ort = require("onnxruntime")  # ImportError naming the 'ort' extra when missing

        so = ort.SessionOptions()
        so.intra_op_num_threads = c.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(gqa_model(c, past_k.shape[2]), so, providers=["CPUExecutionProvider"])
        ov = ort.OrtValue.ortvalue_from_numpy
        self.kbuf, self.vbuf = ov(past_k), ov(past_v)  # the shared buffers (share numpy memory)
        self.np_k, self.np_v = past_k, past_v
        self.inputs = {"query": ov(q), "key": ov(k), "value": ov(v),
                       "seqlens_k": ov(np.full(c.batch, c.context - 1, np.int32)),
                       "total_sequence_length": ov(np.array(c.context, np.int32))}
        self.out = ov(np.zeros((c.batch, 1, c.q_heads * c.head_dim), q.dtype))
        b = self.sess.io_binding()
        for name, val in self.inputs.items():
            b.bind_ortvalue_input(name, val)
        b.bind_ortvalue_input("past_key", self.kbuf)
        b.bind_ortvalue_input("past_value", self.vbuf)
        b.bind_ortvalue_output("output", self.out)
        b.bind_ortvalue_output("present_key", self.kbuf)
        b.bind_ortvalue_output("present_value", self.vbuf)
        self.binding = b

    def __call__(self) -> None:
        self.sess.run_with_iobinding(self.binding)

    def shares_buffer(self, c: Case, k: np.ndarray) -> bool:
        """True when the new key of the last step sits at position L-1 of the shared buffer
        (and the buffer is still the numpy memory we bound)."""
        new = k.reshape(c.batch, c.kv_heads, c.head_dim)
        return bool(np.array_equal(self.np_k[:, :, c.context - 1, :], new)
                    and self.kbuf.data_ptr() == self.np_k.ctypes.data)


# ---------------------------------------------------------------- one case

def run_case(c: Case, repeat: int, warmup: int, rng: np.random.Generator,
             kernels: Optional[List[tuple]] = None, layouts: tuple = ("contiguous",),
             block_size: Optional[int] = None) -> Dict[str, Any]:
    """One case: our step on each kernel path of ``kernels`` (``(requested, path)`` pairs, default
    the best path), onnxruntime, the paired probe and (``layouts`` with "paged") the same step on a
    paged cache with the first path, in alternating blocks. Returns the case, one
    row per kernel path (``rows``) and the raw samples."""
    import onnx_light_kv as olkv

    kernels = kernels or [("auto", olkv.build_info()["attention_kernels"][-1])]
    olkv.set_kernel("auto")
    if c.dtype == "bfloat16":
        import ml_dtypes

        np_dt: Any = ml_dtypes.bfloat16
    else:
        np_dt = np.float16 if c.dtype == "float16" else np.float32
    L, d = c.context, c.head_dim
    cap = L + 1
    # The shared ORT buffer doubles as the source of our cache's past rows.
    past_k = np.zeros((c.batch, c.kv_heads, cap, d), np_dt)
    past_v = np.zeros((c.batch, c.kv_heads, cap, d), np_dt)
    past_k[:, :, :L - 1] = rng.standard_normal((c.batch, c.kv_heads, L - 1, d), np.float32).astype(np_dt)
    past_v[:, :, :L - 1] = rng.standard_normal((c.batch, c.kv_heads, L - 1, d), np.float32).astype(np_dt)
    q = rng.standard_normal((c.batch, c.q_heads, 1, d), np.float32)
    k = rng.standard_normal((c.batch, c.kv_heads, 1, d), np.float32).astype(np_dt).astype(np.float32)
    v = rng.standard_normal((c.batch, c.kv_heads, 1, d), np.float32).astype(np_dt).astype(np.float32)

    cache = olkv.KVCache(c.batch, c.kv_heads, d, dtype=c.dtype, capacity=cap)
    if L > 1:
        cache.append(past_k[:, :, :L - 1].astype(np.float32), past_v[:, :, :L - 1].astype(np.float32))
    out = np.empty((c.batch, c.q_heads, 1, d), np.float32)
    olkv.set_threads(c.threads)

    def ours() -> None:
        cache.append(k, v)
        olkv.attention(q, cache, out=out)
        cache.truncate(L - 1)

    row: Dict[str, Any] = {"case": c.label, "context": L, "kv_MB": c.kv_bytes / 1e6}
    ort_step: Optional[OrtStep] = None
    ort_note = ""
    try:
        if c.dtype == "bfloat16":
            raise NotImplementedError("onnxruntime's CPU GroupQueryAttention has no bfloat16")
        q_ort = q.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.q_heads * d).astype(np_dt)
        k_ort = np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.kv_heads * d).astype(np_dt))
        v_ort = np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.kv_heads * d).astype(np_dt))
        ort_step = OrtStep(c, past_k, past_v, np.ascontiguousarray(q_ort), k_ort, v_ort)
        ort_step()
        if not ort_step.shares_buffer(c, k_ort):
            ort_note = "ORT did not write into the shared buffer (silent copy): invalid comparator"
            ort_step = None
        else:
            # Same inputs, same answer on every path: the comparison is between equal computations.
            want = ort_step.out.numpy().astype(np.float32)
            tol = 2e-2 if c.dtype == "float16" else 1e-3
            err = 0.0
            for _, path in kernels:
                olkv.set_kernel(path)
                ours()
                got = out.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.q_heads * d)
                err = max(err, float(np.max(np.abs(got - want))))
            olkv.set_kernel("auto")
            row["max_abs_diff"] = err
            if err > tol:
                ort_note = f"outputs differ by {err:.3g} (tolerance {tol})"
    except NotImplementedError as e:
        ort_note = str(e)
        ort_step = None
    except Exception as e:  # noqa: BLE001 - an unsupported ORT case is reported, not fatal
        ort_note = f"onnxruntime failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        ort_step = None

    fns = {f"ours:{path}": _common.on_kernel(path, ours) for _, path in kernels}
    paged = None
    if "paged" in layouts:
        paged = olkv.KVCache(c.batch, c.kv_heads, d, dtype=c.dtype, capacity=cap, layout="paged",
                             block_size=block_size)
        if L > 1:
            paged.append(past_k[:, :, :L - 1].astype(np.float32), past_v[:, :, :L - 1].astype(np.float32))
        out_p = np.empty_like(out)

        def ours_paged() -> None:
            paged.append(k, v)
            olkv.attention(q, paged, out=out_p)
            paged.truncate(L - 1)

        ours_paged()
        ours()
        row["paged_max_abs_diff"] = float(np.max(np.abs(out_p - out)))
        fns["paged"] = _common.on_kernel(kernels[0][1], ours_paged)
    if ort_step is not None:
        fns["ort"] = ort_step
    buf = probe_buffer()
    if buf is not None:
        # the probe reads with the best path, whichever path our step ran last
        fns["probe"] = _common.on_kernel("auto", lambda: olkv.stream_read(buf, c.threads))
    samples = blocked(fns, repeat=repeat, warmup=warmup)
    olkv.set_kernel("auto")
    if "probe" in samples:
        # The recorded calls only (not the settling ones), as for the other two sides.
        probe_gbps = [buf.nbytes / (ms * 1e6) for ms in samples.pop("probe")]
        row["bw_paired_GBps"] = float(np.median(probe_gbps))
        row["bw_paired_p10"] = float(np.percentile(probe_gbps, 10))
        row["bw_paired_p90"] = float(np.percentile(probe_gbps, 90))
        samples["probe_GBps"] = probe_gbps
    if "ort" in samples:
        s_ort = summarize(samples["ort"])
        row.update({"ort_ms": s_ort["median"], "ort_p10": s_ort["p10"], "ort_p90": s_ort["p90"],
                    "ort_GBps": c.kv_bytes / (s_ort["median"] / 1e3) / 1e9})
    if ort_note:
        row["note"] = ort_note
    rows = []
    for _, path in kernels:
        s_ours = summarize(samples[f"ours:{path}"])
        r = {"case": row["case"], "kernel": path, **{k: v for k, v in row.items() if k != "case"}}
        r.update({"ours_ms": s_ours["median"], "ours_p10": s_ours["p10"], "ours_p90": s_ours["p90"],
                  "ours_GBps": c.kv_bytes / (s_ours["median"] / 1e3) / 1e9})
        if "ort_ms" in row:
            r["speedup"] = _common.speedup(s_ours["median"], row["ort_ms"])
        rows.append(r)
    if "paged" in samples:  # timed on the first kernel path
        s_p = summarize(samples["paged"])
        rows[0].update({"paged_ms": s_p["median"], "paged_p10": s_p["p10"], "paged_p90": s_p["p90"],
                        "paged_ratio": s_p["median"] / rows[0]["ours_ms"]})
    counters = dict(cache.counters)
    cache.close()
    if paged is not None:
        paged.close()
    del ort_step, cache, past_k, past_v
    gc.collect()
    return {"case": asdict(c), "rows": rows, "samples": samples, "cache_counters": counters}


# ---------------------------------------------------------------- main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fp32 GQA 32/8 d128 batch 1, contexts 256..16k")
    ap.add_argument("--target", action="store_true",
                    help="only the target: fp32 GQA 32/8 d128, batch 1 and 4, contexts 1k..32k")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--repeat", type=int, default=None, help="timed samples per side (default 40, quick 25)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-gib", type=float, default=2.0,
                    help="skip cases whose K+V exceed this many GiB per side (RAM guard)")
    ap.add_argument("--kernel", nargs="+", default=["auto"], choices=_common.KERNEL_CHOICES,
                    help="attention kernel paths to run side by side (default: auto, the best one)")
    ap.add_argument("--dtypes", nargs="+", choices=["float32", "float16", "bfloat16"], default=None,
                    help="with --heads/--head-dims/--batches: replace the preset grid by the cross product")
    ap.add_argument("--heads", nargs="+", default=None, help="q_heads/kv_heads pairs, e.g. 32/8 32/32")
    ap.add_argument("--head-dims", type=int, nargs="+", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--layout", nargs="+", choices=["contiguous", "paged"], default=["contiguous"],
                    help="cache layouts to time side by side (contiguous is always the reference)")
    ap.add_argument("--block-size", type=int, default=None, help="paged layout block size (default: the library's)")
    args = ap.parse_args(argv)
    custom = None
    if args.dtypes or args.heads or args.head_dims or args.batches:
        heads = [tuple(int(x) for x in h.split("/")) for h in (args.heads or ["32/8"])]
        custom = [(dt, b, hq, hkv, d) for dt in (args.dtypes or ["float32"]) for hq, hkv in heads
                  for d in (args.head_dims or [128]) for b in (args.batches or [1])]

    import onnx_light_kv as olkv

    repeat = args.repeat or (25 if args.quick else 40)
    build = olkv.build_info()
    llc = int(build.get("cache_bytes", {}).get("l3", 32 << 20) or (32 << 20))
    bw = {t: read_bandwidth(t) for t in sorted(set(args.threads))}
    for t, b in bw.items():
        print(f"streaming read, {t} thread(s): {b['gbps']:.1f} GB/s ({b['method']})")
    kernels = _common.kernel_runs(args.kernel)
    if not kernels:
        print("none of the kernel paths asked for is available")
        return 2
    print(_common.isa_line())
    print(f"kernel paths run: {', '.join(p for _, p in kernels)}  LLC: {llc / 2**20:.0f} MiB "
          "(bandwidth probes read with the best path)")

    rng = np.random.default_rng(0)
    results, rows = [], []
    row_cases: List[Dict[str, Any]] = []  # the case of each row
    for c in _common.progress(grid(args.quick, args.contexts, args.threads, args.target, custom), desc="cases"):
        if c.kv_bytes > args.max_gib * 2 ** 30:
            print(f"skip {c.label} L={c.context}: K+V {c.kv_bytes / 2**30:.1f} GiB > --max-gib")
            continue
        r = run_case(c, repeat, args.warmup, rng, kernels, tuple(args.layout), args.block_size)
        results.append(r)
        for row in r["rows"]:
            row["bw_frac"] = row["ours_GBps"] / bw[c.threads]["gbps"]
            if "bw_paired_GBps" in row:
                row["bw_frac_paired"] = row["ours_GBps"] / row["bw_paired_GBps"]
            row["beyond_llc"] = c.kv_bytes > llc
            rows.append(row)
            row_cases.append(r["case"])
            print(f"{row['case']:<28} {row['kernel']:<6} L={c.context:>6}  ours {row['ours_ms']:8.3f} ms"
                  + (f"  ort {row['ort_ms']:8.3f} ms  speedup {row['speedup']:5.2f}" if "speedup" in row else "")
                  + f"  {row['ours_GBps']:6.1f} GB/s ({row['bw_frac'] * 100:4.0f}%"
                  + (f", {row['bw_frac_paired'] * 100:4.0f}% of {row['bw_paired_GBps']:.1f} paired)"
                     if "bw_frac_paired" in row else ")")
                  + (f"  paged {row['paged_ms']:8.3f} ms ({row['paged_ratio']:4.2f}x)" if "paged_ms" in row else "")
                  + (f"  [{row['note']}]" if "note" in row else ""), flush=True)

    cols = ["case", "kernel", "context", "kv_MB", "ours_ms", "ours_p10", "ours_p90", "ort_ms", "ort_p10", "ort_p90",
            "speedup", "ours_GBps", "bw_frac", "bw_paired_GBps", "bw_frac_paired", "beyond_llc",
            "paged_ms", "paged_ratio", "note"]
    print()
    print(_common.isa_line())
    print(format_table(rows, [c for c in cols if any(c in r for r in rows)]))
    print(_common.SPEEDUP)

    # Target check: fp32 GQA 32/8 d128, contexts >= 1k, 1 and 2 threads, speed-up >= 1.25.
    for _, path in kernels:
        tgt = [r for r, rc in zip(rows, row_cases)
               if r["kernel"] == path and rc["dtype"] == "float32" and rc["q_heads"] == 32 and rc["kv_heads"] == 8
               and rc["head_dim"] == 128 and rc["context"] >= 1024 and "speedup" in r]
        if tgt:
            worst = min(r["speedup"] for r in tgt)
            print(f"\n{path}: target speed-up >= 1.25 (fp32 GQA 32/8 d128, L >= 1k): worst {worst:.2f} "
                  f"over {len(tgt)} cases -> {'met' if worst >= 1.25 else 'NOT met'}")
    paged_rows = [r for r in rows if "paged_ratio" in r and r["context"] >= 1024]
    if paged_rows:
        worst = max(r["paged_ratio"] for r in paged_rows)
        print(f"\npaged / contiguous decode time (L >= 1k, target <= 1.05): worst {worst:.2f}, median "
              f"{np.median([r['paged_ratio'] for r in paged_rows]):.2f} over {len(paged_rows)} cases")
    # Bandwidth fractions beyond the LLC, per configuration (the target is the fp32
    # GQA 32/8 d128 one; MQA is compute-bound and far below by nature).
    by_cfg: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        if r["beyond_llc"]:
            by_cfg.setdefault(f"{r['case']} {r['kernel']}", []).append(r)
    if by_cfg:
        print("\nfraction of the streaming-read bandwidth where K+V > LLC (target 85%), min / median:")
        for label, rs in by_cfg.items():
            parts = [f"{what} {min(r[key] for r in rs) * 100:.0f}% / {np.median([r[key] for r in rs]) * 100:.0f}%"
                     for key, what in (("bw_frac", "start probe"), ("bw_frac_paired", "paired probe"))
                     if all(key in r for r in rs)]
            print(f"  {label:<35} " + ", ".join(parts))

    payload = {"benchmark": "decode", "env": environment(threads=max(args.threads)),
               "kernels_run": [p for _, p in kernels], "args": vars(args), "read_bandwidth": bw, "llc_bytes": llc, "rows": rows, "results": results}
    path = write_json("decode", payload)
    print(f"\nraw samples: {path}")
    if not args.no_plot and rows:
        series: Dict[str, Dict[str, List[float]]] = {}
        ratio: Dict[str, Any] = {}
        for r, res in zip(rows, results):
            for side in ("ours", "ort"):
                if f"{side}_ms" not in r:
                    continue
                if side == "ort" and r["kernel"] != kernels[0][1]:
                    continue  # one onnxruntime series per case
                name = f"ours {r['kernel']} {r['case']}" if side == "ours" else f"ort {r['case']}"
                s = series.setdefault(name, {"x": [], "median": [], "p10": [], "p90": []})
                s["x"].append(r["context"])
                s["median"].append(r[f"{side}_ms"])
                s["p10"].append(r[f"{side}_p10"])
                s["p90"].append(r[f"{side}_p90"])
            if "speedup" in r:
                x, vals = ratio.setdefault(f"{r['kernel']} {r['case']}", ([], []))
                x.append(r["context"])
                vals.append(r["speedup"])
        png = plot_series(path[:-5] + ".png", series, "context (tokens)", "decode step (ms)",
                          title="decode step: onnx-light-kv vs onnxruntime GQA (shared buffer)",
                          logy=True, ratio=ratio)
        print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
