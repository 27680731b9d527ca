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

Quantized caches (``--quant``): per geometry (GQA 32/8 d128 by default; ``--heads``,
``--head-dims``, ``--batches`` change it) one set of alternating blocks holds our fp32, fp16 and
bf16 caches, the int8 and int4 caches with residual 0 and 128 (native type ``--quant-dtype``,
default float16; ``--quant-group 32 64`` adds a row set per group, labelled ``int8 r128 g64``;
``--k-axis``; ``--variants`` picks some), onnxruntime's
GroupQueryAttention with its int8 and with its int4 cache (shared IOBinding buffer, static
``PER_CHANNEL`` scales calibrated on the past, ``--ort-quant-kind``) and the probe. Contexts are
1k-32k plus the step's token (the cache holds a whole number of chunks before the step, so a
step never seals). Each row: ms (median, p10/p90), the K+V bytes a step reads, scales included,
from the cache's ``attention_bytes`` counter, GB/s and its fraction of the paired probe,
``vs_fp16`` (our fp16 time / this cache's time), onnxruntime's time with the cache of the same
bit width and ``speedup`` (its time / ours), and each output's max |difference| from our fp32
cache's. ``--quick``: 1k and 4k, batch 1; ``--target``: 16k and 32k, batch 1 and 4, where the
issue's targets are checked (int8 >= 1.7x / int4 >= 2.8x over fp16 on the AVX-512 path, 1.5x /
2.2x on AVX2, onnxruntime/ours >= 1.5). JSON: ``benchmarks/results/decode-quant-<UTC>.json``.

    python benchmarks/bench_decode.py --quant --target --threads 1 2
"""

from __future__ import annotations

import argparse
import gc
import os
import re
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

@dataclass(frozen=True)
class OrtQuant:
    """onnxruntime's quantized GroupQueryAttention cache (CPU contract of onnxruntime 1.32).

    ``bits`` 8: ``int8`` past/present, ``x = scale * q``, ``q`` in [-128, 127]. ``bits`` 4:
    ``uint8`` past/present of ``head_dim / 2`` bytes per row, two signed 4-bit values per byte
    stored with an offset of 8 (element ``2i`` in the low nibble, ``2i + 1`` in the high one),
    ``x = scale * (nibble - 8)``. The scales are static inputs (``k_scale`` / ``v_scale``,
    float32): ``PER_TENSOR`` one value (shape ``[1]``), ``PER_CHANNEL`` one per KV head and
    channel (shape ``[1, kv_heads, 1, head_dim]``), calibrated offline (:func:`ort_scales`).
    New tokens are quantized with those scales when the op writes them, and attention reads them
    back quantized."""

    bits: int  # 8 or 4
    kind: str = "PER_CHANNEL"  # or "PER_TENSOR", for K and V alike

    @property
    def qmax(self) -> int:
        """The largest quantized magnitude a scale maps ``max |x|`` to (127 or 7)."""
        return 127 if self.bits == 8 else 7

    @property
    def np_dtype(self) -> Any:
        """The numpy dtype of the past/present buffers (int8 or uint8)."""
        return np.int8 if self.bits == 8 else np.uint8

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one stored row (the last axis of past/present)."""
        return head_dim if self.bits == 8 else head_dim // 2


def ort_scales(x: np.ndarray, quant: OrtQuant) -> np.ndarray:
    """Static scales for onnxruntime's quantized cache calibrated on ``x``
    (``[batch, kv_heads, seq, head_dim]``): ``max |x| / qmax`` over the whole tensor
    (``PER_TENSOR``, shape ``[1]``) or per KV head and channel (``PER_CHANNEL``,
    ``[1, kv_heads, 1, head_dim]``); zeros become 1 so that no scale divides by 0."""
    a = np.abs(np.asarray(x, np.float32))
    m = a.max(keepdims=True).reshape(1) if quant.kind == "PER_TENSOR" else a.max(axis=(0, 2), keepdims=True)
    m = m / quant.qmax
    return np.where(m > 0, m, 1.0).astype(np.float32)


