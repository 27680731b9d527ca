"""Kernel-side probes: the machine's streaming-read bandwidth.

Decode attention over a cache larger than the last-level cache cannot beat
the rate at which the cores stream memory; benchmarks report the kernel's
effective K+V bandwidth as a fraction of this measurement.
"""

from __future__ import annotations

import numpy as np

from . import _lib

__all__ = ["read_bandwidth", "stream_read"]


def read_bandwidth(mib: int = 1024, threads: int = 1, iters: int = 5) -> float:
    """Best-of-``iters`` streaming-read bandwidth in GB/s (1e9 bytes/s) of a
    ``mib`` MiB buffer read by ``threads`` threads with the active SIMD path.

    Allocates the buffer for the duration of the call; use a size well above
    the L3 (the default 1 GiB) to measure DRAM.

    Raises:
        ValueError: ``mib`` < 1 or more than the memory available,
            ``threads`` outside 1..1024, or ``iters`` < 1.
        MemoryError: the buffer cannot be mapped.
    """
    return float(_lib.call(_lib.fn("ReadBandwidth"), int(mib), int(threads), int(iters)))


def stream_read(buf: np.ndarray, threads: int = 1) -> float:
    """Read ``buf`` once with ``threads`` threads (the active SIMD path, each
    thread streaming a contiguous share) and return the rate in GB/s.

    Unlike :func:`read_bandwidth` it allocates nothing: a benchmark keeps one
    buffer (well above the L3) and calls this between the calls it times, so
    the bandwidth it compares a kernel with is measured at the same moment.

    Raises:
        TypeError: ``buf`` is not a float32 numpy array.
        ValueError: ``buf`` is empty or not C-contiguous, or ``threads`` is
            outside 1..1024.
    """
    if not isinstance(buf, np.ndarray) or buf.dtype != np.float32:
        raise TypeError(f"stream_read needs a float32 numpy array, got {type(buf).__name__}"
                        + (f" of {buf.dtype}" if isinstance(buf, np.ndarray) else ""))
    if buf.size == 0 or not buf.flags.c_contiguous:
        raise ValueError("stream_read needs a non-empty C-contiguous array")
    if not 1 <= int(threads) <= 1024:
        raise ValueError(f"threads must be in 1..1024, got {threads}")
    return float(_lib.call(_lib.fn("StreamRead"), buf.ctypes.data, buf.size, int(threads)))
