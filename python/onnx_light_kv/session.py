"""onnxruntime-style inference sessions over the Go runtime.

``InferenceSession(path_or_bytes, *, threads=None)`` loads a standard ONNX
model, resolves every node's kernel once (an unsupported op raises
``NotImplementedError`` naming the op, its domain and opset), and runs it
repeatedly with ``run(output_names, feeds)``, like onnxruntime.

Feeds are passed to Go without copying (C-contiguous, aligned numpy arrays
are used in place; others are copied once). Outputs of at least
``LEND_MIN_BYTES`` (the present tensors of a decoder) are not copied: the
returned array wraps the Go buffer, which the session reuses only after the
array and every view of it are gone. Smaller outputs are copied once, from
Go memory into a numpy array allocated here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._dtypes import CODES, bfloat16, cache_dtype
from ._format import html_table, summary
from ._session_options import (CPU_PROVIDER, ExecutionMode, GraphOptimizationLevel, ModelMetadata, SessionOptions,
                               check_providers)
from .cache import BLOCK_SIZES, DEFAULT_BLOCK_SIZE, DEFAULT_QUANT_GROUP, DEFAULT_RESIDUAL, _layout as check_layout
from .cache import _NO_QUANT, _Uncopyable, _quant_block_size, _quant_options
from .state import GenerationState
from ._validate import integer, optional_integer

__all__ = ["InferenceSession", "SessionOptions", "NodeArg", "ModelMetadata", "GraphOptimizationLevel", "ExecutionMode",
           "GenerationState", "supported_ops", "LEND_MIN_BYTES"]

#: Outputs of at least this many bytes are lent (wrapped, not copied); below
#: it a copy is cheaper than the wrapper object and its release call.
LEND_MIN_BYTES = 128 * 1024

#: numpy dtype <-> ONNX TensorProto element code
_TO_CODE: Dict[np.dtype, int] = {
    np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int32): 6,
    np.dtype(np.int64): 7, np.dtype(np.bool_): 9, np.dtype(np.float16): 10, np.dtype(np.float64): 11,
    np.dtype(np.uint16): 4, np.dtype(np.int16): 5, np.dtype(np.uint32): 12, bfloat16: 16,
}
_FROM_CODE: Dict[int, np.dtype] = {v: k for k, v in _TO_CODE.items()}


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output, like onnxruntime's NodeArg: ``name``,
    ``type`` ("tensor(float)") and ``shape`` (ints, symbolic names, or None
    for an unknown dimension; None for an unknown rank)."""

    name: str
    type: str
    shape: Optional[List[Union[int, str, None]]]

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class InferenceSession(_Uncopyable):
    """Runs a standard ONNX model on the CPU.

    ``path_or_bytes`` is a file path (external data files are read from its
    folder) or the serialized model (``bytes``/``bytearray``/``memoryview``;
    ``external_data_dir`` names the folder for external data then).
    ``threads`` is the kernel thread count (None: all CPUs, or
    ``sess_options.intra_op_num_threads``); ``profile`` records per-node
    events, read from :attr:`last_run_stats` (None:
    ``sess_options.enable_profiling``); see :class:`SessionOptions` for
    the onnxruntime options that apply. ``providers`` and
    ``provider_options`` follow onnxruntime: this runtime runs on the CPU,
    and any other provider falls back to it with a warning (once per
    provider name).

    There is no ``io_binding()``: ``run`` already uses feeds in place and
    hands large outputs to numpy without a copy, so feeding a run's present
    tensors back as the next run's past costs no copy.

    Memory: a model file or external data file of 16 MiB or more is
    memory-mapped (copy on write, as onnxruntime maps external data), and
    the weights the session packs are released once packed, so a model's
    weights are held about once. Do not truncate or rewrite those files in
    place while the session is alive (write a new export elsewhere), or
    turn mapping off with
    ``sess_options.add_session_config_entry("olkv.map_model_files", "0")``:
    the files are then read into memory. :meth:`close` (or collecting the
    session) unmaps them, after the runs under way have finished.

    Copies: a session cannot be copied (``copy.copy``, ``copy.deepcopy``) or
    pickled: TypeError. It owns the loaded model in native memory through a
    handle that is valid only in the process that created it (a copy would
    close the original's model when collected). Share the same session
    instead (it runs from several threads, one state per thread); another
    process loads the model into an ``InferenceSession`` of its own.
    """

    def __init__(self, path_or_bytes: Union[str, os.PathLike, bytes, bytearray, memoryview],
                 sess_options: Optional[SessionOptions] = None, providers: Optional[Sequence[Any]] = None,
                 provider_options: Optional[Sequence[Mapping[str, Any]]] = None, *,
                 threads: Optional[int] = None, profile: Optional[bool] = None,
                 external_data_dir: Optional[str] = None) -> None:
        self._h = 0
        # prepared run signatures by (feed names, output names or None, cache path)
        self._signatures: Dict[tuple, _Signature] = {}
        # the file it came from (onnxruntime's sessions keep the same private attribute): generation
        # reads sizes a graph leaves symbolic from it (see generation.decoder_io)
        self._model_path: Optional[str] = None
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise TypeError(f"sess_options must be an onnx_light_kv.SessionOptions, got {type(sess_options).__name__}")
        self._providers = check_providers(providers, provider_options)
        opts = sess_options or SessionOptions()
        opts._log_ignored()
        self._options = opts
        if threads is None:
            threads = opts.intra_op_num_threads or 0
        threads = integer(threads, "threads", lo=0, hi=1024)
        prof = bool(opts.enable_profiling if profile is None else profile)
        map_min = 0 if opts._map_model_files() else -1
        # (Ctrl-C during a long load arrives once the session is owned here: close() frees it)
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            if isinstance(path_or_bytes, memoryview) and not path_or_bytes.c_contiguous:
                raise ValueError("InferenceSession: the model memoryview is not contiguous: pass bytes(view) "
                                 "or a contiguous view")
            buf = np.frombuffer(path_or_bytes, dtype=np.uint8)
            with _lib.deferred_interrupts():
                self._h = _lib.call(_lib.fn("SessionNewBytes"), buf.ctypes.data if buf.size else 0, int(buf.size),
                                    external_data_dir or "", int(threads), prof, map_min)
        elif isinstance(path_or_bytes, (str, os.PathLike)):
            try:
                os.fspath(path_or_bytes).encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"the model path {os.fspath(path_or_bytes)!r} is not valid UTF-8, which the "
                                 "runtime needs: rename the file (or pass its bytes)") from None
            except AttributeError:  # a bytes path
                raise TypeError("InferenceSession takes a str path or the model bytes, got a bytes path") from None
            with _lib.deferred_interrupts():
                self._h = _lib.call(_lib.fn("SessionNewPath"), os.fspath(path_or_bytes), int(threads), prof, map_min)
            self._model_path = os.fspath(path_or_bytes)
        else:
            raise TypeError(f"InferenceSession takes a path or the model bytes, got {type(path_or_bytes).__name__}")
        io = json.loads(_lib.call(_lib.fn("SessionIOJSON"), self._h))
        self._inputs = [_node_arg(d) for d in io["inputs"]]
        self._outputs = [_node_arg(d) for d in io["outputs"]]
        self._output_names = [o.name for o in self._outputs]
        self._opsets: Dict[str, int] = io["opsets"]
        self._threads: int = io["threads"]
        self._meta: Dict[str, Any] = io.get("meta", {})
        self._cache_plan: Optional[List[Dict[str, Any]]] = None
        self._past_names = frozenset(n for d in self._plan() for n in (d["past_key"], d["past_value"]))

    # -- onnxruntime-compatible surface --------------------------------------------------
    def get_inputs(self) -> List[NodeArg]:
        """The inputs a caller feeds (initializer-backed inputs excluded)."""
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        """The graph outputs, in order."""
        return list(self._outputs)

    def get_providers(self) -> List[str]:
        """Always ``["CPUExecutionProvider"]``: this runtime runs on the CPU."""
        return list(self._providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        """Options of the providers in use: ``{"CPUExecutionProvider": {}}``."""
        return {CPU_PROVIDER: {}}

    def get_session_options(self) -> SessionOptions:
        """The :class:`SessionOptions` the session was created with."""
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata (producer, graph name, domain, doc string,
        version and ``metadata_props`` as ``custom_metadata_map``)."""
        return ModelMetadata(self._meta, self._opsets)

    def io_binding(self) -> Any:
        """Not provided: ``run`` is already zero-copy (see the class docstring)."""
        raise NotImplementedError("io_binding() is not provided: run() uses feeds in place and returns large "
                                  "outputs without a copy, so feed the outputs of one run to the next directly")

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Any = None, *, state: Optional[GenerationState] = None) -> List[np.ndarray]:
        """Run the model; return the requested outputs (all if None) as numpy arrays.

        ``run_options`` (onnxruntime's ``RunOptions``) is accepted for compatibility and has
        no effect.

        Outputs of at least ``LEND_MIN_BYTES`` wrap the session's own buffer
        (no copy): they stay valid as long as they are referenced, and the
        buffer is reused by later runs only after the array and all its views
        are gone. Feeding them back (present -> past) costs no copy either.

        With ``state`` (from :meth:`create_state`) the model runs on its cache
        path: ``input_feed`` holds only the new tokens' inputs (feeding a past
        raises ValueError naming it), the new K/V are appended to the state's
        caches and attention reads them in place; a present is exported from
        the cache only when ``output_names`` names it, in
        :meth:`GenerationState.export`'s layout: each sequence's stored tokens
        first, zero-filled at the end. The cache stores no left padding, so for
        a left-padded sequence that differs from the graph's own present (its
        padding positions first): feed it back only to a state, not as a past
        with the same attention mask. A failed run leaves the state unchanged.

        The first run with a given set of feed names (in their order), output
        names and path resolves and checks the names once (missing, unknown and
        duplicate inputs, pasts fed with a state, unknown outputs raise there);
        later runs with the same names pass only the arrays, whose dtypes,
        ranks and fixed dimensions are checked on every run."""
        if not self._h:
            raise ValueError("the session is closed")
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):
            raise TypeError("input_feed must be a dict of name -> array")
        if isinstance(output_names, (str, bytes)):
            raise TypeError(f"output_names must be a list of output names or None, not {type(output_names).__name__}")
        sh = 0
        if state is not None:
            if type(state) is not GenerationState and not isinstance(state, GenerationState):
                raise TypeError(f"state must be a GenerationState, got {type(state).__name__}")
            if state._session is not self:
                raise ValueError("the state belongs to another session")
            sh = state._handle()
            for name in ("input_ids", "attention_mask"):  # the decoder inputs that carry the batch
                a = input_feed.get(name)
                shape = np.shape(a) if a is not None else ()
                if len(shape) >= 1 and shape[0] != state.batch:
                    raise ValueError(f"{name} has {shape[0]} sequences (shape {tuple(shape)}); the state holds "
                                     f"{state.batch}: feed a batch of the state's size, or create a state of "
                                     f"batch={shape[0]}")
        keys = tuple(input_feed)
        outs_key = None if output_names is None else tuple(output_names)
        sig = self._signatures.get((keys, outs_key, sh != 0))
        if sig is None:  # first run of these names: every check that depends only on them
            sig = self._prepare(keys, outs_key, sh != 0)
        # feeds as C-contiguous aligned arrays, described as [reference, code, rank, dims...]
        arrays = []
        desc: List[int] = []
        addr = _lib.addr
        for k in keys:
            a = input_feed[k]
            if type(a) is not np.ndarray:
                a = np.asarray(a)
            code = _TO_CODE.get(a.dtype)
            if code is None:
                raise TypeError(f"input {k!r} has unsupported dtype {a.dtype} "
                                f"(supported: {', '.join(str(d) for d in _TO_CODE)})")
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned):
                a = np.require(a, requirements=["C", "A"])
            arrays.append(a)
            desc.append(addr(a))
            desc.append(code)
            desc.append(a.ndim)
            desc.extend(a.shape)
        d = np.array(desc, dtype=np.int64)
        # the description, then one value for the result handle (see SessionRunPrepared)
        meta = sig.meta.pop() if sig.meta else np.empty(sig.meta_len + 1, dtype=np.int64)
        meta[0] = meta[-1] = 0
        taken = [False]  # _outputs owns the result and the loans
        try:
            rh = _lib.call(_RUN_PREPARED, self._h, sh, sig.handle, addr(d) if d.size else 0, int(d.size),
                           LEND_MIN_BYTES, addr(meta), int(meta.size))
            m = meta.tolist()[:-1]
            if m[0] < 0:  # outputs of a rank the description array had no room for
                more = np.empty(-m[0], dtype=np.int64)
                _lib.call(_DESCRIBE, rh, addr(more), int(more.size))
                m = more.tolist()
            outs = _outputs(rh, m, taken)
            sig.meta.append(meta)
            return outs
        except BaseException:
            if not taken[0]:  # a KeyboardInterrupt raised as the run returned: free what it made
                _drop_orphaned(meta)
            raise
        finally:
            del arrays  # feeds had to stay alive until the copy

    def _prepare(self, keys: tuple, outs: Optional[tuple], cache_path: bool) -> "_Signature":
        """Resolve a run's feed and output names once (missing, unknown or duplicate names
        raise here, as they would on every run) and keep the signature for later runs."""
        # (a name of another type would be str()-ed below and reported as an unknown name)
        for what, names in (("input_feed keys", keys), ("output_names", outs or ())):
            bad = next((n for n in names if not isinstance(n, str)), None)
            if bad is not None:
                raise TypeError(f"{what} must be str names, got {type(bad).__name__} {bad!r}")
        if cache_path:
            fed = sorted(str(k) for k in keys if k in self._past_names)
            if fed:
                raise ValueError(f"past input(s) {', '.join(fed)} must not be fed with a state "
                                 "(the state holds the caches)")
        feed_json = json.dumps([str(k) for k in keys])
        out_json = "" if outs is None else json.dumps([str(o) for o in outs])
        h = _lib.call(_PREPARE, self._h, int(cache_path), feed_json, out_json)
        n_out = len(self._outputs) if outs is None else len(outs)
        sig = _Signature(h, 1 + n_out * (4 + _META_RANK))
        if len(self._signatures) >= _MAX_SIGNATURES:  # a caller cycling through name sets: start over
            self._signatures.clear()  # each is freed once no run in flight holds it
        self._signatures[(keys, outs, cache_path)] = sig
        return sig

    # -- cache path ---------------------------------------------------------------------
    def cache_plan(self) -> List[Dict[str, Any]]:
        """The cache rewrite's verdict, one dict per past/present pair (layer order):
        ``layer``, ``past_key``, ``past_value``, ``present_key``, ``present_value``,
        ``rewritten`` (bool), ``rule`` (the rule that rewrote it), ``reason`` (why the
        layer stays on the tensor path; empty when rewritten) and ``window_buffer`` (the
        positions of a window-sized present buffer, GroupQueryAttention's
        ``sliding_window_cache=1``; 0 for none)."""
        return [dict(d) for d in self._plan()]

    def create_state(self, *, batch: int = 1, max_length: Optional[int] = None, dtype: Any = None,
                     budget: Optional[int] = None, layout: str = "contiguous",
                     block_size: Optional[int] = None, prefix_cache: bool = False,
                     prefix_cache_bytes: Optional[int] = None, quant: Optional[str] = None, quant_group: int = DEFAULT_QUANT_GROUP,
                     k_axis: str = "channel", residual: int = DEFAULT_RESIDUAL) -> GenerationState:
        """A new :class:`GenerationState` for :meth:`run` ``(..., state=)``: one KVCache per
        rewritten layer, ``batch`` sequences.

        Args:
            batch: sequences (or beams) of the request.
            max_length: tokens reserved per sequence; None lets the caches grow on demand
                (each growth copies the stored rows once and makes checkpoints stale).
            dtype: cache storage type ("float32", "float16", "bfloat16"); None: the model's
                K/V type. A float16/bfloat16 cache may serve a float32 model.
            budget: bytes the state's caches may take (an arena of its own); None: the
                session's arena.
            layout: the caches' layout: "contiguous" (``max_length`` tokens reserved per
                sequence) or "paged" (blocks of ``block_size`` tokens taken as tokens arrive;
                ``max_length`` is a limit and None never regrows; beam reorder permutes page
                tables instead of copying beams).
            block_size: tokens per block of the paged layout (16, 32, 64, 128 or 256; None:
                :data:`onnx_light_kv.cache.DEFAULT_BLOCK_SIZE`).
            prefix_cache: share the full blocks of prompts across the session's paged states:
                a batch-1 state registers the blocks of the ``input_ids`` it runs (keyed by a
                chained hash of the token ids), :meth:`GenerationState.reuse_prefix` attaches the
                longest registered prefix by reference, and :func:`generate` does so by itself.
                Unreferenced registered blocks are evicted least recently used when an append
                finds the budget full, and beyond the store's cap. Needs ``layout="paged"`` and
                the session's arena (no ``budget``).
            prefix_cache_bytes: the cap on the bytes of the session's registered prefix blocks
                (every layer; blocks live states share count too and stay), set for the whole
                session; None keeps the cap, at first a quarter of the memory available when
                the first prefix-cache state was created. ``info()["prefix_cache"]`` reports
                ``registered_bytes`` and ``max_bytes``.
            quant, quant_group, k_axis, residual: quantized caches, as
                :class:`onnx_light_kv.KVCache` takes them: None (every row in ``dtype``),
                ``"int8"`` or ``"int4"``; tokens per sealed chunk (32 or 64); K scales per
                ``"channel"`` or per ``"token"``; the most recent tokens kept in ``dtype``.
                A growing state (``max_length=None``) copies the sealed chunks as they are. With
                ``layout="paged"`` the blocks are the sealed chunks (``block_size`` must equal
                ``quant_group``, its default there); ``prefix_cache`` is not supported.

        Raises:
            NotImplementedError: the model stays on the tensor path (the reasons of
                :meth:`cache_plan` are in the message); ``quant`` with ``prefix_cache``.
            ValueError: bad sizes, an unknown layout or block size, bad quantization options
                (an odd head dim with int4). TypeError: unsupported dtype.
            BudgetError: the budget cannot hold the caches.
        """
        if not self._h:
            raise ValueError("the session is closed")
        batch = integer(batch, "batch", lo=1)
        max_len = optional_integer(max_length, "max_length", lo=1) or 0
        bud = optional_integer(budget, "budget", lo=1) or 0
        code = -1 if dtype is None else CODES[cache_dtype(dtype)]
        layout = check_layout(layout, block_size)
        if not isinstance(prefix_cache, bool):
            raise TypeError(f"prefix_cache must be a bool, got {type(prefix_cache).__name__}")
        if prefix_cache and layout != "paged":
            raise ValueError("prefix_cache=True needs layout='paged'")
        prefix_cap = optional_integer(prefix_cache_bytes, "prefix_cache_bytes", lo=1) or 0
        if prefix_cap and not prefix_cache:
            raise ValueError("prefix_cache_bytes needs prefix_cache=True")
        q = _quant_options(quant, quant_group, k_axis, residual)
        bs = 0
        if layout == "paged":
            bs = DEFAULT_BLOCK_SIZE if block_size is None else integer(block_size, "block_size", lo=1)
            if bs not in BLOCK_SIZES:
                raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {bs}")
            if q is not None:
                bs = _quant_block_size(block_size, q[1])
        with _lib.deferred_interrupts():  # the new state reaches its owner before a Ctrl-C does
            h = _lib.call(_lib.fn("StateNew"), self._h, batch, max_len, code, bud, int(layout == "paged"), bs,
                          int(prefix_cache), prefix_cap, *(q if q is not None else _NO_QUANT))
            try:
                info = json.loads(_lib.call(_lib.fn("StateInfoJSON"), h))
                return GenerationState(self, h, int(batch), cache_dtype(info["dtype"]), self._plan())
            except BaseException:
                _lib.ext.kvgo_StateFree(h)  # (a GenerationState owns it only once created)
                raise

    def _plan(self) -> List[Dict[str, Any]]:
        if self._cache_plan is None:
            self._cache_plan = json.loads(_lib.call(_lib.fn("SessionCachePlanJSON"), self._h))
        return self._cache_plan

    @property
    def last_run_stats(self) -> Dict[str, Any]:
        """Figures of the latest run: ``peak_bytes`` (largest live total of
        kernel-allocated tensors), ``allocated_bytes``, ``run_ns`` (the run's
        wall time inside the Go executor, binding excluded) and ``events``
        (one dict per node: node, op, dur_ns, bytes) when profiling is on;
        ``run_ns`` minus the events' ``dur_ns`` is the executor's own time."""
        if not self._h:
            return {}
        return json.loads(_lib.call(_lib.fn("SessionLastStatsJSON"), self._h))

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the session's Go memory now (also done when collected)."""
        h, self._h = self._h, 0
        if h and not _lib.forked:  # (a forked child leaves its parent's handles alone)
            self._signatures.clear()  # freed with the session
            _lib.call(_lib.fn("SessionFree"), h)

    def __enter__(self) -> "InferenceSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    _COPY_ADVICE = ("it owns the loaded model in native memory through a handle; use the same session (it may "
                    "run from several threads) or create another InferenceSession from the model")
    _PICKLE_ADVICE = "create an InferenceSession from the model file in the receiving process"

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return not self._h

    def __repr__(self) -> str:
        if not hasattr(self, "_outputs"):  # creation failed
            return "InferenceSession(closed)"
        names = [i.name for i in self._inputs]
        return summary("InferenceSession", *(["closed"] if self.closed else []),
                       graph=repr(self._meta.get("graph_name", "")), inputs=names, outputs=list(self._output_names),
                       threads=self._threads)

    def _repr_html_(self) -> str:
        if not hasattr(self, "_outputs"):  # creation failed
            return "<b>InferenceSession</b> (closed)"

        def arg(a: NodeArg) -> tuple:
            shape = "?" if a.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in a.shape) + "]"
            return a.name, f"{a.type} {shape}"

        m = self._meta
        model = [("producer", f"{m.get('producer_name', '')} {m.get('producer_version', '')}".strip() or "-"),
                 ("graph", m.get("graph_name", "") or "-"),
                 ("opsets", ", ".join(f"{d} {v}" for d, v in sorted(self._opsets.items()))),
                 ("threads", self._threads), ("providers", ", ".join(self._providers)),
                 ("state", "closed" if self.closed else "open")]
        return html_table("InferenceSession", {"model": model, "inputs": [arg(a) for a in self._inputs],
                                               "outputs": [arg(a) for a in self._outputs]})


