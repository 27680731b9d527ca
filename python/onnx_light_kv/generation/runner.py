"""Runners: how one generation step executes a decoder session.

A runner owns the KV state of ``batch`` rows (sequences or beams) and exposes the operations the
strategies need; every strategy is written against these only:

* ``run(ids, mask=None)``: append ``ids [batch, s]`` (with their attention-mask columns, 1 by
  default) and return the logits ``[batch, s, vocab]``;
* ``reorder(rows)``: the new row ``i`` is old row ``rows[i]`` (beam search; also expands a
  prefilled batch into beams);
* ``truncate(n)``: keep the first ``n`` positions (speculative decoding undoes rejected drafts);
* ``length``, ``cache_bytes()``, ``close()``.

:class:`StateRunner` is the cache path (``session.create_state``): feeds without pasts, the
state's caches hold the K/V. Both give the same tokens.

:class:`TensorRunner` is the standard tensor path: the presents of one run are fed back as the
next run's pasts (the arrays the session returned, without a copy), ``reorder`` takes along the
batch axis and ``truncate`` slices the pasts. Shared-buffer models (onnxruntime-genai exports)
get their buffers once: ``capacity`` positions, or for a window-sized buffer
(:attr:`KVInput.window`, GroupQueryAttention ``sliding_window_cache=1``) the window's positions,
which onnxruntime-genai allocates and onnxruntime fills with the most recent positions; such a
buffer has dropped the older ones, so ``truncate`` raises ``NotImplementedError`` on it (use the
cache path, which keeps every position).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Union

import numpy as np

from .. import _system
from .._dtypes import cache_dtype
from .decoder_io import DecoderIO

__all__ = ["TensorRunner", "StateRunner", "make_runner", "cache_path_available", "require_truncate", "step_feeds"]


def _prepare(runner: Any, ids: Any, mask: Optional[np.ndarray]) -> Any:
    """Validate a run's ids and new mask columns; return (ids, full mask, total length)."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.shape[0] != runner.batch or ids.shape[1] == 0:
        raise ValueError(f"ids must be [{runner.batch}, s] with s > 0, got shape {ids.shape}")
    s = ids.shape[1]
    if mask is None:
        new_mask = np.ones((runner.batch, s), np.int64)
    else:
        new_mask = np.asarray(mask, dtype=np.int64)
        if new_mask.shape != ids.shape:
            raise ValueError(f"mask shape {new_mask.shape} differs from ids shape {ids.shape}")
        if not runner.supports_padding and not new_mask.all():
            raise ValueError("this model cannot run padded rows (it has no attention_mask input or its pasts "
                             "are fixed-capacity buffers); run the rows separately")
    full = np.concatenate([runner._mask, new_mask], axis=1) if runner.length else new_mask
    return ids, full, runner.length + s


def step_feeds(io: DecoderIO, ids: np.ndarray, full_mask: np.ndarray, length: int) -> Dict[str, Any]:
    """The feeds of one run except the pasts: ``ids [batch, s]`` after ``length`` positions,
    ``full_mask [batch, length + s]`` the attention mask of all positions (0: left padding).
    Positions count only unpadded tokens (transformers' rule); padding positions get 0."""
    s = ids.shape[1]
    feeds: Dict[str, Any] = {io.input_ids: ids.astype(io.int_types["input_ids"], copy=False)}
    if io.attention_mask is not None:
        feeds[io.attention_mask] = full_mask.astype(io.int_types["attention_mask"], copy=False)
    if io.position_ids is not None:
        pos = np.cumsum(full_mask[:, length:], axis=1) + full_mask[:, :length].sum(axis=1, keepdims=True) - 1
        feeds[io.position_ids] = np.maximum(pos, 0).astype(io.int_types["position_ids"], copy=False)
    if io.cache_position is not None:
        feeds[io.cache_position] = np.arange(length, length + s, dtype=io.int_types["cache_position"])
    if io.use_cache_branch is not None:
        feeds[io.use_cache_branch] = np.array([length > 0])
    return feeds


