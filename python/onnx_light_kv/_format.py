"""Formatting helpers for what people read: reprs, notebook tables, messages.

Every public object's ``__repr__`` is a one-line summary (never a dump of its
arrays) built with :func:`summary`; objects with many figures also have a
``_repr_html_`` built with :func:`html_table`. Sizes use binary units
(:func:`human_bytes`), counts SI suffixes (:func:`human_count`), arrays their
dtype and shape (:func:`describe_array`).

    >>> human_bytes(68719476736)
    '64.0 GiB'
    >>> human_count(1234567)
    '1.23 M'
    >>> summary("KVCache", batch=1, dtype="float16", committed=human_bytes(2048))
    'KVCache(batch=1, dtype=float16, committed=2.0 KiB)'
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping, Optional, Tuple

__all__ = ["human_bytes", "bytes_with_exact", "human_count", "describe_array", "summary", "html_table"]

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"1.5 KiB"``, ``"64.0 GiB"``."""
    v = float(n)
    for unit in _BYTE_UNITS:
        if abs(v) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"  # not reached


def human_count(n: float) -> str:
    """A count with an SI suffix and 3 significant digits: ``"950"``,
    ``"12.3 k"``, ``"1.23 M"``, ``"4.00 G"``."""
    v = float(n)
    if abs(v) < 1000:
        return f"{int(v)}" if v == int(v) else f"{v:.3g}"
    for unit in ("k", "M", "G", "T", "P"):
        v /= 1000
        if abs(v) < 1000 or unit == "P":
            return f"{v:.3g} {unit}" if abs(v) < 100 else f"{v:.0f} {unit}"
    return str(n)  # not reached


def describe_array(a: Any) -> str:
    """An array as ``dtype[d0, d1, ...]`` (numpy arrays and anything with
    ``dtype`` and ``shape``); other values as their short ``repr``."""
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is None or dtype is None:
        r = repr(a)
        return r if len(r) <= 60 else r[:57] + "..."
    return f"{dtype}[{', '.join(map(str, shape))}]"


def summary(name: str, *args: Any, **fields: Any) -> str:
    """``Name(arg, key=value, ...)`` with values shown by ``str``: strings
    unquoted, arrays by :func:`describe_array`, lists of more than 8 items
    shortened. ``None`` values are left out."""
    parts = [str(a) for a in args]
    for k, v in fields.items():
        if v is None:
            continue
        parts.append(f"{k}={_short(v)}")
    return f"{name}({', '.join(parts)})"


def _short(v: Any) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        if getattr(v, "size", 2) <= 8 and getattr(v, "ndim", 2) <= 1:
            return str(list(v.tolist()))
        return describe_array(v)
    if isinstance(v, (list, tuple)) and len(v) > 8:
        head = ", ".join(map(str, v[:6]))
        return f"[{head}, ... {len(v)} items]"
    return str(v)


_STYLE = ("<style>.olkv-t{border-collapse:collapse;font-family:monospace;font-size:12px}"
          ".olkv-t th,.olkv-t td{padding:1px 8px;text-align:left;border-bottom:1px solid #ddd}"
          ".olkv-t th{background:#f0f0f0}.olkv-t td.v{text-align:right}</style>")


def html_table(title: str, sections: Mapping[str, Iterable[Tuple[str, Any]]],
               note: Optional[str] = None) -> str:
    """A small styled HTML table for ``_repr_html_``: ``title`` in bold, then
    for each section (e.g. "geometry", "memory", "counters") a header row and
    its ``(label, value)`` rows. Values are shown by ``str`` and escaped;
    format sizes and counts with :func:`human_bytes`/:func:`human_count`
    first. ``note`` is an optional line under the table."""
    rows = []
    for section, items in sections.items():
        rows.append(f'<tr><th colspan="2">{html.escape(section)}</th></tr>')
        for label, value in items:
            rows.append(f'<tr><td>{html.escape(str(label))}</td><td class="v">{html.escape(str(value))}</td></tr>')
    tail = f"<div>{html.escape(note)}</div>" if note else ""
    return f'{_STYLE}<div><b>{html.escape(title)}</b><table class="olkv-t">{"".join(rows)}</table>{tail}</div>'


def bytes_with_exact(n: int) -> str:
    """``"64.0 GiB (68,719,476,736 bytes)"``: human size plus the exact count."""
    return f"{human_bytes(n)} ({int(n):,} bytes)"

