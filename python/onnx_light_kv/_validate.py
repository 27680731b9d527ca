"""Argument validation at the Python boundary: one rule per argument kind.

Every public entry point checks its scalar and object arguments with these
functions before anything reaches the extension, so the same mistake raises
the same exception class everywhere and a failed call changes nothing:

* integers go through ``operator.index`` (``int`` and numpy integers pass;
  ``float``, ``str``, 0-d float arrays and, unless allowed, ``bool`` raise
  ``TypeError``) and are range-checked with ``ValueError``; the default range
  is the Go side's ``int64``, so huge values such as ``2**63`` or ``10**30``
  raise ``ValueError``, never ``OverflowError``;
* floats must be real numbers (``TypeError`` otherwise) and finite where a
  finite value is required, within float32 range when the Go side takes a
  float32 (``ValueError``);
* objects are checked by type with ``TypeError``;
* string choices are checked against their allowed values with ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Collection, Optional, Type, TypeVar

__all__ = ["integer", "optional_integer", "real", "instance", "choice", "INT64_MAX", "FLOAT32_MAX"]

INT64_MAX = 2**63 - 1
"""The largest integer the extension's ``int``/``int64`` parameters hold."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32."""

T = TypeVar("T")


def _type_name(value: Any) -> str:
    return type(value).__name__


def integer(value: Any, name: str, *, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX,
            allow_bool: bool = False) -> int:
    """``value`` as a Python ``int`` in ``[lo, hi]``.

    Raises:
        TypeError: not an integer (``operator.index`` fails), or a ``bool``
            unless ``allow_bool``.
        ValueError: outside ``[lo, hi]``.
    """
    if isinstance(value, bool) and not allow_bool:
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {_type_name(value)}") from None
    if not lo <= v <= hi:
        if hi == INT64_MAX:
            raise ValueError(f"{name} must be >= {lo}, got {v}" if v < lo else
                             f"{name} must be at most {hi} (int64), got {v}")
        if lo == -INT64_MAX - 1:
            raise ValueError(f"{name} must be at most {hi}, got {v}")
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def optional_integer(value: Any, name: str, *, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> Optional[int]:
    """``None`` or :func:`integer` of ``value``."""
    return None if value is None else integer(value, name, lo=lo, hi=hi)


def real(value: Any, name: str, *, finite: bool = True, float32: bool = False,
         lo: Optional[float] = None, hi: Optional[float] = None) -> float:
    """``value`` as a Python ``float``.

    Args:
        finite: refuse NaN and infinities.
        float32: refuse finite values beyond float32 range (they would
            become infinities on the Go side).
        lo, hi: optional inclusive bounds.

    Raises:
        TypeError: not a real number (``str``, ``bool``, arrays, ``None``...).
        ValueError: NaN/infinite when ``finite``, out of float32 range, or
            outside ``[lo, hi]``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_type_name(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float, got {value}") from None
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if float32 and math.isfinite(v) and abs(v) > FLOAT32_MAX:
        raise ValueError(f"{name} must be within float32 range (|x| <= {FLOAT32_MAX:.7g}), got {v}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        if hi is None:
            raise ValueError(f"{name} must be >= {lo}, got {v}")
        if lo is None:
            raise ValueError(f"{name} must be <= {hi}, got {v}")
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def instance(value: Any, name: str, cls: Type[T]) -> T:
    """``value`` itself if it is an instance of ``cls``.

    Raises:
        TypeError: anything else (naming the expected and the given type).
    """
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {_type_name(value)}")
    return value


def choice(value: Any, name: str, choices: Collection[str]) -> str:
    """``value`` if it is one of the strings ``choices``.

    Raises:
        TypeError: not a ``str``. ValueError: not one of ``choices``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {_type_name(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value
