"""The KVCache value and the arena its memory lives in."""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any, NoReturn, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._errors import StaleCheckpointError, convert
from ._dtypes import CODES, DTypeLike, as_float_array, cache_dtype
from ._format import html_table, human_bytes, human_count, summary
from ._validate import INT64_MAX, instance, integer, optional_integer

__all__ = ["Arena", "KVCache", "Checkpoint", "default_arena", "QUANT_FORMATS", "QUANT_GROUPS", "K_AXES"]

_call = _lib.call
_f = _lib.fn
_addr = _lib.addr
_append = _lib.fn("CacheAppend")


def _i64(values: Union[int, Sequence[int], np.ndarray], name: str) -> np.ndarray:
    """Integer argument(s) as a contiguous int64 array.

    A scalar follows :func:`._validate.integer`; a sequence or array must hold
    integers (TypeError: floats, bools, strings) that fit int64 (ValueError:
    e.g. ``2**63`` or ``10**30``, which numpy would keep as uint64 or object); an
    array of more than one dimension is a ValueError.
    """
    if isinstance(values, (list, tuple)):
        return np.array([integer(x, f"{name} entry") for x in values], dtype=np.int64)
    if not isinstance(values, np.ndarray):
        return np.array([integer(values, name)], dtype=np.int64)
    a = values
    if a.ndim > 1:  # (ravelling [batch, s] ids would read them as one sequence)
        raise ValueError(f"{name} must be one integer or a 1-D sequence of them, got shape {a.shape}")
    if a.dtype == object:
        return np.array([integer(x, f"{name} entry") for x in a.ravel()], dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and int(a.max()) > INT64_MAX:
        raise ValueError(f"{name} entries must be at most {INT64_MAX} (int64), got {int(a.max())}")
    return np.ascontiguousarray(a.astype(np.int64, copy=False).ravel())


def _export_presents(export: Any, hint: int, geom_k: tuple[int, int, int], geom_v: tuple[int, int, int],
                    dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Present tensors ``(k, v)`` of shape ``(batch, kv_heads, L, head_dim)`` from one
    atomic Go export.

    ``export(k_ptr, k_bytes, v_ptr, v_bytes, code, max_len)`` reads the length ``L``
    under the cache's lock and writes the tensors into the leading bytes of the
    buffers when ``L <= max_len`` (returning ``L``), else writes nothing and returns
    ``L``. ``hint`` (a length read earlier) sizes the first try; a cache that grew in
    between is exported again into buffers for the reported length, so the result
    is always one consistent state of the cache.
    """
    bound = hint
    while True:
        k = np.empty(geom_k[0] * geom_k[1] * bound * geom_k[2], dtype=dt)
        v = np.empty(geom_v[0] * geom_v[1] * bound * geom_v[2], dtype=dt)
        n = export(k.ctypes.data, k.nbytes, v.ctypes.data, v.nbytes, CODES[dt], bound)
        if n <= bound:
            sk = (geom_k[0], geom_k[1], n, geom_k[2])
            sv = (geom_v[0], geom_v[1], n, geom_v[2])
            return k[:int(np.prod(sk))].reshape(sk), v[:int(np.prod(sv))].reshape(sv)
        bound = max(n, 2 * bound)


def _refuse_pickle(obj: Any, advice: str) -> NoReturn:
    """Raise the TypeError of an object that holds native memory through a
    handle: handle numbers are per process, so a pickled one would name an
    unrelated object (or none) wherever it is unpickled."""
    raise TypeError(f"{type(obj).__name__} cannot be pickled: it holds native memory through a handle that is "
                    f"valid only in the process that created it; {advice}")


class _Uncopyable:
    """Mixin of the objects that own native memory through a handle and have no
    meaningful copy: ``copy.copy``/``copy.deepcopy`` raise ``TypeError`` with
    the class's ``_COPY_ADVICE`` (the default protocol would copy the handle:
    closing or collecting the copy would free the original's memory), pickling
    raises :func:`_refuse_pickle`'s with its ``_PICKLE_ADVICE``."""

    __slots__ = ()
    _COPY_ADVICE = ""
    _PICKLE_ADVICE = ""

    def __copy__(self) -> NoReturn:
        raise TypeError(f"{type(self).__name__} cannot be copied: {self._COPY_ADVICE}")

    def __deepcopy__(self, memo: dict) -> NoReturn:
        self.__copy__()

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _refuse_pickle(self, self._PICKLE_ADVICE)


class Arena(_Uncopyable):
    """Persistent memory that caches live in, with a byte budget.

    Caches reserve their capacity from an arena when they are created; freed
    caches return their buffers to it for reuse by a later cache of the same
    byte size. The pool is bounded: it never holds more than the peak of
    allocated bytes (buffers of other sizes than the one just freed are given
    back first), the budget counts it, and it is emptied before an allocation
    is refused for lack of machine memory; :meth:`trim` empties it at once.
    Exceeding the budget raises :class:`BudgetError` (a ``MemoryError``) and
    changes nothing.

    An arena is a shared pool, not a value: ``copy.copy``, ``copy.deepcopy``
    and pickling raise TypeError (pass the same object around instead; a copy
    of a cache, :meth:`KVCache.fork`, allocates from the original's arena).

    Args:
        budget: maximum bytes the arena hands out; ``None`` or 0 = unlimited.

    Raises:
        TypeError: ``budget`` is not an integer (``"3"``, ``1.5``, ``True``).
        ValueError: ``budget`` is negative or above ``2**63 - 1``.
    """

    def __init__(self, budget: Optional[int] = None) -> None:
        b = optional_integer(budget, "budget", lo=0) or 0
        with _lib.deferred_interrupts():  # owned (finalizer) before a Ctrl-C arrives
            self._h: int = _call(_f("ArenaNew"), b)
            self._finalizer = _lib.finalizer(self, _lib.ext.kvgo_ArenaFree, self._h)

    @property
    def budget(self) -> Optional[int]:
        """The byte budget, or None when unlimited."""
        return self.stats()["budget"] or None

    @budget.setter
    def budget(self, value: Optional[int]) -> None:
        _call(_f("ArenaSetBudget"), self._h, optional_integer(value, "budget", lo=0) or 0)

    def stats(self) -> dict[str, Any]:
        """Accounting: budget, allocated/pooled/committed/peak/live bytes,
        allocation count and fragmentation (share of allocated bytes holding
        no valid data)."""
        return json.loads(_call(_f("ArenaStatsJSON"), self._h))

    def trim(self) -> None:
        """Give pooled (freed, kept for reuse) buffers back to the Go heap."""
        _call(_f("ArenaTrim"), self._h)

    def __repr__(self) -> str:
        s = self.stats()
        budget = "unlimited" if not s["budget"] else human_bytes(s["budget"])
        return summary("Arena", budget=budget, committed=human_bytes(s["committed_bytes"]),
                       live=human_bytes(s["live_bytes"]), pooled=human_bytes(s["pooled_bytes"]))

    def _repr_html_(self) -> str:
        s = self.stats()
        budget = "unlimited" if not s["budget"] else human_bytes(s["budget"])
        mem = [("budget", budget), ("allocated", human_bytes(s["allocated_bytes"])),
               ("committed", human_bytes(s["committed_bytes"])), ("live (valid data)", human_bytes(s["live_bytes"])),
               ("pooled (free, kept)", human_bytes(s["pooled_bytes"])), ("peak", human_bytes(s["peak_bytes"]))]
        use = [("allocations", human_count(s["allocations"])), ("fragmentation", f"{s['fragmentation']:.1%}")]
        return html_table("Arena", {"memory": mem, "use": use})

    _COPY_ADVICE = ("it is a shared pool of native memory; pass the same Arena object to every cache that "
                    "should use it")
    _PICKLE_ADVICE = "create an Arena in the receiving process"


_default: Optional[Arena] = None


def default_arena() -> Arena:
    """The process-wide arena used by caches created without one (no budget)."""
    global _default
    if _default is None:
        _default = Arena()
    return _default


class Checkpoint:
    """A restorable snapshot of a cache's sequence lengths (speculative decoding).

    Obtained from :meth:`KVCache.checkpoint`; pass it to :meth:`KVCache.rollback`.
    It is released when garbage-collected or by :meth:`release`.

    ``lengths`` are the lengths the snapshot saved (a KVCache's: what
    rollback restores, whatever other threads did since; a generation
    state's: read right after its snapshot, under the lock its select and
    adopt take, so a run from another thread in between would show in them).

    A checkpoint names a snapshot inside its cache: ``copy.copy`` and
    ``copy.deepcopy`` return the checkpoint itself, and pickling raises
    TypeError.
    """

    def __init__(self, cache: Any, ck_id: int, lengths: np.ndarray, release: Optional[tuple] = None) -> None:
        # cache: the KVCache (or GenerationState) it belongs to; release:
        # (function, handle) that forgets it, the cache's by default
        self._cache = weakref.ref(cache)
        self.id = ck_id
        self.lengths = lengths
        fn, h = release if release is not None else (_lib.ext.kvgo_CacheReleaseCheckpoint, cache._h)
        self._finalizer = _lib.finalizer(self, fn, h, ck_id)

    def release(self) -> None:
        """Forget the checkpoint; a later rollback to it raises StaleCheckpointError."""
        self._finalizer()

    def __repr__(self) -> str:
        return summary("Checkpoint", id=self.id, lengths=self.lengths,
                       released=True if not self._finalizer.alive else None)

    # -- copies -------------------------------------------------------------
    # The default protocol would share (copy) or duplicate (deepcopy) the
    # finalizer that releases the snapshot, so a copy would go stale when the
    # original is collected.
    def __copy__(self) -> "Checkpoint":
        return self

    def __deepcopy__(self, memo: dict) -> "Checkpoint":
        return self

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _refuse_pickle(self, "a checkpoint is usable only with the cache it was taken on")


#: Tokens per block of the paged layout when ``block_size`` is not given
#: (chosen by measuring decode attention against the contiguous layout).
DEFAULT_BLOCK_SIZE = 64

#: Block sizes the paged layout takes.
BLOCK_SIZES = (16, 32, 64, 128, 256)

#: Cache layouts.
LAYOUTS = ("contiguous", "paged")


def _layout(layout: Any, block_size: Any) -> str:
    """Validate a ``layout`` / ``block_size`` pair and return the layout."""
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if block_size is not None and layout != "paged":
        raise ValueError("block_size applies to layout='paged' only")
    return layout


#: Formats of a quantized cache's sealed rows (``KVCache(quant=...)``).
QUANT_FORMATS = ("int8", "int4")

#: Tokens per sealed chunk (and elements per per-token scale group) a quantized cache takes.
QUANT_GROUPS = (32, 64)

#: Axes along which a quantized cache's K rows share a scale (V is always per token).
K_AXES = ("channel", "token")

#: Defaults of ``quant_group`` and ``residual``.
DEFAULT_QUANT_GROUP = 32
DEFAULT_RESIDUAL = 128


# The native-cache arguments of the CacheNew/StateNew bindings' quantization options.
_NO_QUANT = ("none", 0, "channel", 0)


def _quant_options(quant: Any, quant_group: Any, k_axis: Any,
                   residual: Any) -> Optional[tuple[str, int, str, int]]:
    """Validate the quantization options (all of them, also when ``quant`` is None: a bad
    ``k_axis`` or ``quant_group`` is an error whether or not it takes effect); None when
    ``quant`` is None."""
    if quant is not None and not isinstance(quant, str):
        raise TypeError(f"quant must be None or a str, got {type(quant).__name__}")
    if quant is not None and quant not in QUANT_FORMATS:
        raise ValueError(f"quant must be None or one of {QUANT_FORMATS}, got {quant!r}")
    group = integer(quant_group, "quant_group")
    if group not in QUANT_GROUPS:
        raise ValueError(f"quant_group must be one of {QUANT_GROUPS}, got {group}")
    if not isinstance(k_axis, str):
        raise TypeError(f"k_axis must be a str, got {type(k_axis).__name__}")
    if k_axis not in K_AXES:
        raise ValueError(f"k_axis must be one of {K_AXES}, got {k_axis!r}")
    res = integer(residual, "residual", lo=0, hi=1 << 20)
    return None if quant is None else (quant, group, k_axis, res)


def _quant_block_size(block_size: Optional[int], group: int) -> int:
    """The paged block size of a quantized cache: its blocks are the sealed chunks."""
    if block_size is not None and block_size != group:
        raise ValueError(f"a quantized paged cache's blocks are its sealed chunks: block_size must equal "
                         f"quant_group ({group}), got {block_size}")
    return group


class KVCache:
    """Persistent KV cache of one attention layer of one request.

    Contiguous layout (the default): each of the ``batch`` sequences reserves
    ``capacity`` tokens for every KV head when the cache is created, so
    appending never moves or copies the past. Paged layout
    (``layout="paged"``): memory is taken from the arena's block pool in
    blocks of ``block_size`` tokens as tokens arrive, and ``capacity`` is only
    a limit; :meth:`fork` shares every block (the first write into a shared,
    partially filled block copies that block), :meth:`reorder` permutes page
    tables (at most one partial block copied per beam at the next append),
    and truncate/evict give whole blocks back. Attention reads both layouts
    in place. K rows are ``head_dim`` elements and V rows ``head_dim_v``
    elements of ``dtype``; math on them is float32.

    Quantized storage (``quant="int8"`` or ``"int4"``): the last ``residual`` tokens of each sequence stay in ``dtype``;
    when ``quant_group`` more have left that window they are quantized once
    (sealed) as one chunk with scales computed from the chunk itself: int8
    symmetric (``x = scale * q``), int4 with a scale and a zero point
    (``x = scale * q + zero``, two values per byte). K shares one scale per
    channel over the chunk (``k_axis="channel"``) or per group of
    ``quant_group`` elements of a row (``"token"``); V always per row group.
    A sealed chunk never changes: truncating or rolling back into it only
    shortens it, and later appends are stored natively and sealed from the
    new end. A scale group holding a NaN or an infinity reads back as NaN.
    :meth:`export` returns the dequantized values of sealed rows;
    :meth:`info` reports the figures under ``"quant"``. In the paged layout
    the blocks are the sealed chunks (``block_size`` equals ``quant_group``),
    taken as chunks are sealed and shared by :meth:`fork` and
    :meth:`reorder` without a copy; native rows stay in a private window of
    ``residual + quant_group`` rows per sequence and head. Attention reads the
    sealed rows in place (dequantized in registers by the fused kernels).

    Threads: every operation runs under the Go cache's lock, so one cache may
    be used from several threads. :meth:`select` changes :attr:`batch`
    together with the Go cache under a lock of this object, which
    :meth:`export`, :attr:`lengths`, :meth:`checkpoint` and :meth:`fork` also
    hold: each sees the batch before or after a concurrent select, never a
    mix. :meth:`append`, :meth:`truncate`, :meth:`reorder` and
    :func:`attention` take no lock of their own; when a select from another
    thread changes the batch their arguments were sized for, they raise
    ValueError (the Go side checks every size) and change nothing.

    Copies: ``copy.copy(cache)`` and ``copy.deepcopy(cache)`` return
    :meth:`fork`, an independent cache in the same arena (checkpoints are not
    carried over; :class:`BudgetError` when the arena cannot hold it). A cache
    cannot be pickled (TypeError): its memory is native and its handle is
    valid only in the process that created it; send the tensors of
    :meth:`export` and :meth:`append` them to a new cache instead.

    Args:
        batch: sequences (or beams) in the request.
        kv_heads: key/value heads.
        head_dim: elements per K row (and per V row unless ``head_dim_v``).
        head_dim_v: elements per V row, if different from ``head_dim``.
        dtype: storage type: "float32", "float16" or "bfloat16".
        capacity: tokens per sequence (required): reserved up front by the
            contiguous layout, a limit for the paged one.
        arena: the :class:`Arena` to allocate from (default: :func:`default_arena`).
        layout: ``"contiguous"`` or ``"paged"``.
        block_size: tokens per block of the paged layout: 16, 32, 64, 128 or
            256 (default: :data:`onnx_light_kv.cache.DEFAULT_BLOCK_SIZE`, 64; with ``quant``, it must be
            ``quant_group``, its default); only with ``layout="paged"``.
        quant: None (every row in ``dtype``), ``"int8"`` or ``"int4"``.
        quant_group: tokens per sealed chunk and elements per per-token
            scale group: 32 or 64 (a row whose length it does not divide has
            one scale group). Only with ``quant``.
        k_axis: ``"channel"`` (one K scale per channel and chunk) or
            ``"token"`` (per row group, like V). Only with ``quant``.
        residual: most recent tokens kept in ``dtype`` (0: seal as soon as a
            chunk is complete). Only with ``quant``.

    Raises:
        TypeError: a size that is not an integer (floats, strings, bools),
            an unsupported dtype, or an ``arena`` that is not an :class:`Arena`.
        ValueError: a size below 1 or beyond the limits of the Go side
            (geometries no model has, sizes above ``2**63 - 1``), an unknown
            ``layout``, a ``block_size`` not in the list or given with the
            contiguous layout, a ``quant``/``quant_group``/``k_axis`` not in
            the lists, ``residual < 0``, an odd head dim with int4, a
            ``block_size`` other than ``quant_group`` with ``quant``.
        BudgetError: the arena's budget cannot hold the cache.
    """

    def __init__(
        self,
        batch: int,
        kv_heads: int,
        head_dim: int,
        *,
        head_dim_v: Optional[int] = None,
        dtype: DTypeLike = "float32",
        capacity: int,
        arena: Optional[Arena] = None,
        layout: str = "contiguous",
        block_size: Optional[int] = None,
        quant: Optional[str] = None,
        quant_group: int = DEFAULT_QUANT_GROUP,
        k_axis: str = "channel",
        residual: int = DEFAULT_RESIDUAL,
    ) -> None:
        self._layout = _layout(layout, block_size)
        q = _quant_options(quant, quant_group, k_axis, residual)
        self._quant = None if q is None else q[0]
        if dtype is None:  # np.dtype(None) is float64: name what was passed
            raise TypeError("dtype must be 'float32', 'float16' or 'bfloat16' (or the numpy dtype), got None")
        self._dtype = cache_dtype(dtype)
        self._batch = integer(batch, "batch", lo=1)
        self._kv_heads = integer(kv_heads, "kv_heads", lo=1)
        self._dk = integer(head_dim, "head_dim", lo=1)
        self._dv = self._dk if head_dim_v is None else integer(head_dim_v, "head_dim_v", lo=1)
        self._capacity = integer(capacity, "capacity", lo=1)
        self._arena = default_arena() if arena is None else instance(arena, "arena", Arena)
        bs = 0
        if self._layout == "paged":
            bs = DEFAULT_BLOCK_SIZE if block_size is None else integer(block_size, "block_size", lo=1)
            if bs not in BLOCK_SIZES:
                raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {bs}")
            if q is not None:
                bs = _quant_block_size(block_size, q[1])
        with _lib.deferred_interrupts():  # owned (finalizer) before a Ctrl-C arrives
            h = _call(_f("CacheNew"), self._arena._h, self._batch, self._kv_heads, self._dk, self._dv,
                      self._capacity, CODES[self._dtype], int(self._layout == "paged"), bs,
                      *(q if q is not None else _NO_QUANT))
            self._adopt(h)

    def _adopt(self, h: int) -> None:
        self._h = h
        self._finalizer = _lib.finalizer(self, _lib.ext.kvgo_CacheClose, h)
        # Held by select() around the Go call and the update of _batch, and by
        # every operation that sizes buffers or results from _batch (export,
        # lengths, checkpoint, fork), so those never see a batch the Go cache
        # no longer has. Operations whose Go side checks the exact batch
        # (append, attention, truncate, reorder) do not take it.
        self._lock = threading.Lock()

    # -- geometry -----------------------------------------------------------
    @property
    def batch(self) -> int:
        """Number of sequences."""
        return self._batch

    @property
    def kv_heads(self) -> int:
        """Number of KV heads."""
        return self._kv_heads

    @property
    def head_dim(self) -> int:
        """Elements per K row."""
        return self._dk

    @property
    def head_dim_v(self) -> int:
        """Elements per V row."""
        return self._dv

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype."""
        return self._dtype

    @property
    def capacity(self) -> int:
        """Tokens per sequence: reserved (contiguous) or a limit (paged)."""
        return self._capacity

    @property
    def layout(self) -> str:
        """``"contiguous"`` or ``"paged"``."""
        return self._layout

    @property
    def quant(self) -> Optional[str]:
        """The sealed rows' format (``"int8"``, ``"int4"``), or None when every row is stored in :attr:`dtype`."""
        return self._quant

    @property
    def block_size(self) -> Optional[int]:
        """Tokens per block of the paged layout (None for contiguous)."""
        return self.info()["block_size"] if self._layout == "paged" else None

    @property
    def lengths(self) -> np.ndarray:
        """Valid tokens per sequence (int64 array of shape [batch])."""
        with self._lock:
            return self._lengths_locked()

    def _lengths_locked(self) -> np.ndarray:
        """:attr:`lengths`; the caller holds ``_lock``."""
        out = np.empty(self._batch, dtype=np.int64)
        _call(_f("CacheLengths"), self._h, out.ctypes.data, self._batch)
        return out

    @property
    def arena(self) -> Arena:
        """The arena the cache's memory comes from."""
        return self._arena

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return not self._finalizer.alive

    # -- operations ---------------------------------------------------------
    def append(self, k: Any, v: Any, *, counts: Optional[Sequence[int]] = None) -> None:
        """Append new tokens after the valid ones, copying only those tokens.

        Args:
            k: ``[batch, kv_heads, n, head_dim]`` float32/float16/bfloat16
                (converted to the cache dtype; float64 is accepted and
                converted to float32 first; non-contiguous input is copied).
            v: ``[batch, kv_heads, n, head_dim_v]``, same dtype as ``k``.
            counts: optional real-token count per sequence (0..n); the
                remaining rows of that sequence are padding and are skipped.

        Raises:
            TypeError: non-float dtypes or k/v of different dtypes.
            ValueError: wrong rank or shape, bad counts.
            CapacityError: a sequence would exceed ``capacity`` (nothing written).
        """
        if not (type(k) is np.ndarray and k.dtype in CODES and k.flags.c_contiguous):
            k = as_float_array(k, "k")
        if not (type(v) is np.ndarray and v.dtype in CODES and v.flags.c_contiguous):
            v = as_float_array(v, "v")
        if k.dtype != v.dtype:
            raise TypeError(f"k and v must have the same dtype, got {k.dtype} and {v.dtype}")
        if k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"k and v must be 4-D [batch, kv_heads, n, head_dim], got shapes {k.shape} and {v.shape}")
        n = k.shape[2]
        if k.shape != (self._batch, self._kv_heads, n, self._dk) or v.shape != (self._batch, self._kv_heads, n, self._dv):
            want_k = (self._batch, self._kv_heads, n, self._dk)
            want_v = (self._batch, self._kv_heads, n, self._dv)
            raise ValueError(f"append expects k {want_k} and v {want_v}, got {k.shape} and {v.shape}")
        cptr = 0
        if counts is not None:
            c = _i64(counts, "counts")
            if c.shape != (self._batch,):
                raise ValueError(f"counts must have {self._batch} entries, got {c.size}")
            cptr = c.ctypes.data
        try:
            _lib.check_process()
            _append(self._h, _addr(k), k.nbytes, _addr(v), v.nbytes, CODES[k.dtype], n, cptr)
        except RuntimeError as e:
            raise convert(e) from None

    def export(self, dtype: DTypeLike = None) -> tuple[np.ndarray, np.ndarray]:
        """Materialize standard present tensors ``(k, v)``:
        ``[batch, kv_heads, L, head_dim]`` and ``[batch, kv_heads, L, head_dim_v]``
        with ``L = max(lengths)``; rows past a sequence's length, or evicted by
        a sliding window, are zeros. ``dtype`` defaults to the cache dtype.

        This is the only operation that copies the whole cache; generation
        loops that do not observe present tensors never need it. The length
        and the rows are read in one Go call under the cache's lock, so an
        append, reset or select from another thread yields either the state
        before it or the state after it, never a mix.
        """
        dt = self._dtype if dtype is None else cache_dtype(dtype)
        h = self._h
        # Go fills the leading bytes of buffers at least as large as its
        # batch needs: size and shape them from a batch select cannot change.
        with self._lock:
            return _export_presents(lambda *a: _call(_f("CacheExport"), h, *a), _call(_f("CacheMaxLen"), h),
                                    (self._batch, self._kv_heads, self._dk), (self._batch, self._kv_heads, self._dv),
                                    dt)

    def reset(self) -> None:
        """Empty every sequence (keeps the reserved memory); drops checkpoints."""
        _call(_f("CacheReset"), self._h)

    def fork(self) -> "KVCache":
        """Return an independent copy (same arena; no shared writable storage).

        Raises:
            BudgetError: the arena cannot hold the copy.
        """
        with self._lock, _lib.deferred_interrupts():  # the copy's batch is the one Go forked
            h = _call(_f("CacheFork"), self._h)  # (owned below before a Ctrl-C arrives)
            new = object.__new__(KVCache)
            new.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("_h", "_finalizer", "_lock")})
            new._adopt(h)
        return new

    clone = fork

    def __copy__(self) -> "KVCache":
        return self.fork()

    def __deepcopy__(self, memo: dict) -> "KVCache":
        return self.fork()

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _refuse_pickle(self, "export() its contents and append() them to a new KVCache in the receiving process")

    def truncate(self, n: Union[int, Sequence[int]]) -> None:
        """Shrink sequence lengths: ``n`` is one length for all sequences or
        one per sequence. A length may not grow, nor drop below a sliding
        window's start (ValueError, nothing changes). Truncated rows can come
        back through :meth:`rollback` until they are overwritten."""
        a = _i64(n, "n")
        if a.size not in (1, self._batch):
            raise ValueError(f"truncate takes 1 or {self._batch} lengths, got {a.size}")
        _call(_f("CacheTruncate"), self._h, a.ctypes.data, a.size)

    def reorder(self, beam_indices: Sequence[int]) -> None:
        """Beam-search reorder: sequence ``b`` becomes a copy of old sequence
        ``beam_indices[b]``. Permutations move no data; only beams chosen more
        than once are copied (counted in ``info()['counters']['copy_bytes']``).

        Raises:
            IndexError: an index outside ``0..batch-1``.
            ValueError: not exactly ``batch`` indices.
        """
        a = _i64(beam_indices, "beam_indices")
        if a.size != self._batch:
            raise ValueError(f"reorder needs {self._batch} beam indices, got {a.size}")
        _call(_f("CacheReorder"), self._h, a.ctypes.data, a.size)

    def select(self, indices: Sequence[int]) -> None:
        """Keep only the sequences ``indices`` (distinct, in the order given)
        and drop the others, as transformers' ``batch_select_indices`` does:
        finished beams or requests leave the batch, :attr:`batch` becomes
        ``len(indices)`` and the dropped sequences' memory goes back to the
        arena. No kept row is copied; checkpoints are invalidated.

        Raises:
            IndexError: an index outside ``0..batch-1``.
            ValueError: no index, more than ``batch``, or a repeated index.
        """
        a = _i64(indices, "indices")
        if a.size == 0:
            raise ValueError("select keeps at least one sequence")
        with self._lock:
            _call(_f("CacheSelect"), self._h, a.ctypes.data, a.size)
            self._batch = int(a.size)

    def evict(self, keep_last: int) -> None:
        """Sliding window: keep only the last ``keep_last`` tokens of each
        sequence readable by attention and export.

        Raises:
            TypeError: ``keep_last`` is not an integer. ValueError: negative.
        """
        _call(_f("CacheEvict"), self._h, integer(keep_last, "keep_last", lo=0))

    def checkpoint(self) -> Checkpoint:
        """Snapshot the lengths for speculative decoding (see :meth:`rollback`).

        At most 64 checkpoints stay live per cache: taking a 65th drops the
        oldest live one, and rolling back to it raises
        :class:`StaleCheckpointError` saying so.
        """
        with self._lock:  # no select between sizing the lengths and the snapshot
            lengths = np.empty(self._batch, dtype=np.int64)  # the snapshot's own, not the cache's now
            # one Go call takes the snapshot and its lengths (a reorder or reset on another
            # thread comes before or after both); on an error it leaves no checkpoint behind
            ck = _call(_f("CacheCheckpoint"), self._h, lengths.ctypes.data, self._batch)
            try:
                return Checkpoint(self, ck, lengths)
            except BaseException:
                # no Checkpoint owns it: release it rather than let it pin rows
                # (and blocks) until 64 newer checkpoints push it out
                _lib.ext.kvgo_CacheReleaseCheckpoint(self._h, ck)
                raise

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Restore the lengths saved by ``checkpoint`` (drafted tokens are
        dropped; tokens truncated since come back if not overwritten).

        Raises:
            StaleCheckpointError: released, dropped because 64 newer checkpoints
                were taken after it, invalidated by reset/reorder, or overwritten.
        """
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"rollback expects a Checkpoint, got {type(checkpoint).__name__}")
        if checkpoint._cache() is not self:
            raise ValueError("checkpoint belongs to another cache")
        if not checkpoint._finalizer.alive:
            raise StaleCheckpointError(f"checkpoint {checkpoint.id} was released")
        _call(_f("CacheRollback"), self._h, checkpoint.id)

    def reset_counters(self) -> None:
        """Zero the work counters."""
        _call(_f("CacheResetCounters"), self._h)

    def info(self) -> dict[str, Any]:
        """Logical metadata: dtype, layout, geometry, lengths, window starts,
        committed/live/page-table bytes, fragmentation (share of committed
        bytes holding no valid row), live checkpoints and counters (bytes
        copied by append/export/fork+reorder, bytes read by attention).

        The paged layout also reports ``block_size``, ``blocks_used``
        (distinct blocks this cache references), ``blocks_shared`` (those
        also referenced by a fork, another beam or a prefix),
        ``blocks_free`` and ``blocks_total`` (the arena's pool of blocks of
        this geometry: free ones kept for reuse, used + free).

        ``"quant"`` is None, or for a quantized cache a dict: ``format``,
        ``group``, ``k_axis``, ``residual``, ``sealed_tokens`` and
        ``native_tokens`` (readable tokens held quantized and in ``dtype``,
        summed over sequences), ``scale_bytes`` (scales and zero points:
        the per-token ones of the readable sealed rows, plus the per-channel K
        scales of every chunk the cache still holds: in the contiguous layout
        every chunk below the sealed length, those an evict or a window made
        unreadable included (their table keeps them); in the paged layout the
        chunk blocks still held),
        ``bytes_per_token`` (one sealed token, all heads,
        K and V, scales included, per-channel K scales amortized over a
        chunk) and ``native_bytes_per_token``. The counters include
        ``seal_calls`` (chunks sealed) and ``seal_bytes`` (bytes written by
        sealing)."""
        return json.loads(_call(_f("CacheInfoJSON"), self._h))

    @property
    def counters(self) -> dict[str, int]:
        """The work counters (see :meth:`info`)."""
        return self.info()["counters"]

    def close(self) -> None:
        """Release the cache's memory to its arena; later calls raise ValueError."""
        self._finalizer()

    def __enter__(self) -> "KVCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- display ------------------------------------------------------------
    def __repr__(self) -> str:
        if self.closed:
            return "KVCache(closed)"
        i = self.info()
        return summary("KVCache", batch=i["batch"], kv_heads=i["kv_heads"], head_dim=i["head_dim_k"],
                       head_dim_v=None if i["head_dim_v"] == i["head_dim_k"] else i["head_dim_v"],
                       dtype=i["dtype"], capacity=i["capacity"], lengths=i["lengths"], layout=i["layout"],
                       quant=None if i["quant"] is None else i["quant"]["format"],
                       committed=human_bytes(i["committed_bytes"]))

    def _repr_html_(self) -> str:
        if self.closed:
            return "<b>KVCache</b> (closed)"
        i = self.info()
        c = i["counters"]
        lengths = i["lengths"]
        shown = ", ".join(map(str, lengths[:8])) + (f", ... ({len(lengths)} sequences)" if len(lengths) > 8 else "")
        geometry = [("dtype", i["dtype"]), ("layout", i["layout"]), ("batch", i["batch"]),
                    ("kv_heads", i["kv_heads"]),
                    ("head_dim (K / V)", f"{i['head_dim_k']} / {i['head_dim_v']}"),
                    ("capacity", f"{human_count(i['capacity'])} tokens"), ("lengths", shown),
                    ("checkpoints", i["checkpoints"])]
        memory = [("committed", human_bytes(i["committed_bytes"])), ("live (valid tokens)", human_bytes(i["live_bytes"])),
                  ("page table", human_bytes(i["page_table_bytes"]))]
        counters = [("appended", f"{human_bytes(c['append_bytes'])} in {human_count(c['append_calls'])} calls"),
                    ("read by attention", f"{human_bytes(c['attention_bytes'])} in {human_count(c['attention_calls'])} calls"),
                    ("exported", human_bytes(c["export_bytes"])), ("copied (fork, reorder)", human_bytes(c["copy_bytes"]))]
        sections = {"geometry": geometry, "memory": memory, "counters": counters}
        q = i["quant"]
        if q is not None:
            sections["quantization"] = [
                ("format", f"{q['format']}, group {q['group']}, K per {q['k_axis']}"),
                ("residual", f"{human_count(q['residual'])} tokens"),
                ("sealed / native tokens", f"{human_count(q['sealed_tokens'])} / {human_count(q['native_tokens'])}"),
                ("scales", human_bytes(q["scale_bytes"])),
                ("per token (sealed / native)", f"{human_bytes(q['bytes_per_token'])} / {human_bytes(q['native_bytes_per_token'])}"),
                ("sealed", f"{human_count(c['seal_calls'])} chunks, {human_bytes(c['seal_bytes'])}")]
        return html_table("KVCache", sections)