class TensorRunner:
    """Runs a decoder on the tensor past/present path (see the module docstring).

    ``capacity`` is the most positions the rows will hold; it sizes the pre-allocated past
    buffers of shared-buffer models (onnxruntime GroupQueryAttention exports) and is checked on
    every run for them."""

    resizable = True
    kind = "tensor"

    def __init__(self, session: Any, io: DecoderIO, batch: int, capacity: Optional[int] = None) -> None:
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        if io.shared_buffer and not capacity:
            raise ValueError("this model's pasts are fixed-capacity buffers: the generation needs a capacity "
                             "(max_length)")
        self.session, self.io, self.batch, self.capacity = session, io, batch, capacity
        self.length = 0
        self._mask = np.zeros((batch, 0), np.int64)
        self._pasts: Dict[str, np.ndarray] = {}
        self._empty_pasts()
        self._outputs = io.output_names

    def _empty_pasts(self) -> None:
        def size(kv: Any) -> int:
            return (kv.window or self.capacity) if kv.shared_buffer else 0
        self._pasts = {kv.past: np.zeros((self.batch, kv.kv_heads, size(kv), kv.head_dim), kv.dtype)
                       for kv in self.io.kv}

    @property
    def supports_padding(self) -> bool:
        """True when rows of different lengths (left padding) can share a run
        (:attr:`DecoderIO.left_padding`)."""
        return self.io.left_padding

    def run(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Append ``ids [batch, s]`` and return the logits ``[batch, s, vocab]`` of the new positions.

        ``mask [batch, s]`` marks padding (0) among the new tokens; only models with an
        ``attention_mask`` input and growing pasts accept zeros."""
        io = self.io
        ids, full, total = _prepare(self, ids, mask)
        if io.shared_buffer and total > self.capacity:
            raise ValueError(f"{total} positions exceed the past buffers' capacity {self.capacity}")
        feeds = step_feeds(io, ids, full, self.length)
        feeds.update(self._pasts)
        outs = self.session.run(self._outputs, feeds)
        self._pasts = {kv.past: outs[j + 1] for j, kv in enumerate(io.kv)}
        self._mask = full
        self.length = total
        return np.asarray(outs[0])

    def reorder(self, rows: np.ndarray) -> None:
        """Row ``i`` becomes old row ``rows[i]``; the number of rows may change (beam expansion)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1 or rows.size == 0:
            raise ValueError(f"rows must be a non-empty 1-D index array, got shape {rows.shape}")
        if rows.min() < 0 or rows.max() >= self.batch:
            raise IndexError(f"row index out of range [0, {self.batch})")
        if rows.size == self.batch and np.array_equal(rows, np.arange(self.batch)):
            return
        self._pasts = {n: np.take(a, rows, axis=0) for n, a in self._pasts.items()}
        self._mask = self._mask[rows]
        self.batch = int(rows.size)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions of every row."""
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate length {n} outside [0, {self.length}]")
        if n == self.length:
            return
        require_truncate(self, "truncate")
        if not self.io.shared_buffer:
            self._pasts = {name: a[:, :, :n] for name, a in self._pasts.items()}
        self._mask = self._mask[:, :n]
        self.length = n

    @property
    def can_truncate(self) -> bool:
        """False for window-sized shared buffers (:attr:`DecoderIO.window_buffers`): they hold
        only the most recent positions, so no earlier length can be restored."""
        return not self.io.window_buffers

    def cache_bytes(self) -> int:
        """Bytes of the K/V the rows hold now (the past tensors or buffers)."""
        return int(sum(a.nbytes for a in self._pasts.values()))

    def close(self) -> None:
        """Drop the pasts (the runner can run again from an empty state)."""
        self.length = 0
        self._mask = np.zeros((self.batch, 0), np.int64)
        self._empty_pasts()


class StateRunner:
    """Runs a decoder on its cache path: one ``GenerationState`` (``session.create_state``)
    holds the rows' KV caches; runs feed only the new tokens (``session.run(..., state=)``),
    ``reorder`` / ``truncate`` are the state's own (no copy of the whole past for a
    permutation, none at all for a truncation). The number of rows is fixed at creation."""

    resizable = False
    kind = "state"

    def __init__(self, session: Any, io: DecoderIO, batch: int, capacity: Optional[int],
                 options: Dict[str, Any], stores_all: bool = False) -> None:
        """``capacity``: the positions a generation may reach; the state must hold all of them
        when ``stores_all`` (a ``Generator``, whose appends run every position), else all but
        the last (``generate``: the last new token is never run)."""
        opts = dict(options)
        need = None if not capacity else int(capacity) - (0 if stores_all else 1)
        if "batch" in opts:
            raise ValueError("state_options must not set 'batch': the rows come from the prompt (and num_beams)")
        if capacity and "max_length" not in opts:
            if _reservable(io, batch, int(capacity), opts):
                opts["max_length"] = int(capacity)
            # else the caches grow on demand: a generation allowed far more tokens than memory
            # holds (max_new_tokens=10**9) stops at eos like on the tensor path, and fails with
            # the budget's error only if it really grows that long
        elif need is not None and opts["max_length"] is not None and int(opts["max_length"]) < need:
            # refused before any token is made (the state would run out of room mid-way)
            what = ("max_length positions the Generator may append" if stores_all else
                    "positions this generation may store (the prompt, padding included, and every new token "
                    "but the last)")
            raise ValueError(f"state_options max_length={opts['max_length']} cannot hold the {need} {what}; "
                             "raise it or leave it out")
        self.session, self.io, self.batch = session, io, batch
        self.state = session.create_state(batch=batch, **opts)
        self._prefix = bool(opts.get("prefix_cache"))
        self.length = 0
        self._mask = np.zeros((batch, 0), np.int64)
        self._outputs = [io.logits]

    @property
    def supports_padding(self) -> bool:
        """True when the model takes an attention mask (the state stores no padding) and is not
        a GroupQueryAttention model (its mask is a per-row length)."""
        return self.io.attention_mask is not None and not self.io.group_query_attention

    def run(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """Append ``ids [batch, s]`` to the state and return the logits ``[batch, s, vocab]``.
        On a ``prefix_cache`` state the first run of one unpadded row reuses a registered
        prefix of ``ids`` and returns the logits of the positions it ran (the last one always)."""
        if self._prefix and self.length == 0 and self.batch == 1 and (mask is None or np.all(mask)):
            arr = np.asarray(ids)
            if arr.ndim == 2 and arr.shape[1] > 1:
                n = self.reuse_prefix(arr[0])
                if n:
                    ids = arr[:, n:]
                    mask = None if mask is None else np.asarray(mask)[:, n:]
        ids, full, total = _prepare(self, ids, mask)
        try:
            out = self.session.run(self._outputs, step_feeds(self.io, ids, full, self.length), state=self.state)
        except BaseException:
            # a run that raised after the state took the tokens (a KeyboardInterrupt arriving as
            # the native call returned) leaves the state ahead of this runner: give them back
            if not self.state.closed and self.state.length > self.length:
                self.state.truncate(self.length)
            raise
        self._mask = full
        self.length = total
        return np.asarray(out[0])

    def reuse_prefix(self, ids: np.ndarray) -> int:
        """On an empty ``prefix_cache`` state of one row: attach the longest registered prefix
        of the 1-D ``ids`` (see ``GenerationState.reuse_prefix``; it always leaves the last
        token to run) and return how many positions it covers; 0 otherwise. The runner then
        holds those positions, so the next :meth:`run` feeds ``ids[n:]``."""
        if not (self._prefix and self.length == 0 and self.batch == 1):
            return 0
        n = int(self.state.reuse_prefix(np.asarray(ids, np.int64)))
        if n:
            self._mask = np.ones((1, n), np.int64)
            self.length = n
        return n

    def reorder(self, rows: np.ndarray) -> None:
        """Row ``i`` becomes old row ``rows[i]`` (``batch`` indices: the row count is fixed)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1 or rows.size != self.batch:
            raise ValueError(f"a state of {self.batch} rows reorders with {self.batch} indices, got shape {rows.shape}")
        if np.array_equal(rows, np.arange(self.batch)):
            return
        self.state.reorder(rows)
        self._mask = self._mask[rows]

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions of every row."""
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate length {n} outside [0, {self.length}]")
        if n == self.length:
            return
        self.state.truncate(int(n))
        self._mask = self._mask[:, :n]
        self.length = n

    #: the state keeps every position, window-sized buffers' layers included
    can_truncate = True

    def cache_bytes(self) -> int:
        """Bytes the state's caches have committed."""
        return int(self.state.info()["totals"].get("committed_bytes", 0))

    def close(self) -> None:
        """Release the state's caches."""
        self.state.close()


