"""Kernel-side probes: the machine's streaming-read bandwidth.

Decode attention over a cache larger than the last-level cache cannot beat
the rate at which the cores stream memory; benchmarks report the kernel's
effective K+V bandwidth as a fraction of this measurement.
"""

from __future__ import annotations

import numpy as np

from . import _lib
from ._validate import integer

__all__ = ["read_bandwidth", "stream_read"]


def read_bandwidth(mib: int = 1024, threads: int = 1, iters: int = 5) -> float:
    """Best-of-``iters`` streaming-read bandwidth in GB/s (1e9 bytes/s) of a
    ``mib`` MiB buffer read by ``threads`` threads with the active SIMD path.

    Allocates the buffer for the duration of the call; use a size well above
    the L3 (the default 1 GiB) to measure DRAM.

    Raises:
        TypeError: a non-integer argument.
        ValueError: ``mib`` < 1 or more than the memory available,
            ``threads`` outside 1..1024, or ``iters`` < 1.
        MemoryError: the buffer cannot be mapped.
    """
    return float(_lib.call(_lib.fn("ReadBandwidth"), integer(mib, "mib", lo=1),
                           integer(threads, "threads", lo=1, hi=1024), integer(iters, "iters", lo=1)))


def stream_read(buf: np.ndarray, threads: int = 1) -> float:
    """Read ``buf`` once with ``threads`` threads (the active SIMD path, each
    thread streaming a contiguous share) and return the rate in GB/s.

    Unlike :func:`read_bandwidth` it allocates nothing: a benchmark keeps one
    buffer (well above the L3) and calls this between the calls it times, so
    the bandwidth it compares a kernel with is measured at the same moment.

    Raises:
        TypeError: ``buf`` is not a float32 numpy array, or ``threads`` is
            not an integer.
        ValueError: ``buf`` is empty or not C-contiguous, or ``threads`` is
            outside 1..1024.
    """
    if not isinstance(buf, np.ndarray) or buf.dtype != np.float32:
        raise TypeError(f"stream_read needs a float32 numpy array, got {type(buf).__name__}"
                        + (f" of {buf.dtype}" if isinstance(buf, np.ndarray) else ""))
    if buf.size == 0 or not buf.flags.c_contiguous:
        raise ValueError("stream_read needs a non-empty C-contiguous array")
    n = integer(threads, "threads", lo=1, hi=1024)
    return float(_lib.call(_lib.fn("StreamRead"), buf.ctypes.data, buf.size, n))
