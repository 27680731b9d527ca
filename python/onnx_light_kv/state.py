"""Generation state: the KV caches of one request on the cache path of a session.

``InferenceSession.create_state(...)`` returns a :class:`GenerationState` holding one
:class:`~onnx_light_kv.KVCache`-like cache per rewritten attention layer;
``sess.run(output_names, feeds, state=state)`` feeds only the new tokens, appends their K/V to the
caches (only those rows are copied) and attends over the caches in place.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NoReturn, Sequence

import numpy as np

from . import _lib
from ._dtypes import CODES, cache_dtype
from ._format import html_table, human_bytes, human_count, summary
from ._validate import integer
from .cache import Checkpoint, _export_presents, _i64, _refuse_pickle

if TYPE_CHECKING:  # pragma: no cover
    from .session import InferenceSession

__all__ = ["GenerationState"]

_call = _lib.call
_f = _lib.fn


class GenerationState:
    """The caches of one request (one KVCache per rewritten layer), created by
    :meth:`InferenceSession.create_state`.

    Positions are logical: :attr:`length` counts every position run so far (left padding
    included), :attr:`lengths` the tokens each sequence stores (padding is never stored).
    One state is used by one caller at a time; several states of one session may run
    concurrently from several threads. Operations that fail change nothing.

    Threads: the Go side locks every operation, so calls from several threads do not corrupt a
    state (their order is the callers' business). :meth:`select` and :meth:`adopt` change
    :attr:`batch` together with the Go state under a lock of this object, which :meth:`export`,
    :attr:`lengths`, :meth:`checkpoint` and :meth:`fork` also hold: each sees the batch before
    or after a concurrent select or adopt, never a mix. :meth:`reorder`, :meth:`load` and
    ``InferenceSession.run(..., state=)`` take no lock of their own; when a select or adopt
    from another thread changes the batch their arguments were sized for, they raise ValueError
    (the Go side checks every size) and change nothing.

    Copies: ``copy.copy(state)`` and ``copy.deepcopy(state)`` return :meth:`fork`, an
    independent state of the same session in the same arena (checkpoints are not carried
    over; :class:`~onnx_light_kv.BudgetError` when the arena cannot hold it). A state cannot
    be pickled (TypeError): its caches are native memory and its handle is valid only in the
    process that created it; send the presents of :meth:`export` and :meth:`load` them into a
    state of a session created in the receiving process instead.
    """

    def __init__(self, session: "InferenceSession", handle: int, batch: int, dtype: np.dtype,
                 plan: List[Dict[str, Any]]) -> None:
        self._session = session
        self._h = handle
        self._batch = batch
        self._dtype = dtype
        self._plan = plan
        self._finalizer = _lib.finalizer(self, _lib.ext.kvgo_StateFree, handle)
        # Held by select() and adopt() around the Go call and the update of _batch, and by
        # every operation that sizes buffers or results from _batch (export, lengths,
        # checkpoint, fork), so those never see a batch the Go state no longer has. Operations
        # whose Go side checks the exact batch (reorder, load, run) do not take it.
        self._lock = threading.Lock()

    # -- properties ---------------------------------------------------------
    @property
    def batch(self) -> int:
        """Number of sequences."""
        return self._batch

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype of the caches."""
        return self._dtype

    @property
    def length(self) -> int:
        """Logical positions run so far (the past length a tensor-path run would see)."""
        return int(_call(_f("StateLength"), self._handle()))

    @property
    def lengths(self) -> np.ndarray:
        """Tokens stored per sequence (int64 ``[batch]``; left padding is not stored)."""
        with self._lock:
            return self._lengths_locked()

    def _lengths_locked(self) -> np.ndarray:
        """:attr:`lengths`; the caller holds ``_lock``."""
        out = np.empty(self._batch, dtype=np.int64)
        _call(_f("StateLengths"), self._handle(), out.ctypes.data, self._batch)
        return out

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return not self._finalizer.alive

    # -- operations ---------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        """Per-layer cache metadata (``layers``: geometry, lengths, committed/live bytes,
        counters) and ``totals`` over the layers (committed/live bytes, append/export/copy/
        attention bytes and calls), plus ``batch``, ``length`` and ``dtype``. A
        ``prefix_cache`` state adds ``prefix_cache``: the session store's ``lookups``,
        ``hits``, ``tokens_reused``, ``bytes_saved``, ``shared_blocks``, ``evicted``,
        ``registered_bytes`` and ``max_bytes`` (the cap, see ``create_state``)."""
        return json.loads(_call(_f("StateInfoJSON"), self._handle()))

    def reset_counters(self) -> None:
        """Zero every layer cache's work counters."""
        _call(_f("StateResetCounters"), self._handle())

    def fork(self) -> "GenerationState":
        """An independent copy (valid rows copied; same arena). Checkpoints are not copied.

        Raises:
            BudgetError: the arena cannot hold the copy.
        """
        with self._lock, _lib.deferred_interrupts():  # the copy's batch is the one Go forked
            h = _call(_f("StateFork"), self._handle())  # (owned below before a Ctrl-C arrives)
            return GenerationState(self._session, h, self._batch, self._dtype, self._plan)

    clone = fork

    def __copy__(self) -> "GenerationState":
        return self.fork()

    def __deepcopy__(self, memo: dict) -> "GenerationState":
        return self.fork()  # the session is shared, not copied: a state belongs to its session

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _refuse_pickle(self, "export() its presents and load() them into a state of a session created in the "
                             "receiving process")

    def reorder(self, beam_indices: Sequence[int]) -> None:
        """Beam search: sequence ``b`` of every layer becomes old sequence ``beam_indices[b]``.
        Checkpoints become stale.

        Raises:
            IndexError: an index outside ``0..batch-1``. ValueError: not ``batch`` indices.
        """
        a = _i64(beam_indices, "beam_indices")
        if a.size != self._batch:
            raise ValueError(f"reorder needs {self._batch} beam indices, got {a.size}")
        _call(_f("StateReorder"), self._handle(), a.ctypes.data, a.size)

    def select(self, indices: Sequence[int]) -> None:
        """Keep a subset of the sequences: sequence ``b`` becomes old sequence ``indices[b]``
        and :attr:`batch` becomes ``len(indices)``. No K/V is copied; the storage of the
        dropped sequences goes back to the arena. :attr:`length` becomes the longest kept
        sequence's stored length. Checkpoints become stale.

        Raises:
            IndexError: an index outside ``0..batch-1``. ValueError: no index, or one twice.
        """
        a = _i64(indices, "indices")
        if a.size == 0:
            raise ValueError("select keeps at least one sequence")
        if np.unique(a).size != a.size:
            raise ValueError("select keeps a subset: an index appears twice (use fork or reorder to copy)")
        with self._lock:
            _call(_f("StateSelect"), self._handle(), a.ctypes.data, a.size)
            self._batch = int(a.size)

    def adopt(self, other: "GenerationState") -> None:
        """Move every sequence of ``other`` (a state of the same session, created with the same
        ``max_length`` and ``dtype``, on the same arena, run at least once) to the end of this
        one and close ``other``. No K/V is copied. :attr:`length` becomes the larger of the two
        lengths (the shorter state's sequences gain left padding, which is not stored).
        Checkpoints become stale. Feed the adopted rows ``position_ids`` that count their own
        tokens: a model that takes its positions from the slot index (no ``position_ids``
        input) would run them at shifted positions, which rotary attention notices.

        Raises:
            TypeError: ``other`` is not a GenerationState. ValueError: another session, the
            state itself, a different geometry, max_length (or none), dtype or arena.
        """
        if not isinstance(other, GenerationState):
            raise TypeError(f"adopt expects a GenerationState, got {type(other).__name__}")
        if other is self:
            raise ValueError("a state cannot adopt itself")
        # both batches change: hold both locks (in one global order, so that two threads
        # adopting each other's states cannot deadlock)
        first, second = (self, other) if id(self) < id(other) else (other, self)
        with first._lock, second._lock:
            _call(_f("StateAdopt"), self._handle(), other._handle())
            self._batch += other._batch
        other._finalizer()

    def reuse_prefix(self, token_ids: Sequence[int]) -> int:
        """Attach the longest prefix of ``token_ids`` registered by earlier states of the
        session (``create_state(layout="paged", prefix_cache=True)``) and return how many
        tokens it covers, so the caller feeds only the rest (from position ``n``). The prefix
        is shared by reference in whole blocks, and always leaves the last token to be run so
        that the next run yields its logits. 0 means nothing was attached.

        Raises:
            ValueError: the state was not created with ``prefix_cache=True`` or is not empty.
        """
        a = _i64(token_ids, "token_ids")
        return int(_call(_f("StateReusePrefix"), self._handle(), a.ctypes.data, a.size))

    def truncate(self, n: int) -> None:
        """Drop the last positions so that :attr:`length` becomes ``n`` (``0 <= n <= length``,
        else ValueError; TypeError if ``n`` is not an integer)."""
        _call(_f("StateTruncate"), self._handle(), integer(n, "n", lo=0))

    def checkpoint(self) -> Checkpoint:
        """Snapshot every layer for speculative decoding (see :meth:`rollback`)."""
        with self._lock:  # no select or adopt between the snapshot and reading its lengths
            h = self._handle()
            ck = _call(_f("StateCheckpoint"), h)
            try:
                return Checkpoint(self, ck, self._lengths_locked(), release=(_lib.ext.kvgo_StateReleaseCheckpoint, h))
            except BaseException:
                # no Checkpoint owns it: release it rather than leave it live in the state
                _lib.ext.kvgo_StateReleaseCheckpoint(h, ck)
                raise

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Restore a checkpoint of this state: tokens appended since are dropped.

        Raises:
            StaleCheckpointError: released, or made stale by reorder/reset, a cache growth
            (create the state with ``max_length`` to avoid those) or an overwrite.
        """
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"rollback expects a Checkpoint, got {type(checkpoint).__name__}")
        if checkpoint._cache() is not self:
            raise ValueError("checkpoint belongs to another state or cache")
        _call(_f("StateRollback"), self._handle(), checkpoint.id)

    def reset(self) -> None:
        """Empty every cache (memory stays reserved); drops checkpoints."""
        _call(_f("StateReset"), self._handle())

    def export(self, dtype: Any = None) -> Dict[str, np.ndarray]:
        """The caches as present tensors, by present output name: ``[batch, kv_heads, L,
        head_dim]`` with ``L`` the longest stored sequence (shorter sequences are zero-filled
        at the end). ``dtype`` defaults to the cache dtype. This copies the whole cache. A
        :meth:`select` or :meth:`adopt` from another thread yields the sequences before it or
        after it, never a mix (layers are read one after another: a run from another thread may
        show in some layers only)."""
        h = self._handle()
        dt = self._dtype if dtype is None else cache_dtype(dtype)
        out: Dict[str, np.ndarray] = {}
        # Go fills the leading bytes of buffers at least as large as its batch needs: size and
        # shape them from a batch select and adopt cannot change
        with self._lock:
            info = self.info()
            for layer in info["layers"]:
                slot = layer["slot"]
                k, v = _export_presents(lambda *a, s=slot: _call(_f("StateExport"), h, s, *a),
                                       _call(_f("StateExportLen"), h, slot),
                                       (self._batch, layer["kv_heads"], layer["head_dim_k"]),
                                       (self._batch, layer["kv_heads"], layer["head_dim_v"]), dt)
                out[layer["present_key"]] = k
                out[layer["present_value"]] = v
        return out

    def load(self, presents: Mapping[str, np.ndarray]) -> None:
        """Append positions to every layer from present tensors, the inverse of :meth:`export`:
        ``presents`` maps each layer's present key and value names (``cache_plan()``) to arrays
        ``[batch, kv_heads, n, head_dim]`` of one float dtype (float32, float16 or bfloat16;
        converted to the cache dtype), the same ``n`` for every layer. Every sequence gets the
        ``n`` positions and :attr:`length` grows by ``n``. This continues on the cache path what
        a tensor-path run computed (ours or onnxruntime's presents, keys as they hold them,
        rotary applied). The rows are copied once into the caches.

        Raises:
            TypeError: ``presents`` is not a mapping. KeyError: a layer's present is missing (an
            empty mapping, what :meth:`export` gives for a state without caches, loads nothing).
            ValueError: wrong shapes (batch, geometry,
            differing ``n``), or the positions do not fit ``max_length``
            (:class:`~onnx_light_kv.CapacityError`). TypeError: a non-float dtype or mixed
            dtypes. NotImplementedError: a layer keeps window-sized presents
            (GroupQueryAttention ``sliding_window_cache=1``), which hold only its last positions.
            :class:`~onnx_light_kv.BudgetError`: the state's budget is exceeded. Nothing
            changes on error.
        """
        h = self._handle()
        if not isinstance(presents, Mapping):
            raise TypeError(f"load takes a mapping of present names to arrays (as export() returns), "
                            f"got {type(presents).__name__}")
        if not presents:
            return  # nothing to load: what export() gives for a state without caches
        for layer in self._plan:
            if layer.get("window_buffer"):
                raise NotImplementedError(
                    f"layer {layer['layer']} keeps window-sized presents (sliding_window_cache=1): they hold only "
                    f"its last {layer['window_buffer']} positions and cannot be loaded")
        arrays: List[np.ndarray] = []
        n = None
        for layer in self._plan:
            for key in ("present_key", "present_value"):
                name = layer[key]
                if name not in presents:
                    raise KeyError(f"load needs every layer's presents: {name!r} is missing")
                a = presents[name]
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"{name}: expected a numpy array, got {type(a).__name__}")
                if a.ndim != 4 or a.shape[0] != self._batch:
                    raise ValueError(f"{name}: shape {a.shape}, want [batch={self._batch}, kv_heads, n, head_dim]")
                if n is None:
                    n = a.shape[2]
                elif a.shape[2] != n:
                    raise ValueError(f"{name}: {a.shape[2]} positions, other presents have {n}")
                arrays.append(np.ascontiguousarray(a))
        if not arrays:
            return
        dt = arrays[0].dtype
        if dt not in CODES:
            raise TypeError(f"unsupported present dtype {dt}: use float32, float16 or bfloat16")
        if any(a.dtype != dt for a in arrays):
            raise TypeError(f"presents of mixed dtypes {sorted({str(a.dtype) for a in arrays})}")
        desc = np.empty((len(self._plan), 7), np.int64)
        for i in range(len(self._plan)):
            k, v = arrays[2 * i], arrays[2 * i + 1]
            if k.shape[1] != v.shape[1]:
                raise ValueError(f"layer {self._plan[i]['layer']}: key and value have {k.shape[1]} and "
                                 f"{v.shape[1]} KV heads")
            desc[i] = (k.ctypes.data, k.nbytes, v.ctypes.data, v.nbytes, k.shape[1], k.shape[3], v.shape[3])
        _call(_f("StateLoad"), h, desc.ctypes.data, len(self._plan), CODES[dt], int(n or 0))

    def close(self) -> None:
        """Release the caches now (also done when the state is collected)."""
        self._finalizer()

    def __enter__(self) -> "GenerationState":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _handle(self) -> int:
        if not self._finalizer.alive:
            raise ValueError("the generation state is closed")
        return self._h

    # -- display ------------------------------------------------------------
    def __repr__(self) -> str:
        if self.closed:
            return "GenerationState(closed)"
        i = self.info()
        t = i["totals"]
        q = next((layer["quant"] for layer in i["layers"] if layer.get("quant")), None)
        quant = {} if q is None else {"quant": f"{q['format']} g{q['group']} residual {q['residual']}"}
        return summary("GenerationState", batch=i["batch"], length=i["length"], lengths=self.lengths,
                       layers=len(i["layers"]), dtype=i["dtype"], **quant,
                       committed=human_bytes(t.get("committed_bytes", 0)))

    def _repr_html_(self) -> str:
        if self.closed:
            return "<b>GenerationState</b> (closed)"
        i = self.info()
        t = i["totals"]
        lengths = self.lengths.tolist()
        shown = ", ".join(map(str, lengths[:8])) + (f", ... ({len(lengths)} sequences)" if len(lengths) > 8 else "")
        sections = {"state": [("batch", i["batch"]), ("length", i["length"]), ("lengths", shown),
                              ("dtype", i["dtype"]), ("layers", len(i["layers"])),
                              ("committed", human_bytes(t.get("committed_bytes", 0))),
                              ("live", human_bytes(t.get("live_bytes", 0)))],
                    "layers": [(f"{l.get('layer')}: {l.get('present_key')}",
                                f"capacity {human_count(l.get('capacity') or 0)}, committed "
                                f"{human_bytes(l.get('committed_bytes') or 0)}, live {human_bytes(l.get('live_bytes') or 0)}")
                               for l in i["layers"]]}
        return html_table("GenerationState", sections)
