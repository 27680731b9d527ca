"""Decode attention over a KVCache, and kernel settings."""

from __future__ import annotations

import logging

from typing import Any, Optional

import numpy as np

from . import _lib
from ._errors import convert
from .cache import KVCache
from ._validate import FLOAT32_MAX, choice, instance, optional_integer, real

__all__ = ["attention", "set_threads", "get_threads", "set_kernel", "set_quant_int_loops", "get_quant_int_loops"]

_F32 = np.dtype(np.float32)
_attn = _lib.fn("Attention")
_addr = _lib.addr


def _prep_q(q: Any) -> np.ndarray:
    a = np.asarray(q)
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        raise TypeError(f"q must be a floating-point array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _bad_out(out: Any, shape: tuple[int, int, int, int]) -> Exception:
    """The error for an ``out`` that :func:`attention` cannot write into, naming
    the first requirement it misses."""
    if not isinstance(out, np.ndarray):
        return TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if type(out) is not np.ndarray:
        # the kernel writes the raw buffer; a subclass (masked array, matrix...)
        # might attach meaning to it that the result would not honour
        return TypeError(f"out must be a numpy.ndarray itself, not a subclass (got {type(out).__name__}); "
                         f"pass out.view(np.ndarray) to write into its memory")
    want = f"float32 array of shape {shape}"
    if out.dtype != _F32:
        return ValueError(f"out must be a {want}, got dtype {out.dtype}")
    if out.shape != shape:
        return ValueError(f"out must be a {want}, got shape {out.shape}")
    if not out.flags.c_contiguous:
        return ValueError(f"out must be C-contiguous (a {want}), got a non-contiguous array")
    return ValueError(f"out must be writeable (a {want}), got a read-only array")


def attention(
    q: Any,
    cache: KVCache,
    scale: Optional[float] = None,
    softcap: float = 0.0,
    window: Optional[int] = None,
    *,
    kernel: str = "auto",
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Attention of new queries over everything in ``cache``.

    Args:
        q: ``[batch, q_heads, q_len, head_dim]`` queries (float32; other
            float dtypes and non-contiguous arrays are converted), any
            ``q_len >= 1`` (a decode step, a draft to verify or a whole
            prompt: beyond 16 tokens the kernel runs on tiles of 16 query
            rows, each reading the cache once for all of them). ``q_heads``
            must be a multiple of the cache's ``kv_heads`` (GQA/MQA: query
            head ``h`` reads KV head ``h // (q_heads // kv_heads)``).
        cache: the :class:`KVCache`; its last ``q_len`` tokens of each
            sequence must be the keys/values of these queries (append first).
        scale: factor on q.k, a finite positive float32 value; default
            ``1/sqrt(head_dim)``.
        softcap: if > 0, scores become ``softcap * tanh(score / softcap)``
            (finite, >= 0; 0 disables it).
        window: if set, each query sees only its last ``window`` positions
            (an integer >= 1).
        kernel: "auto" (the streaming SIMD kernel) or "reference" (the plain
            oracle implementation, for tests).
        out: optional float32 C-contiguous output ``[batch, q_heads, q_len,
            head_dim_v]`` to write into (saves an allocation per step). It
            may be ``q`` itself (computed in place). If it partially
            overlaps ``q`` (views into one buffer that are not the same
            array memory), the result is computed into a temporary and then
            copied into ``out``, so it is always correct; that case costs
            one allocation.

    Causal alignment is to the end of the cache: query row ``i`` of
    sequence ``b`` sits at position ``len_b - q_len + i`` and attends keys
    ``0..len_b - q_len + i``. The cache is never exported or gathered.

    Returns:
        float32 ``[batch, q_heads, q_len, head_dim_v]``.

    Raises:
        TypeError: non-float q, ``cache`` not a KVCache, ``out`` not a numpy
            array or an ndarray subclass (pass ``out.view(np.ndarray)``),
            non-number ``scale``/``softcap``, non-integer ``window``,
            non-str ``kernel``.
        ValueError: shape mismatch, a sequence shorter than ``q_len``,
            ``q_heads`` not a multiple of ``kv_heads``, ``window`` < 1,
            non-finite or out-of-float32-range ``scale``/``softcap``, a
            ``scale`` that is 0 or negative (or rounds to 0 in float32),
            negative ``softcap`` or a positive one that rounds to 0 in float32, an unknown ``kernel``, an ``out`` of
            another dtype or shape, not C-contiguous or read-only.
    """
    instance(cache, "cache", KVCache)
    if type(q) is not np.ndarray or q.dtype is not _F32 or not q.flags.c_contiguous:
        q = _prep_q(q)
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D [batch, q_heads, q_len, head_dim], got shape {q.shape}")
    b, hq, lq, d = q.shape
    if b != cache._batch or d != cache._dk:
        raise ValueError(f"q shape {q.shape} does not match the cache (batch={cache._batch}, head_dim={cache._dk})")
    sc = 0.0 if scale is None else real(scale, "scale", float32=True)
    if scale is not None and not np.float32(sc) > 0:
        # The kernel reads 0 as "the default"; a scale that is 0 in float32
        # must not silently become 1/sqrt(head_dim).
        raise ValueError(f"scale must be > 0 (and nonzero in float32), got {scale!r}")
    cap = real(softcap, "softcap", lo=0.0, hi=FLOAT32_MAX)
    if cap > 0 and not np.float32(cap) > 0:
        # 0 means "no softcap" to the kernel: a positive one that rounds to 0 would vanish
        raise ValueError(f"softcap must be 0 (off) or nonzero in float32, got {softcap!r}")
    win = optional_integer(window, "window", lo=1) or 0
    reference = choice(kernel, "kernel", ("auto", "reference")) == "reference"
    dest = None
    if out is None:
        out = np.empty((b, hq, lq, cache._dv), dtype=_F32)
    else:
        if (type(out) is not np.ndarray or out.dtype != _F32 or not out.flags.c_contiguous
                or not out.flags.writeable or out.shape != (b, hq, lq, cache._dv)):
            raise _bad_out(out, (b, hq, lq, cache._dv))
        if (out.ctypes.data != q.ctypes.data or out.nbytes != q.nbytes) and np.shares_memory(out, q):
            dest, out = out, np.empty_like(out)  # partial overlap: compute through a temporary
    _lib.check_process()
    try:
        _attn(cache._h, _addr(q), q.size, _addr(out), out.size, hq, lq, sc, cap, win, reference)
    except RuntimeError as e:
        raise convert(e) from None
    if dest is not None:
        dest[...] = out
        return dest
    return out


def set_threads(n: Optional[int] = None) -> None:
    """Set the kernel worker threads (None or <= 0: one per CPU).

    Attention and the matrix kernels (InferenceSession's products) share one
    pool of worker threads; this bounds both.

    Raises:
        TypeError: ``n`` is not an integer (``1.5``, ``"2"``, ``True``).
        ValueError: ``n`` > 1024.
    """
    _lib.call(_lib.fn("SetThreads"), optional_integer(n, "n", hi=1024) or 0)


def get_threads() -> int:
    """Number of kernel worker threads."""
    return int(_lib.call(_lib.fn("Threads")))


KERNEL_PATHS = ("auto", "go", "avx2", "avx512")
"""The names :func:`set_kernel` accepts."""


def set_kernel(name: str) -> None:
    """Force the attention kernel path: "auto", "go", "avx2" or "avx512"
    (case and surrounding blanks are ignored). The matrix kernels (MatMul,
    Gemm) switch to the same instruction set (``build_info()["gemm_kernel"]``).
    The OLKV_KERNEL environment variable does the same at start-up
    (OLKV_GEMM, when set, overrides it for the matrix kernels).

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: another name (``""`` included), or a path the CPU or
            build lacks.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    _lib.call(_lib.fn("SetKernel"), choice(key, "name", KERNEL_PATHS))
    logging.getLogger("onnx_light_kv").info("attention kernel path set to %s", name)


def set_quant_int_loops(scores: bool = True, accumulate: bool = True) -> None:
    """Choose the integer loops of the int8/int4 cache's decode kernel (AVX2,
    and AVX-512 with VNNI; other paths have none and ignore this). Both are on
    by default; turning them off gives the float loops, whose results equal
    the reference kernel over the dequantized rows up to float32 rounding.

    ``scores``: the score loop over int8 and int4 K per channel rounds each
    query row times the chunk's channel scales to int16 (steps of 1/32767 of
    the row's largest element) and takes integer dot products: a quantized
    decode step about 1.1-1.4x faster. With K channels whose scales are 30
    times the others' (outliers, common in trained models) the attention
    output erred by 1.7e-3 (int8) and 2.6e-3 (int4) against the reference,
    6.5% and 1% of the quantization's own error against float32 there. It
    takes head dims that are a multiple of 64 (128 for int4) up to 256;
    chunks whose K channel scales spread wider (one channel with a large
    offset) take the float loop.

    ``accumulate``: the V accumulation rounds the softmax weights times the V
    scales to int16 (steps of 1/16383 of a chunk's largest), an output error
    of about 1e-4 of the weights' sum times the largest V value. A chunk whose
    V scale groups lie more than 32 times apart, or whose values are too small
    for such steps (below about 1e-30), is accumulated in float instead.

    The ``OLKV_QUANT_INT_DOTS`` environment variable sets them at start-up:
    ``0`` none, anything else (or unset) both. ``build_info()["quant_int_loops"]``
    reports the setting.

    Raises:
        TypeError: an argument is not a bool.
    """
    _lib.call(_lib.fn("SetQuantIntLoops"), instance(scores, "scores", bool), instance(accumulate, "accumulate", bool))


def get_quant_int_loops() -> tuple[bool, bool]:
    """The integer loops that are on, ``(scores, accumulate)``; see
    :func:`set_quant_int_loops`."""
    n = int(_lib.call(_lib.fn("QuantIntLoops")))
    return bool(n & 1), bool(n & 2)