class _Lent:
    """Owner of a lent output buffer: the base of the numpy array that wraps
    it. Its deletion (after the array and all views are gone) hands the
    buffer back to the session's pool."""

    __slots__ = ("_h", "__array_interface__")

    def __init__(self, h: int, address: int, shape: tuple, dtype: np.dtype) -> None:
        self._h = h
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": dtype.str, "version": 3}

    def __del__(self) -> None:
        try:
            _release(self._h)
        except Exception:
            pass


_PREPARE = _lib.fn("SessionPrepare")
_SIGNATURE_FREE = _lib.fn("SignatureFree")
_RUN_PREPARED = _lib.fn("SessionRunPrepared")
_DESCRIBE = _lib.fn("ResultDescribe")
_COPY_AND_FREE = _lib.fn("ResultCopyAndFree")
_RESULT_FREE = _lib.fn("ResultFree")
#: output ranks the description array has room for without a second call
_META_RANK = 6
#: prepared signatures a session keeps
_MAX_SIGNATURES = 64
_OUTPUT_RELEASE = _lib.fn("OutputRelease")
_U16 = np.dtype(np.uint16)


def _release(h: int) -> None:
    _lib.call(_OUTPUT_RELEASE, h)


class _Signature:
    """A prepared run signature: its Go handle and spare output-description arrays
    (taken and put back per run, so concurrent runs never share one). The handle is
    freed when the object goes (a run in flight keeps it); freeing the session frees
    it too, and freeing it again does nothing."""

    __slots__ = ("handle", "meta_len", "meta")

    def __init__(self, handle: int, meta_len: int) -> None:
        self.handle = handle
        self.meta_len = meta_len
        self.meta: List[np.ndarray] = []

    def __del__(self) -> None:
        try:
            _lib.call(_SIGNATURE_FREE, self.handle)
        except Exception:
            pass