def ort_quantize(x: np.ndarray, scale: np.ndarray, quant: OrtQuant) -> np.ndarray:
    """``x`` (``[..., head_dim]``, float) in onnxruntime's quantized cache format (see
    :class:`OrtQuant`): round to nearest even, clamp to the format's range."""
    q = np.rint(np.asarray(x, np.float32) / scale)
    if quant.bits == 8:
        return np.clip(q, -128, 127).astype(np.int8)
    u = (np.clip(q, -8, 7) + 8).astype(np.uint8)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def ort_dequantize(q: np.ndarray, scale: np.ndarray, quant: OrtQuant) -> np.ndarray:
    """The float32 values onnxruntime's quantized cache ``q`` stands for (inverse of
    :func:`ort_quantize` up to rounding)."""
    if quant.bits == 8:
        return q.astype(np.float32) * scale
    x = np.empty(q.shape[:-1] + (2 * q.shape[-1],), np.float32)
    x[..., 0::2] = (q & 15).astype(np.float32) - 8
    x[..., 1::2] = (q >> 4).astype(np.float32) - 8
    return x * scale


def gqa_model(c: Case, capacity: int, quant: Optional[OrtQuant] = None) -> bytes:
    """The one-node ``com.microsoft.GroupQueryAttention`` decode model of case ``c`` whose
    past/present hold ``capacity`` positions: float caches of ``c.dtype``, or with ``quant`` the
    quantized cache (queries and new K/V stay ``c.dtype``; ``k_scale``/``v_scale`` inputs)."""
    from onnx import TensorProto, helper

    dt = TensorProto.FLOAT16 if c.dtype == "float16" else TensorProto.FLOAT
    d = c.head_dim
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    attrs: Dict[str, Any] = {}
    cache_dt, row = dt, d
    if quant is not None:
        names += ["", "", "", "", "", "k_scale", "v_scale"]
        attrs = {"k_quant_type": quant.kind, "v_quant_type": quant.kind, "kv_cache_bit_width": quant.bits}
        cache_dt = TensorProto.INT8 if quant.bits == 8 else TensorProto.UINT8
        row = quant.row_bytes(d)
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=c.q_heads, kv_num_heads=c.kv_heads, **attrs)
    inputs = [
        helper.make_tensor_value_info("query", dt, [c.batch, 1, c.q_heads * d]),
        helper.make_tensor_value_info("key", dt, [c.batch, 1, c.kv_heads * d]),
        helper.make_tensor_value_info("value", dt, [c.batch, 1, c.kv_heads * d]),
        helper.make_tensor_value_info("past_key", cache_dt, [c.batch, c.kv_heads, capacity, row]),
        helper.make_tensor_value_info("past_value", cache_dt, [c.batch, c.kv_heads, capacity, row]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [c.batch]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    if quant is not None:
        shape = [1] if quant.kind == "PER_TENSOR" else [1, c.kv_heads, 1, d]
        inputs += [helper.make_tensor_value_info("k_scale", TensorProto.FLOAT, shape),
                   helper.make_tensor_value_info("v_scale", TensorProto.FLOAT, shape)]
    outputs = [
        helper.make_tensor_value_info("output", dt, [c.batch, 1, c.q_heads * d]),
        helper.make_tensor_value_info("present_key", cache_dt, [c.batch, c.kv_heads, capacity, row]),
        helper.make_tensor_value_info("present_value", cache_dt, [c.batch, c.kv_heads, capacity, row]),
    ]
    graph = helper.make_graph([node], "gqa_decode", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


class OrtStep:
    """One GQA decode step over a shared past/present buffer bound through IOBinding.

    ``past_k``/``past_v``: the shared ``[B, kv_heads, capacity, row]`` buffers (float, or in
    ``quant``'s format with the static ``scales`` ``(k_scale, v_scale)``); ``q``/``k``/``v``: the
    step's query and new K/V in onnxruntime's ``[B, 1, heads * head_dim]`` layout."""

    def __init__(self, c: Case, past_k: np.ndarray, past_v: np.ndarray, q: np.ndarray, k: np.ndarray,
                 v: np.ndarray, quant: Optional[OrtQuant] = None,
                 scales: Optional[tuple] = None):
        from onnx_light_kv._optional import require

        ort = require("onnxruntime")  # ImportError naming the 'ort' extra when missing

        so = _common.ort_session_options(ort, c.threads)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(gqa_model(c, past_k.shape[2], quant), so,
                                         providers=["CPUExecutionProvider"])
        ov = ort.OrtValue.ortvalue_from_numpy
        self.kbuf, self.vbuf = ov(past_k), ov(past_v)  # the shared buffers (share numpy memory)
        self.np_k, self.np_v = past_k, past_v
        self.quant, self.scales = quant, scales
        self.inputs = {"query": ov(q), "key": ov(k), "value": ov(v),
                       "seqlens_k": ov(np.full(c.batch, c.context - 1, np.int32)),
                       "total_sequence_length": ov(np.array(c.context, np.int32))}
        if quant is not None:
            if scales is None:
                raise ValueError("a quantized cache needs its (k_scale, v_scale)")
            self.inputs["k_scale"], self.inputs["v_scale"] = ov(scales[0]), ov(scales[1])
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
        (quantized with the static scale for a quantized cache) and the buffer is still the numpy
        memory we bound."""
        new = k.reshape(c.batch, c.kv_heads, c.head_dim)
        if self.quant is not None:
            assert self.scales is not None
            new = ort_quantize(new[:, :, None, :], self.scales[0], self.quant)[:, :, 0]
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


# ---------------------------------------------------------------- quantized caches (--quant)

@dataclass(frozen=True)
class CacheVariant:
    """One of our caches in a ``--quant`` case: a native cache (``quant`` "none") or a quantized
    one whose last ``residual`` tokens stay in ``dtype``."""

    dtype: str
    quant: str = "none"  # "none", "int8" or "int4"
    residual: int = 0
    group: int = 32
    k_axis: str = "channel"

    @property
    def name(self) -> str:
        """Short row label: ``fp32``, ``fp16``, ``bf16``, ``int8 r0``, ``int4 r128``, ... (with
        `` g64`` appended for a group other than 32)."""
        if self.quant == "none":
            return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[self.dtype]
        return f"{self.quant} r{self.residual}" + ("" if self.group == 32 else f" g{self.group}")

    def options(self) -> Dict[str, Any]:
        """The ``KVCache`` keyword options of the variant."""
        opts: Dict[str, Any] = {"dtype": self.dtype}
        if self.quant != "none":
            opts.update(quant=self.quant, quant_group=self.group, k_axis=self.k_axis, residual=self.residual)
        return opts

    def ort(self, kind: str) -> Optional[OrtQuant]:
        """onnxruntime's cache of the same bit width (None for a native cache)."""
        return None if self.quant == "none" else OrtQuant(8 if self.quant == "int8" else 4, kind)


def quant_variants(groups: List[int], k_axis: str, qdtype: str, names: Optional[List[str]] = None) -> List[CacheVariant]:
    """The ``--quant`` caches: fp32, fp16, bf16, then int8 and int4 with residual 0 and 128
    (native type ``qdtype``) for each quantization group of ``groups``, or those of ``names``
    (ValueError naming the known ones when one is unknown)."""
    vs = [CacheVariant("float32"), CacheVariant("float16"), CacheVariant("bfloat16")]
    vs += [CacheVariant(qdtype, q, r, g, k_axis) for g in groups for q in ("int8", "int4") for r in (0, 128)]
    if names:
        known = {v.name: v for v in vs}
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"unknown variants {missing}; known: {list(known)}")
        vs = [known[n] for n in names]
    return vs


def quant_grid(quick: bool, target: bool, contexts: Optional[List[int]], threads: List[int],
               batches: Optional[List[int]], heads: List[tuple], head_dims: List[int]) -> List[Case]:
    """The ``--quant`` geometries (``Case.dtype`` unused). Contexts are nominal + 1 tokens after
    the step: the cache holds a multiple of the group before it, so the step's append never
    completes a chunk (sealing is amortized over ``group`` steps, not part of one)."""
    ctx = contexts or ([1024, 4096] if quick else [16384, 32768] if target else [1024, 4096, 16384, 32768])
    bs = batches or ([1] if quick else [1, 4])
    return [Case(t, "float32", b, hq, hkv, d, L + 1) for t in threads for b in bs for hq, hkv in heads
            for d in head_dims for L in ctx]


def run_quant_case(c: Case, variants: List[CacheVariant], kernels: List[tuple], repeat: int, warmup: int,
                   rng: np.random.Generator, ort_kind: str = "PER_CHANNEL") -> Dict[str, Any]:
    """One ``--quant`` geometry: every variant's step on every kernel path, onnxruntime's int8 and
    int4 GroupQueryAttention (shared IOBinding buffer, static per-channel scales calibrated on the
    past) and the paired probe, in alternating blocks. Our step as in :func:`run_case` (append,
    attention into ``out``, truncate back); the K+V bytes a step reads, scales included, come from
    the cache's ``attention_bytes`` counter."""
    import onnx_light_kv as olkv

    olkv.set_kernel("auto")
    L, d = c.context, c.head_dim
    past_k = rng.standard_normal((c.batch, c.kv_heads, L - 1, d), np.float32)
    past_v = rng.standard_normal((c.batch, c.kv_heads, L - 1, d), np.float32)
    q = rng.standard_normal((c.batch, c.q_heads, 1, d), np.float32)
    k = rng.standard_normal((c.batch, c.kv_heads, 1, d), np.float32)
    v = rng.standard_normal((c.batch, c.kv_heads, 1, d), np.float32)
    olkv.set_threads(c.threads)
    fns: Dict[str, Any] = {}
    notes: Dict[str, str] = {}
    caches: Dict[str, Any] = {}
    outs: Dict[str, np.ndarray] = {}
    read: Dict[str, float] = {}
    for var in variants:
        try:
            cache = olkv.KVCache(c.batch, c.kv_heads, d, capacity=L, **var.options())
            if L > 1:
                cache.append(past_k, past_v)
        except (TypeError, ValueError, NotImplementedError) as e:
            notes[var.name] = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        out = np.empty((c.batch, c.q_heads, 1, d), np.float32)

        def ours(cache: Any = cache, out: np.ndarray = out) -> None:
            cache.append(k, v)
            olkv.attention(q, cache, out=out)
            cache.truncate(L - 1)

        ours()
        cache.reset_counters()
        ours()
        ct = cache.counters
        read[var.name] = ct["attention_bytes"] / max(ct["attention_calls"], 1)
        caches[var.name], outs[var.name] = cache, out.copy()
        for _, path in kernels:
            fns[f"{var.name}:{path}"] = _common.on_kernel(path, ours)
    ref = outs.get("fp32")
    errs = {n: float(np.max(np.abs(o - ref))) for n, o in outs.items()} if ref is not None else {}
    ort_steps: Dict[str, OrtStep] = {}
    ort_info: Dict[str, Dict[str, Any]] = {}
    for qname in dict.fromkeys(v.quant for v in variants if v.quant != "none"):
        oq = next(v for v in variants if v.quant == qname).ort(ort_kind)
        assert oq is not None
        try:
            ks = ort_scales(np.concatenate([past_k, k], axis=2), oq)
            vs = ort_scales(np.concatenate([past_v, v], axis=2), oq)
            pk = np.zeros((c.batch, c.kv_heads, L, oq.row_bytes(d)), oq.np_dtype)
            pv = np.zeros_like(pk)
            pk[:, :, :L - 1] = ort_quantize(past_k, ks, oq)
            pv[:, :, :L - 1] = ort_quantize(past_v, vs, oq)
            k_ort = np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.kv_heads * d))
            v_ort = np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.kv_heads * d))
            q_ort = np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(c.batch, 1, c.q_heads * d))
            step = OrtStep(c, pk, pv, q_ort, k_ort, v_ort, oq, (ks, vs))
            step()
            if not step.shares_buffer(c, k_ort):
                notes[f"ort {qname}"] = "ORT did not write into the shared buffer (silent copy): invalid comparator"
                continue
            info: Dict[str, Any] = {"kv_bytes": 2 * pk.nbytes}
            if ref is not None:
                got = step.out.numpy().reshape(c.batch, 1, c.q_heads, d).transpose(0, 2, 1, 3)
                info["max_abs_diff_vs_fp32"] = float(np.max(np.abs(got - ref)))
            ort_steps[qname], ort_info[qname] = step, info
            fns[f"ort {qname}"] = step
        except Exception as e:  # noqa: BLE001 - an unsupported ORT case is reported, not fatal
            notes[f"ort {qname}"] = f"onnxruntime failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    buf = probe_buffer()
    if buf is not None:
        fns["probe"] = _common.on_kernel("auto", lambda: olkv.stream_read(buf, c.threads))
    samples = blocked(fns, repeat=repeat, warmup=warmup) if fns else {}
    olkv.set_kernel("auto")
    paired: Dict[str, float] = {}
    if "probe" in samples:
        probe_gbps = [buf.nbytes / (ms * 1e6) for ms in samples.pop("probe")]
        paired = {"bw_paired_GBps": float(np.median(probe_gbps)),
                  "bw_paired_p10": float(np.percentile(probe_gbps, 10)),
                  "bw_paired_p90": float(np.percentile(probe_gbps, 90))}
        samples["probe_GBps"] = probe_gbps
    label = f"t{c.threads} b{c.batch} h{c.q_heads}/{c.kv_heads} d{c.head_dim}"
    rows: List[Dict[str, Any]] = []
    for _, path in kernels:
        fp16_ms = summarize(samples["fp16:" + path])["median"] if "fp16:" + path in samples else None
        for var in variants:
            key = f"{var.name}:{path}"
            r: Dict[str, Any] = {"case": label, "cache": var.name, "kernel": path, "context": L}
            s = summarize(samples[key]) if key in samples else None
            if s is None:
                r["note"] = notes.get(var.name, "not run")
            else:
                r.update({"ours_ms": s["median"], "ours_p10": s["p10"], "ours_p90": s["p90"],
                          "kv_read_MB": read[var.name] / 1e6,
                          "ours_GBps": read[var.name] / (s["median"] / 1e3) / 1e9, **paired})
                if paired:
                    r["bw_frac_paired"] = r["ours_GBps"] / paired["bw_paired_GBps"]
                if fp16_ms is not None:
                    r["vs_fp16"] = _common.speedup(s["median"], fp16_ms)
                if var.name in errs:
                    r["max_abs_diff_vs_fp32"] = errs[var.name]
            ok = f"ort {var.quant}"
            if ok in samples:
                so = summarize(samples[ok])
                r.update({"ort_ms": so["median"], "ort_p10": so["p10"], "ort_p90": so["p90"],
                          "ort_kv_MB": ort_info[var.quant]["kv_bytes"] / 1e6})
                if "max_abs_diff_vs_fp32" in ort_info[var.quant]:
                    r["ort_max_abs_diff_vs_fp32"] = ort_info[var.quant]["max_abs_diff_vs_fp32"]
                if s is not None:
                    r["speedup"] = _common.speedup(s["median"], so["median"])
            elif ok in notes:
                r["note"] = (r["note"] + "; " if "note" in r else "") + notes[ok]
            rows.append(r)
    counters = {n: dict(cch.counters) for n, cch in caches.items()}
    for cch in caches.values():
        cch.close()
    del ort_steps, caches, past_k, past_v
    gc.collect()
    return {"case": asdict(c), "variants": [asdict(v) for v in variants], "rows": rows, "samples": samples,
            "notes": notes, "cache_counters": counters, "ort": ort_info}