def _element_bytes(options: Dict[str, Any]) -> float:
    """About how many bytes a state of these ``create_state`` options stores per K/V element:
    int8 / int4 with their scales, else the storage type (4 when it is not given: the widest)."""
    quant = options.get("quant")
    if quant == "int8":
        return 1.25
    if quant == "int4":
        return 0.75
    if options.get("dtype") is None:
        return 4
    try:
        return cache_dtype(options["dtype"]).itemsize
    except TypeError:  # create_state reports it
        return 4


def _reservable(io: DecoderIO, batch: int, capacity: int, options: Dict[str, Any]) -> bool:
    """Whether a state of ``options`` may reserve ``capacity`` positions of ``batch`` rows up
    front: their K/V (:func:`_element_bytes` per element) fit the options' ``budget`` and a
    quarter of the machine's memory. A reservation saves the copies of growing; one beyond
    these would only fail before the first token."""
    budget = options.get("budget")
    per_token = sum(kv.kv_heads * kv.head_dim for kv in io.kv)  # elements (io.kv: each past, keys and values)
    need = int(per_token * batch * capacity * _element_bytes(options))
    limit = _system.physical_memory() // 4
    if budget is not None:
        try:
            limit = min(limit, int(budget))
        except (TypeError, ValueError):  # create_state reports a bad budget itself
            pass
    return need <= limit


