"""Kernel-side probes: the machine's streaming-read bandwidth.

Decode attention over a cache larger than the last-level cache cannot beat
the rate at which the cores stream memory; benchmarks report the kernel's
effective K+V bandwidth as a fraction of this measurement.
"""

from __future__ import annotations

from . import _lib

__all__ = ["read_bandwidth"]


def read_bandwidth(mib: int = 1024, threads: int = 1, iters: int = 5) -> float:
    """Best-of-``iters`` streaming-read bandwidth in GB/s (1e9 bytes/s) of a
    ``mib`` MiB buffer read by ``threads`` threads with the active SIMD path.

    Allocates the buffer for the duration of the call; use a size well above
    the L3 (the default 1 GiB) to measure DRAM.
    """
    return float(_lib.call(_lib.fn("ReadBandwidth"), int(mib), int(threads), int(iters)))