def _release_loans(m: List[int], k: int) -> None:
    """Release the lent outputs of description ``m`` from entry ``k`` on (releasing twice does
    nothing)."""
    end = m[0] + 1
    while k < end:
        j = k + 2 + m[k + 1]
        if m[j + 1]:
            _release(m[j + 1])
        k = j + 2


def _drop_orphaned(meta: np.ndarray) -> None:
    """Free a run's result that never reached :func:`_outputs` (its handle is meta's last value;
    a result of lent outputs only has none: their loans are in the description). Nothing when
    the run itself failed (meta[0] stays 0)."""
    rh = int(meta[-1])
    if rh:
        _lib.call(_RESULT_FREE, rh)  # releases the lent outputs too
    elif meta[0] > 0:
        _release_loans(meta.tolist()[:-1], 1)


def _outputs(rh: int, m: List[int], taken: List[bool]) -> List[np.ndarray]:
    """The outputs described by ``m`` (see SessionRunPrepared): lent ones wrapped, the others
    allocated here and filled by one copy call of result ``rh`` (0: nothing to copy). Sets
    ``taken[0]`` once it owns the result (from then on it frees what it does not return)."""
    outs: List[np.ndarray] = []
    refs: List[int] = []
    addr = _lib.addr
    k, end = 1, m[0] + 1  # k: the start of an output's entry
    try:
        taken[0] = True
        while k < end:
            dt = _FROM_CODE[m[k]]
            j = k + 2 + m[k + 1]  # its address and lent handle
            shape = tuple(m[k + 2:j])
            if m[j + 1]:  # lent: wrap the Go buffer, released when the array is gone
                if dt == bfloat16:
                    outs.append(np.asarray(_Lent(m[j + 1], m[j], shape, _U16)).view(bfloat16))
                else:
                    outs.append(np.asarray(_Lent(m[j + 1], m[j], shape, dt)))
                refs.append(0)
            else:
                o = np.empty(shape, dtype=dt)
                refs.append(addr(o))
                outs.append(o)
            k = j + 2
    except BaseException:
        if rh:
            _lib.call(_RESULT_FREE, rh)  # releases the lent outputs too
        else:  # release the loans not yet wrapped (the wrapped ones release themselves)
            _release_loans(m, k)
        raise
    if rh:
        r = np.array(refs, dtype=np.int64)
        _lib.call(_COPY_AND_FREE, rh, addr(r) if r.size else 0, len(refs))
    return outs


def supported_ops() -> List[str]:
    """The op kernels of the runtime as ``"domain/op [since, until]"``
    strings (domain empty for ai.onnx; until 0: no upper bound)."""
    return json.loads(_lib.call(_lib.fn("RegisteredOpsJSON")))


def _node_arg(d: Mapping[str, Any]) -> NodeArg:
    return NodeArg(name=d["name"], type=d["type"], shape=d["shape"])