#: The decode step's targets (issue 11): onnxruntime's time over ours, GQA 32/8 d128, L >= 1k,
#: per cache type.
SPEEDUP_TARGETS = {"float32": 1.5, "float16": 2.0}

#: The targets of the quantized cache (issue 13) beyond the L3 at 16k and 32k tokens:
#: speed-up over our fp16 cache per kernel path, and onnxruntime's time over ours.
QUANT_TARGETS = {"avx512": {"int8": 1.7, "int4": 2.8}, "avx2": {"int8": 1.5, "int4": 2.2}}
ORT_QUANT_TARGET = 1.5


def quant_target_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """The target check of the ``--quant`` rows (L >= 16k, K+V of the fp32 cache beyond the LLC):
    worst speed-up over fp16 per format and path, worst onnxruntime/ours."""
    lines = []
    big = [r for r in rows if r["context"] > 16384 and "ours_ms" in r and r.get("beyond_llc")]
    def group(r: Dict[str, Any]) -> str:  # "" (group 32) or " g64" (see CacheVariant.name)
        m = re.search(r" g\d+$", r["cache"])
        return m.group(0) if m else ""

    for path in dict.fromkeys(r["kernel"] for r in big):
        for fmt, g in [(f, g) for g in dict.fromkeys(group(r) for r in big) for f in ("int8", "int4")]:
            rs = [r for r in big if r["kernel"] == path and r["cache"].startswith(fmt) and group(r) == g]
            want = QUANT_TARGETS.get(path, {}).get(fmt)
            if rs and want and all("vs_fp16" in r for r in rs):
                worst = min(r["vs_fp16"] for r in rs)
                lines.append(f"{path} {fmt}{g}: speed-up over our fp16 cache >= {want}: worst {worst:.2f}, median "
                             f"{np.median([r['vs_fp16'] for r in rs]):.2f} over {len(rs)} rows -> "
                             f"{'met' if worst >= want else 'NOT met'}")
            ro = [r for r in rs if "speedup" in r]
            if ro:
                worst = min(r["speedup"] for r in ro)
                lines.append(f"{path} {fmt}{g}: onnxruntime/ours >= {ORT_QUANT_TARGET}: worst {worst:.2f}, median "
                             f"{np.median([r['speedup'] for r in ro]):.2f} over {len(ro)} rows -> "
                             f"{'met' if worst >= ORT_QUANT_TARGET else 'NOT met'}")
    return lines


