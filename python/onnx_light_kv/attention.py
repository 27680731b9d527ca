"""Decode attention over a KVCache, and kernel settings."""

from __future__ import annotations

import logging

from typing import Any, Optional

import numpy as np

from . import _lib
from ._errors import convert
from .cache import KVCache

__all__ = ["attention", "set_threads", "get_threads", "set_kernel"]

_F32 = np.dtype(np.float32)
_attn = _lib.fn("Attention")
_addr = _lib.addr


def _prep_q(q: Any) -> np.ndarray:
    a = np.asarray(q)
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        raise TypeError(f"q must be a floating-point array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


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
            float dtypes and non-contiguous arrays are converted). ``q_heads``
            must be a multiple of the cache's ``kv_heads`` (GQA/MQA: query
            head ``h`` reads KV head ``h // (q_heads // kv_heads)``).
        cache: the :class:`KVCache`; its last ``q_len`` tokens of each
            sequence must be the keys/values of these queries (append first).
        scale: factor on q.k; default ``1/sqrt(head_dim)``.
        softcap: if > 0, scores become ``softcap * tanh(score / softcap)``.
        window: if set, each query sees only its last ``window`` positions.
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
        TypeError: non-float q. ValueError: shape mismatch, a sequence shorter
        than ``q_len``, ``q_heads`` not a multiple of ``kv_heads``, bad window.
    """
    if type(q) is not np.ndarray or q.dtype is not _F32 or not q.flags.c_contiguous:
        q = _prep_q(q)
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D [batch, q_heads, q_len, head_dim], got shape {q.shape}")
    b, hq, lq, d = q.shape
    if b != cache._batch or d != cache._dk:
        raise ValueError(f"q shape {q.shape} does not match the cache (batch={cache._batch}, head_dim={cache._dk})")
    dest = None
    if out is None:
        out = np.empty((b, hq, lq, cache._dv), dtype=_F32)
    else:
        if (type(out) is not np.ndarray or out.dtype != _F32 or not out.flags.c_contiguous
                or not out.flags.writeable or out.shape != (b, hq, lq, cache._dv)):
            raise ValueError(f"out must be a writeable C-contiguous float32 array of shape {(b, hq, lq, cache._dv)}")
        if (out.ctypes.data != q.ctypes.data or out.nbytes != q.nbytes) and np.shares_memory(out, q):
            dest, out = out, np.empty_like(out)  # partial overlap: compute through a temporary
    if kernel not in ("auto", "reference"):
        raise ValueError(f"kernel must be 'auto' or 'reference', got {kernel!r}")
    if window is not None and window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    try:
        _attn(cache._h, _addr(q), q.size, _addr(out), out.size, hq, lq,
              0.0 if scale is None else float(scale), float(softcap), window or 0, kernel == "reference")
    except RuntimeError as e:
        raise convert(e) from None
    if dest is not None:
        dest[...] = out
        return dest
    return out


def set_threads(n: Optional[int] = None) -> None:
    """Set the kernel worker threads (None or <= 0: one per CPU).

    Raises:
        ValueError: ``n`` > 1024.
    """
    _lib.call(_lib.fn("SetThreads"), 0 if n is None else int(n))


def get_threads() -> int:
    """Number of kernel worker threads."""
    return int(_lib.fn("Threads")())


def set_kernel(name: str) -> None:
    """Force the attention kernel path: "auto", "go", "avx2" or "avx512"
    (ValueError if the CPU or build lacks it). The OLKV_KERNEL environment
    variable does the same at start-up."""
    _lib.call(_lib.fn("SetKernel"), name)
    logging.getLogger("onnx_light_kv").info("attention kernel path set to %s", name)