def require_truncate(runner: Any, what: str) -> None:
    """Raise ``NotImplementedError`` when ``runner`` cannot truncate (a tensor path over
    window-sized shared buffers), naming ``what`` needed it."""
    if not runner.can_truncate:
        raise NotImplementedError(
            f"{what} on the tensor path of a model with window-sized shared buffers (GroupQueryAttention "
            "sliding_window_cache=1) is not implemented: the buffers keep only the most recent positions; "
            "run it on the cache path (state_options=None), which keeps every position")


def cache_path_available(session: Any) -> bool:
    """True when ``session`` has the cache path (``create_state``) and its ``cache_plan()``
    rewrites every layer."""
    if not hasattr(session, "create_state") or not hasattr(session, "cache_plan"):
        return False
    plan = session.cache_plan()
    return bool(plan) and all(p.get("rewritten") for p in plan)


def paged_states_available(session: Any) -> bool:
    """True when ``session.create_state`` takes a ``layout`` (the paged cache layout)."""
    import inspect

    try:
        return "layout" in inspect.signature(session.create_state).parameters
    except (AttributeError, TypeError, ValueError):  # no create_state, or no signature to read
        return False


class FallbackRunner:
    """The runner ``state_options=None`` gives on the cache path: a :class:`StateRunner` that
    gives way to a :class:`TensorRunner` when its first run raises ``NotImplementedError``: a
    form the cache plan accepted but a run refuses (a mask the graph builds that is not causal
    plus left padding, such as a per-head bias the model file does not declare). That run left
    the state unchanged, so the tensor path starts from the same point; a ``RuntimeWarning``
    says so. Every other attribute is the current runner's."""

    def __init__(self, runner: "StateRunner", tensor: Any) -> None:
        """``tensor()`` makes the tensor-path runner."""
        self._runner: Any = runner
        self._tensor = tensor

    def run(self, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """:meth:`StateRunner.run`, or after a refused first run, :meth:`TensorRunner.run`."""
        if self._tensor is not None and self._runner.length == 0:
            try:
                return self._runner.run(ids, mask)
            except NotImplementedError as e:
                replacement = self._tensor()
                self._runner.close()
                self._runner, self._tensor = replacement, None
                warnings.warn(f"the cache path refused this model at its first run ({e}); it runs on the tensor "
                              "path instead (state_options=False avoids the attempt)", RuntimeWarning, stacklevel=3)
            else:
                self._tensor = None  # the cache path ran: it stays
        return self._runner.run(ids, mask)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


def make_runner(session: Any, io: DecoderIO, batch: int, capacity: Optional[int],
                state_options: Union[None, bool, Dict[str, Any]] = None,
                stores_all: bool = False, fallback: Optional[bool] = None
                ) -> Union[TensorRunner, StateRunner, FallbackRunner]:
    """The runner for ``session`` (``stores_all``: see :class:`StateRunner`).

    ``state_options``: None picks the cache path when :func:`cache_path_available` (a
    :class:`FallbackRunner`: the tensor path if the first run is refused), else the tensor
    path (``fallback=True`` gives the same fallback to a dict the caller chose for the user:
    beam search's paged layout); False forces the tensor path; a dict (keyword arguments of
    ``session.create_state``: ``dtype``, ``budget``, ``max_length``) requires the cache path
    and raises ``NotImplementedError`` when the session has none (``create_state``'s own
    ``NotImplementedError`` gives the layers' reasons)."""
    if state_options is False:
        return TensorRunner(session, io, batch, capacity)
    if state_options is None or state_options is True:
        if cache_path_available(session):
            runner = StateRunner(session, io, batch, capacity, {}, stores_all)
            if state_options is None or fallback:
                return FallbackRunner(runner, lambda: TensorRunner(session, io, batch, capacity))
            return runner
        if state_options is None:
            return TensorRunner(session, io, batch, capacity)
        state_options = {}
    if not isinstance(state_options, dict):
        raise TypeError(f"state_options must be None, a bool or a dict, got {type(state_options).__name__}")
    if not hasattr(session, "create_state"):
        raise NotImplementedError(
            f"state_options needs the cache path, but {type(session).__name__} has no create_state(); "
            "leave state_options=None to run on the tensor past/present path")
    runner = StateRunner(session, io, batch, capacity, state_options, stores_all)
    if fallback:
        return FallbackRunner(runner, lambda: TensorRunner(session, io, batch, capacity))
    return runner
