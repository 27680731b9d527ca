"""Element types shared by the cache and the kernels."""

from __future__ import annotations

from typing import Any, Union

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
"""numpy dtype of bfloat16 values (from ml_dtypes)."""

#: codes understood by the Go side (golib/kvgo elemCodes)
CODES: dict[np.dtype, int] = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, bfloat16: 2}

DTypeLike = Union[str, np.dtype, type, None]


def cache_dtype(dtype: DTypeLike) -> np.dtype:
    """Resolve a user-given cache dtype ("float32", "float16", "bfloat16",
    numpy dtypes) or raise TypeError."""
    if isinstance(dtype, str) and dtype.lower() in ("bf16", "bfloat16"):
        return bfloat16
    try:
        dt = np.dtype(dtype)  # type: ignore[arg-type]
    except TypeError as e:
        raise TypeError(f"unsupported cache dtype {dtype!r}: use float32, float16 or bfloat16") from e
    if dt not in CODES:
        raise TypeError(f"unsupported cache dtype {dt}: use float32, float16 or bfloat16")
    return dt


def as_float_array(x: Any, name: str) -> np.ndarray:
    """Return x as a C-contiguous float32/float16/bfloat16 ndarray.

    Array-likes are converted with ``np.asarray``; float64 (and other float widths) is
    converted to float32, non-native byte orders to the native one, and non-contiguous
    arrays are copied (documented costs);
    integer, bool, complex and object arrays raise TypeError.
    """
    a = np.asarray(x)
    dt = a.dtype
    if dt not in CODES:
        if dt.kind == "f" and dt.newbyteorder("=") in CODES:
            a = a.astype(dt.newbyteorder("="))  # big-endian float16/float32: same width, native order
        elif dt.kind == "f":
            a = a.astype(np.float32)
        else:
            raise TypeError(f"{name} must be a float32, float16 or bfloat16 array, got dtype {dt}")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a