def main_quant(args: argparse.Namespace, kernels: List[tuple], bw: Dict[int, Dict[str, Any]], llc: int) -> int:
    """``--quant``: our fp32/fp16/bf16 caches and the int8/int4 ones side by side with
    onnxruntime's int8/int4 GroupQueryAttention; table, target check, JSON (and PNG)."""
    heads = list(args.heads or [(32, 8)])
    variants = quant_variants(args.quant_group, args.k_axis, args.quant_dtype, args.variants)
    repeat = args.repeat if args.repeat is not None else (10 if args.quick else 30)
    rng = np.random.default_rng(0)
    results, rows = [], []
    for c in _common.progress(quant_grid(args.quick, args.target, args.contexts, args.threads, args.batches,
                                         heads, args.head_dims or [128]), desc="cases"):
        if c.kv_bytes > args.max_gib * 2 ** 30:
            print(f"skip {c.label} L={c.context}: fp32 K+V {c.kv_bytes / 2**30:.1f} GiB > --max-gib")
            continue
        r = run_quant_case(c, variants, kernels, repeat, args.warmup, rng, args.ort_quant_kind)
        results.append(r)
        for row in r["rows"]:
            row["beyond_llc"] = c.kv_bytes > llc
            if "ours_GBps" in row:
                row["bw_frac"] = row["ours_GBps"] / bw[c.threads]["gbps"]
            rows.append(row)
            if "ours_ms" not in row:
                print(f"{row['case']:<20} {row['cache']:<9} {row['kernel']:<6} L={c.context:>6}"
                      + (f"  ort {row['ort_ms']:8.3f} ms" if "ort_ms" in row else "") + f"  [{row.get('note')}]")
                continue
            print(f"{row['case']:<20} {row['cache']:<9} {row['kernel']:<6} L={c.context:>6}  ours {row['ours_ms']:8.3f} ms"
                  + f"  {row['kv_read_MB']:8.2f} MB {row['ours_GBps']:6.1f} GB/s"
                  + (f" ({row['bw_frac_paired'] * 100:4.0f}% paired)" if "bw_frac_paired" in row else "")
                  + (f"  x{row['vs_fp16']:5.2f} vs fp16" if "vs_fp16" in row else "")
                  + (f"  ort {row['ort_ms']:8.3f} ms  ort/ours {row['speedup']:5.2f}" if "speedup" in row else "")
                  + (f"  [{row['note']}]" if "note" in row else ""), flush=True)
    if not results:
        raise ValueError(f"every case is larger than --max-gib={args.max_gib} GiB of K+V: nothing was measured")
    cols = ["case", "cache", "kernel", "context", "ours_ms", "ours_p10", "ours_p90", "kv_read_MB", "ours_GBps",
            "bw_frac_paired", "vs_fp16", "ort_ms", "ort_p10", "ort_p90", "speedup", "max_abs_diff_vs_fp32",
            "ort_max_abs_diff_vs_fp32", "note"]
    print()
    print(_common.isa_line())
    print(format_table(rows, [c for c in cols if any(c in r for r in rows)]))
    print(_common.SPEEDUP + "; vs_fp16 = our fp16 cache's time / this cache's time; speedup = onnxruntime's "
          "int8/int4 GroupQueryAttention time / ours")
    for line in quant_target_lines(rows):
        print(line)
    payload = {"benchmark": "decode-quant", "environment": environment(threads=max(args.threads)),
               "kernels_run": [p for _, p in kernels], "args": vars(args), "read_bandwidth": bw, "llc_bytes": llc,
               "variants": [asdict(v) for v in variants], "rows": rows, "results": results}
    path = write_json("decode-quant", payload, args.results_dir)
    print(f"\nraw samples: {path}")
    if not args.no_plot and any("ours_ms" in r for r in rows):
        series: Dict[str, Dict[str, List[float]]] = {}
        ratio: Dict[str, Any] = {}
        plotted = kernels[-1][1]  # one path per plot (the last one named), or it is unreadable
        for r in rows:
            if "ours_ms" not in r or r["kernel"] != plotted:
                continue
            s = series.setdefault(f"{r['cache']} {r['kernel']} {r['case']}", {"x": [], "median": [], "p10": [], "p90": []})
            s["x"].append(r["context"])
            for key, col in (("median", "ours_ms"), ("p10", "ours_p10"), ("p90", "ours_p90")):
                s[key].append(r[col])
            if "vs_fp16" in r and r["cache"] not in ("fp16",):
                x, vals = ratio.setdefault(f"{r['cache']} {r['kernel']} {r['case']}", ([], []))
                x.append(r["context"])
                vals.append(r["vs_fp16"])
        png = plot_series(path[:-5] + ".png", series, "context (tokens)", "decode step (ms)",
                          title=f"decode step ({plotted}): quantized vs native caches (lower panel: x over fp16)",
                          logy=True, ratio=ratio)
        print(f"plot: {png}")
    return 0


# ---------------------------------------------------------------- main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fp32 GQA 32/8 d128 batch 1, contexts 256..16k")
    ap.add_argument("--target", action="store_true",
                    help="only the target: fp32 GQA 32/8 d128, batch 1 and 4, contexts 1k..32k")
    ap.add_argument("--threads", type=_common.threads_arg, nargs="+", default=[1, 2])
    ap.add_argument("--contexts", type=_common.positive_int, nargs="+", default=None)
    ap.add_argument("--repeat", type=_common.positive_int, default=None,
                    help="timed samples per side (default 40, quick 25; --quant 30, quick 10)")
    ap.add_argument("--warmup", type=_common.nonneg_int, default=3)
    ap.add_argument("--max-gib", type=_common.positive_float, default=2.0,
                    help="skip cases whose K+V exceed this many GiB per side (RAM guard)")
    ap.add_argument("--kernel", nargs="+", default=["auto"], choices=_common.KERNEL_CHOICES,
                    help="attention kernel paths to run side by side (default: auto, the best one)")
    ap.add_argument("--dtypes", nargs="+", choices=["float32", "float16", "bfloat16"], default=None,
                    help="with --heads/--head-dims/--batches: replace the preset grid by the cross product")
    ap.add_argument("--heads", type=_common.heads, nargs="+", default=None,
                    help="q_heads/kv_heads pairs, e.g. 32/8 32/32 (q a multiple of kv)")
    ap.add_argument("--head-dims", type=_common.positive_int, nargs="+", default=None)
    ap.add_argument("--batches", type=_common.positive_int, nargs="+", default=None)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--layout", nargs="+", choices=["contiguous", "paged"], default=["contiguous"],
                    help="cache layouts to time side by side (contiguous is always the reference)")
    ap.add_argument("--block-size", type=_common.block_size, default=None,
                    help="paged layout block size, one of the library's (16 32 64 128 256; default: the library's)")
    ap.add_argument("--quant", action="store_true",
                    help="quantized caches: fp32/fp16/bf16 vs int8/int4 (residual 0 and 128) and onnxruntime's "
                         "int8/int4 GroupQueryAttention (--quick: 1k/4k batch 1; --target: 16k/32k)")
    ap.add_argument("--variants", nargs="+", default=None,
                    help="--quant: the caches to run (fp32 fp16 bf16 'int8 r0' 'int8 r128' 'int4 r0' 'int4 r128')")
    ap.add_argument("--quant-group", type=int, nargs="+", choices=[32, 64], default=[32],
                    help="--quant: tokens per sealed chunk, 32 and/or 64 (one row set each; group 64 rows "
                         "are labelled 'int8 r128 g64')")
    ap.add_argument("--k-axis", choices=["channel", "token"], default="channel", help="--quant: K scale axis")
    ap.add_argument("--quant-dtype", choices=["float32", "float16", "bfloat16"], default="float16",
                    help="--quant: native type of the quantized caches' residual window")
    ap.add_argument("--ort-quant-kind", choices=["PER_CHANNEL", "PER_TENSOR"], default="PER_CHANNEL",
                    help="--quant: onnxruntime's static scale kind (k_quant_type / v_quant_type)")
    ap.add_argument("--llc-mib", type=_common.positive_float, default=None,
                    help="the last-level cache size the 'beyond the LLC' rows are judged against (default: the "
                         "L3 the OS reports; a virtual machine may report the host socket's whole L3, far more "
                         "than its cores get: measure the knee with read_bandwidth(mib) and pass it here)")
    _common.add_results_dir(ap)
    args = ap.parse_args(argv)
    if args.quick and args.target:
        ap.error("--quick and --target pick different grids: give one")
    for name in ("variants", "quant_group", "k_axis", "quant_dtype", "ort_quant_kind"):
        if not args.quant and getattr(args, name) != ap.get_default(name):
            ap.error(f"--{name.replace('_', '-')} only takes effect with --quant")
    if args.quant and args.variants:
        try:
            quant_variants(args.quant_group, args.k_axis, args.quant_dtype, args.variants)
        except ValueError as e:
            ap.error(f"argument --variants: {e}")
    custom = None
    if (args.dtypes or args.heads or args.head_dims or args.batches) and not args.quant:
        heads = list(args.heads or [(32, 8)])
        custom = [(dt, b, hq, hkv, d) for dt in (args.dtypes or ["float32"]) for hq, hkv in heads
                  for d in (args.head_dims or [128]) for b in (args.batches or [1])]

    import onnx_light_kv as olkv

    repeat = args.repeat if args.repeat is not None else (25 if args.quick else 40)
    build = olkv.build_info()
    llc_os = int(build.get("cache_bytes", {}).get("l3", 32 << 20) or (32 << 20))
    llc = int(args.llc_mib * 2 ** 20) if args.llc_mib else llc_os
    bw = {t: read_bandwidth(t) for t in sorted(set(args.threads))}
    for t, b in bw.items():
        print(f"streaming read, {t} thread(s): {b['gbps']:.1f} GB/s ({b['method']})")
    kernels = _common.kernel_runs(args.kernel, required=True)  # exit status 2 when none is available
    print(_common.isa_line())
    print(f"kernel paths run: {', '.join(p for _, p in kernels)}  LLC: {llc / 2**20:.0f} MiB"
          + (f" (--llc-mib; the OS reports {llc_os / 2**20:.0f} MiB)" if llc != llc_os else "")
          + " (bandwidth probes read with the best path)")
    if llc == llc_os and llc_os > 256 << 20:
        print(f"note: the OS reports a {llc_os / 2**20:.0f} MiB L3; on a virtual machine that is often the host "
              "socket's, and no row may count as beyond it: pass --llc-mib with the measured knee")

    if args.quant:
        return main_quant(args, kernels, bw, llc)

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
    if not results:
        raise ValueError(f"every case is larger than --max-gib={args.max_gib} GiB of K+V: nothing was measured")

    cols = ["case", "kernel", "context", "kv_MB", "ours_ms", "ours_p10", "ours_p90", "ort_ms", "ort_p10", "ort_p90",
            "speedup", "ours_GBps", "bw_frac", "bw_paired_GBps", "bw_frac_paired", "beyond_llc",
            "paged_ms", "paged_ratio", "note"]
    print()
    print(_common.isa_line())
    print(format_table(rows, [c for c in cols if any(c in r for r in rows)]))
    print(_common.SPEEDUP)

    # Target check: GQA 32/8 d128, contexts >= 1k, 1 and 2 threads: onnxruntime/ours >= 1.5 for
    # float32 and >= 2 for float16.
    for _, path in kernels:
        for dtype, goal in SPEEDUP_TARGETS.items():
            tgt = [r for r, rc in zip(rows, row_cases)
                   if r["kernel"] == path and rc["dtype"] == dtype and rc["q_heads"] == 32 and rc["kv_heads"] == 8
                   and rc["head_dim"] == 128 and rc["context"] >= 1024 and "speedup" in r]
            if tgt:
                worst = min(r["speedup"] for r in tgt)
                print(f"\n{path}: target speed-up >= {goal:g} ({dtype} GQA 32/8 d128, L >= 1k): worst {worst:.2f} "
                      f"over {len(tgt)} cases -> {'met' if worst >= goal else 'NOT met'}")
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
        print("\nfraction of the streaming-read bandwidth where K+V > LLC (target 85% float32, 70% float16 "
              "and bfloat16), min / median:")
        for label, rs in by_cfg.items():
            parts = [f"{what} {min(r[key] for r in rs) * 100:.0f}% / {np.median([r[key] for r in rs]) * 100:.0f}%"
                     for key, what in (("bw_frac", "start probe"), ("bw_frac_paired", "paired probe"))
                     if all(key in r for r in rs)]
            print(f"  {label:<35} " + ", ".join(parts))

    payload = {"benchmark": "decode", "environment": environment(threads=max(args.threads)),
               "kernels_run": [p for _, p in kernels], "args": vars(args), "read_bandwidth": bw, "llc_bytes": llc, "rows": rows, "results": results}
    path = write_json("decode", payload, args.results_dir)
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
    sys.exit(_common.run_main(main))
