"""Continuous batching: many requests share one model call per step.

:class:`Engine` keeps the running requests' KV caches as the rows of ONE generation state
(``session.create_state``) and runs every decode step as one ``session.run(..., state=)``
over all of them, so the weights are read once per step for the whole batch. Rows have their
own lengths: a row's left padding (up to the state's logical length) is masked and not stored.

A new request's prompt is prefilled on a state of its own, in chunks of at most
``max_tokens_per_step`` tokens per step (separate model calls, after the step's decode call);
when its prompt is done its first token is chosen and its state joins the running one
(:meth:`GenerationState.adopt`: no K/V copy). Finished and aborted rows leave with
:meth:`GenerationState.select` (no copy either). Token choice reuses the generation package's
logits processors (:mod:`onnx_light_kv.generation.logits_process`) and stop conditions, one
request at a time with its own options and random stream, so each request gets exactly the
tokens ``generate`` gives it alone.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .._errors import BudgetError
from ..cache import _Uncopyable
from .. import _lib
from .._validate import integer, optional_integer
from ..generation import logits_process as lp
from ..generation.decoder_io import DecoderIO
from ..generation.options import SamplingOptions, StopCondition, check_vocabulary
from ..generation.runner import StateRunner, cache_path_available, paged_states_available, step_feeds

__all__ = ["Engine", "StepOutput", "Request"]

_log = logging.getLogger("onnx_light_kv.serve")

#: request ids, shared by every engine of the process: an id is never handed out twice, so an id
#: kept from one engine (a rebuilt server's, say) cannot reach another engine's request
_REQUEST_IDS = itertools.count(1)


class StepOutput(NamedTuple):
    """What one request produced in one :meth:`Engine.step`."""

    request_id: int
    """The id :meth:`Engine.add_request` returned."""
    tokens: List[int]
    """The new token ids of this step (one, or none for a request still prefilling or aborted)."""
    finished: bool
    """True on the request's last output (see :attr:`Request.finish_reason`)."""


@dataclass
class Request:
    """One request's prompt, options and progress (read it with :meth:`Engine.request`)."""

    request_id: int
    prompt: np.ndarray
    max_new_tokens: int
    options: SamplingOptions
    stop: StopCondition
    logprobs: Optional[int]
    rng: np.random.Generator
    tokens: List[int] = field(default_factory=list)
    """Generated token ids so far."""
    token_logprobs: List[float] = field(default_factory=list)
    """With ``logprobs``: the log-probability of each generated token under the model's
    distribution (log-softmax of the raw logits, before the sampling processors)."""
    top_logprobs: List[Dict[int, float]] = field(default_factory=list)
    """With ``logprobs=n > 0``: the ``n`` most probable tokens and their log-probabilities per step."""
    finish_reason: Optional[str] = None
    """None while running; "stop" (eos or a stop sequence), "length" (``max_new_tokens``),
    "abort", or "error" (its state or a model call it ran failed: :attr:`error` says why) when done."""
    error: Optional[str] = None
    """Why the request failed (``finish_reason == "error"``), else None."""
    arrival: float = 0.0
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None
    # internal
    _runner: Any = None
    _prefilled: int = 0
    _seq: Optional[np.ndarray] = None
    _cost: int = 0  # the cache bytes admission counts for it
    reused_tokens: int = 0
    """Prompt tokens attached from the prefix cache instead of being prefilled."""

    @property
    def finished(self) -> bool:
        """True once :attr:`finish_reason` is set."""
        return self.finish_reason is not None


def _position_bytes(info: Dict[str, Any]) -> int:
    """Bytes one cached position takes over every layer of a state, from its ``info()``."""
    size = {"float32": 4, "float16": 2, "bfloat16": 2}
    return sum(int(layer["kv_heads"]) * (int(layer["head_dim_k"]) + int(layer["head_dim_v"]))
               * size.get(str(layer["dtype"]), 4) for layer in info["layers"])


class Engine(_Uncopyable):
    """Continuous batching over one decoder :class:`~onnx_light_kv.InferenceSession`.

    ``session`` must run on the cache path (``session.cache_plan()`` rewrites every layer) and
    take an ``attention_mask`` input (rows of different lengths are left-padded in the mask),
    and ``position_ids`` unless it is a GroupQueryAttention export (else a row that joins a
    longer batch would be run at shifted positions); other models raise NotImplementedError.

    Args:
        max_batch: most requests running (decoding) or prefilling at once; more wait in a queue.
        max_tokens_per_step: most prompt tokens prefilled per step (over all new requests;
            a longer prompt is prefilled in chunks over several steps).
        budget: bytes the running requests' KV caches may reserve (None: no limit but the
            machine's). When the next request does not fit, admission pauses (it waits in the
            queue) and running requests are never failed; :meth:`add_request` refuses a request
            whose caches alone exceed it, and a budget that cannot hold the smallest request
            raises ``BudgetError`` here.
        max_length: positions per sequence, prompt included: a request whose
            ``prompt + max_new_tokens`` exceeds it is refused with ``ValueError``. On
            contiguous caches every request reserves (and the budget counts) this many
            positions. Lowered to the model's limit, ``max_positions + 1`` (the last new token
            is never run), where the model declares fewer positions (a position table).
        block_size: tokens per block of the paged cache layout (16, 32, 64, 128 or 256):
            caches take blocks as tokens arrive, and the budget counts each request's
            ``prompt + max_new_tokens`` rounded up to whole blocks. None: contiguous caches
            (or, with ``prefix_cache``, the paged layout's default block size).
        prefix_cache: share the full blocks of common prompt prefixes between requests (the
            paged layout; ``create_state(prefix_cache=True)``): a new request attaches the
            longest prefix of its prompt that earlier requests registered and prefills only
            the rest (:attr:`Request.reused_tokens`). Admission still counts a reused prefix
            as the request's own, so the budget is never exceeded by a shared block's release.
            The registered blocks themselves are capped at ``budget`` bytes where one is given
            (else at the session's default, see ``create_state(prefix_cache_bytes=)``; a
            ``state_options`` ``prefix_cache_bytes`` overrides it), least recently used
            evicted first.
        state_options: more ``create_state`` keyword arguments (``dtype`` of the caches; the
            quantization options ``quant``, ``quant_group``, ``k_axis``, ``residual``).

    A model call that fails ends the requests it ran with ``finish_reason == "error"`` (a
    prefill: that request; a decode call: the running requests, whose shared caches it may have
    left half-written) and the engine goes on with the others.

    Request ids are unique in the process: no two engines hand out the same id.

    Thread safety: :meth:`add_request`, :meth:`abort`, :meth:`stats` and :meth:`request` may be
    called from any thread while one thread runs :meth:`step`; requests added or aborted during
    a step take effect at the next one.

    An engine cannot be copied (``copy.copy``, ``copy.deepcopy``) or pickled: TypeError. It owns
    its requests and their KV caches (native memory), which a copy would share; :meth:`fresh`
    makes a new engine over the same session with the same options and no requests.
    """

    def __init__(self, session: Any, *, max_batch: int = 16, max_tokens_per_step: int = 2048,
                 budget: Optional[int] = None, max_length: int = 2048, block_size: Optional[int] = None,
                 prefix_cache: bool = False, state_options: Optional[Dict[str, Any]] = None) -> None:
        self.max_batch = integer(max_batch, "max_batch", lo=1, hi=4096)
        self.max_tokens_per_step = integer(max_tokens_per_step, "max_tokens_per_step", lo=1)
        self.max_length = integer(max_length, "max_length", lo=2)
        self.budget = optional_integer(budget, "budget", lo=1)
        if not isinstance(prefix_cache, (bool, np.bool_)):
            raise TypeError(f"prefix_cache must be a bool, got {type(prefix_cache).__name__}")
        self.paged = block_size is not None or bool(prefix_cache)
        self.prefix_cache = bool(prefix_cache)
        if self.paged and not paged_states_available(session):
            raise NotImplementedError("block_size/prefix_cache need the paged cache layout: this session's "
                                      "create_state takes no layout")
        opts = dict(state_options or {})
        for k in ("max_length", "budget", "batch", "layout", "block_size", "prefix_cache"):
            if k in opts:
                raise ValueError(f"state_options must not set {k!r}: the Engine manages it")
        prefix_cap = opts.pop("prefix_cache_bytes", None)  # (a paged prefix-cache option: set below)
        if prefix_cap is not None and not prefix_cache:
            raise ValueError("state_options prefix_cache_bytes needs prefix_cache=True")
        self.session = session
        self.io = DecoderIO.from_session(session)
        if not cache_path_available(session):
            raise NotImplementedError("the Engine batches requests on the cache path (session.create_state), and "
                                      "this session has none or does not rewrite every layer (see cache_plan())")
        if self.io.attention_mask is None:
            raise NotImplementedError("the Engine batches sequences of different lengths through the attention mask; "
                                      "this model has no attention_mask input")
        if self.io.position_ids is None and not self.io.group_query_attention:
            # a request joining a longer batch gains left padding: without position_ids (or a
            # GroupQueryAttention that reads each row's length) the model takes its positions
            # from the slot, so the row's new tokens would be rotated at the wrong positions
            raise NotImplementedError("the Engine batches requests of different lengths by left-padding the shorter "
                                      "ones, which shifts a row's positions unless the model takes position_ids (or "
                                      "is a GroupQueryAttention export); this model has neither: run generate() per "
                                      "request")
        if self.io.mask_width_branch:
            # the graph branches on the mask's width (the genai LongRoPE export's rope factors):
            # rows batched together would run as the longest one, a prompt prefilled in chunks
            # or after a reused prefix would cache its first positions at a narrower width
            if self.prefix_cache:
                raise NotImplementedError("this model branches on the attention mask's width, so a prompt prefix "
                                          "computed for another request may not be reused: prefix_cache=False")
            if self.max_batch > 1 or self.max_tokens_per_step < self.max_length:
                warnings.warn("this model branches on the attention mask's width (its result for a row depends on "
                              "the longest row it runs with and on how a prompt is split): the Engine runs one "
                              "request at a time (max_batch=1), each prompt in one call, so that each gets "
                              "generate()'s tokens", RuntimeWarning, stacklevel=2)
            self.max_batch = 1
            self.max_tokens_per_step = max(self.max_tokens_per_step, self.max_length)
        # the model runs all but a request's last new token, so it serves at most
        # max_positions + 1 positions; a longer max_length would reserve positions no request
        # can use and advertise a context (the server's default max_tokens) no request can reach
        if self.io.max_positions is not None and self.max_length > self.io.max_positions + 1:
            _log.info("max_length %d lowered to %d: the model addresses %d positions", self.max_length,
                      self.io.max_positions + 1, self.io.max_positions)
            self.max_length = self.io.max_positions + 1
        info = self._probe(opts)
        self._request_bytes = int(info["totals"].get("committed_bytes", 0))
        # bytes per cached position (all layers), from the contiguous probe's reservation
        self._position_bytes = self._request_bytes // self.max_length
        self.block_size: Optional[int] = None
        if self.paged:
            opts.update(layout="paged", prefix_cache=self.prefix_cache)
            if self.prefix_cache and (prefix_cap is not None or self.budget is not None):
                # the registered prompts' blocks: within the budget too, unless given
                opts["prefix_cache_bytes"] = prefix_cap if prefix_cap is not None else self.budget
            if block_size is not None:
                opts["block_size"] = integer(block_size, "block_size", lo=1)
            info = self._probe(opts)  # checks block_size
            self.block_size = int(info["layers"][0]["block_size"]) if info["layers"] else None
        # a quantized paged state commits its native ring (residual + quant_group rows) when
        # created, whatever its length, and one block per quant_group sealed positions beyond
        # the residual window
        quant = [layer.get("quant") for layer in info["layers"]]
        self._ring_bytes = self._sealed_position_bytes = self._residual = 0
        if self.paged and quant and all(quant):
            # (the state caps its ring at max_length rows)
            self._ring_bytes = sum(min(int(q["residual"]) + int(q["group"]), self.max_length)
                                   * int(q["native_bytes_per_token"]) for q in quant)
            self._sealed_position_bytes = sum(int(q["bytes_per_token"]) for q in quant)
            self._residual = min(int(q["residual"]) for q in quant)
        self._state_options = opts
        smallest = self._cost(2)  # one prompt token and one new token
        if self.budget is not None and smallest > self.budget:
            raise BudgetError(f"budget of {self.budget} bytes cannot hold one request's caches: {smallest} bytes for "
                              + (f"one block of {self.block_size} positions" if self.paged
                                 else f"max_length={self.max_length}"))
        self._config = dict(max_batch=max_batch, max_tokens_per_step=max_tokens_per_step, budget=budget,
                            max_length=max_length, block_size=block_size, prefix_cache=prefix_cache,
                            state_options=dict(state_options or {}))
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()  # one step at a time; close waits for it
        self._inbox: Deque[Tuple[str, Any]] = collections.deque()
        self._requests: Dict[int, Request] = {}
        self._queue: Deque[Request] = collections.deque()
        self._prefilling: List[Request] = []
        self._rows: List[Request] = []  # the running requests, in the state's row order
        self._state: Any = None
        self._counts = collections.Counter()
        self._recent: Deque[Tuple[float, int]] = collections.deque(maxlen=64)
        self._closed = False
        self._vocab = self.io.vocab  # known up front where the model fixes it, else from the first logits

    def _probe(self, opts: Dict[str, Any]) -> Dict[str, Any]:
        """``info()`` of a one-row state created with ``opts``. A model whose K/V geometry the
        state learns only from a run (a symbolic head size, as onnxruntime-genai exports name
        it) gets one token run on the probe first, so the caches, their reservation and their
        block size exist to be read (else the budget would count nothing for such requests)."""
        probe = self.session.create_state(batch=1, max_length=self.max_length, **opts)
        try:
            info = probe.info()
            if not info.get("layers"):
                ids = np.zeros((1, 1), np.int64)
                self.session.run([self.io.logits], step_feeds(self.io, ids, np.ones_like(ids), 0), state=probe)
                info = probe.info()
            return info
        finally:
            probe.close()

    # -- requests -------------------------------------------------------------------------
    def add_request(self, input_ids: Any, *, max_new_tokens: int = 16, do_sample: bool = False,
                    temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0, min_p: float = 0.0,
                    typical_p: float = 1.0, epsilon_cutoff: float = 0.0, eta_cutoff: float = 0.0,
                    repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
                    sequence_bias: Any = None, bad_words_ids: Optional[Sequence[Sequence[int]]] = None,
                    suppress_tokens: Optional[Sequence[int]] = None,
                    begin_suppress_tokens: Optional[Sequence[int]] = None,
                    forced_eos_token_id: Union[int, Sequence[int], None] = None,
                    exponential_decay_length_penalty: Optional[Tuple[int, float]] = None,
                    eos_token_id: Union[int, Sequence[int], None] = None,
                    stop_sequences: Optional[Sequence[Sequence[int]]] = None, seed: Optional[int] = None,
                    logprobs: Optional[int] = None) -> int:
        """Queue a request: ``input_ids`` (1-D ids, or ``[1, n]``) and ``generate``'s options of
        the same names and meanings (``max_new_tokens``; the sampling options ``do_sample``,
        ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``, ``epsilon_cutoff`` and
        ``eta_cutoff``; ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``;
        the token constraints ``sequence_bias``, ``bad_words_ids``, ``suppress_tokens``,
        ``begin_suppress_tokens``, ``forced_eos_token_id`` and
        ``exponential_decay_length_penalty``; ``eos_token_id``, ``stop_sequences``, ``seed``;
        ``top_k`` defaults to 50 as there, so a request equals ``generate`` alone; the
        OpenAI-style server passes ``top_k=0``, the whole vocabulary); ``logprobs=n`` records
        each token's log-probability and the ``n`` most probable alternatives (0: the chosen
        token's only). Returns the request id. Beam search and speculative decoding are
        ``generate``'s alone (their options raise ``TypeError`` here).

        Raises:
            ValueError: bad options, a closed engine, or a prompt that can never fit
            (``prompt + max_new_tokens > max_length``; caches larger than the whole ``budget``;
            or more positions than the model's position table has: see
            ``DecoderIO.check_generation``).
            TypeError: ids that are not integers.
        """
        ids = np.asarray(input_ids)
        if ids.size == 0:
            raise ValueError("input_ids must hold at least one token")
        if ids.dtype.kind not in "iu":
            raise TypeError(f"input_ids must be integer token ids, got dtype {ids.dtype}")
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"input_ids must be one non-empty sequence ([n] or [1, n]), got shape {ids.shape}")
        ids = ids.astype(np.int64)
        if ids.min() < 0:
            raise ValueError("input_ids must be non-negative")
        check_vocabulary(ids, self._vocab, "input_ids")
        max_new = integer(max_new_tokens, "max_new_tokens", lo=1)
        if ids.size + max_new > self.max_length:
            raise ValueError(f"the request can never fit: {ids.size} prompt tokens + max_new_tokens={max_new} "
                             f"exceed the engine's max_length={self.max_length}")
        # a step past the model's position table would fail every running request
        self.io.check_generation(ids.size, max_new, f"the request ({ids.size} prompt tokens + "
                                 f"max_new_tokens={max_new})")
        cost = self._cost(ids.size + max_new)
        if self.budget is not None and cost > self.budget:  # admission would wait for it forever
            raise ValueError(self._beyond_budget(ids.size, max_new, cost))
        opts = SamplingOptions(do_sample, temperature, top_k, top_p, min_p, repetition_penalty, no_repeat_ngram_size,
                               min_new_tokens, typical_p, epsilon_cutoff, eta_cutoff, sequence_bias, bad_words_ids,
                               suppress_tokens, begin_suppress_tokens, forced_eos_token_id,
                               exponential_decay_length_penalty)
        opts.check_vocabulary(self._vocab)
        stop = StopCondition.of(eos_token_id, stop_sequences)
        lpn = optional_integer(logprobs, "logprobs", lo=0, hi=20)
        rng = np.random.default_rng(optional_integer(seed, "seed", lo=0))
        with self._lock:
            if self._closed:
                raise ValueError("the engine is closed")
            rid = next(_REQUEST_IDS)
            req = Request(rid, ids, max_new, opts, stop, lpn, rng, arrival=time.perf_counter())
            self._requests[rid] = req
            self._inbox.append(("add", req))
        return rid

    def abort(self, request_id: int) -> bool:
        """Stop a request (its caches are freed at the next step, which reports it finished with
        ``finish_reason="abort"``). Returns False when the id is unknown or already finished."""
        with self._lock:
            req = self._requests.get(request_id)
            if req is None or req.finished:
                return False
            self._inbox.append(("abort", req))
            return True

    def request(self, request_id: int) -> Request:
        """The :class:`Request` of an id (kept until :meth:`release`). Raises ``KeyError``."""
        with self._lock:
            return self._requests[request_id]

    def release(self, request_id: int) -> None:
        """Forget a finished request's record (unknown ids are ignored)."""
        with self._lock:
            req = self._requests.get(request_id)
            if req is not None and req.finished:
                del self._requests[request_id]

    def has_work(self) -> bool:
        """True while a request is queued, prefilling or running (or an add/abort is pending)."""
        with self._lock:
            return bool(self._inbox or self._queue or self._prefilling or self._rows)

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> List[StepOutput]:
        """Run one step: one model call over every running request (one new token each), then
        prefill chunks of new requests (up to ``max_tokens_per_step`` prompt tokens), admitting
        queued requests while ``max_batch`` and the budget allow. Returns each request's new
        tokens and whether it finished (an aborted request, or one a failed model call ended
        with ``finish_reason == "error"``, is reported once, finished, with no tokens).

        Steps from several threads run one after another, and :meth:`close` waits for a step
        in progress.

        Raises:
            ValueError: the engine is closed (:meth:`close`).
        """
        # a Ctrl-C waits for the step's end: arriving between the model call and the rows'
        # bookkeeping it would leave the shared state a position ahead of the rows (a step
        # takes a native call's time, which Ctrl-C waits for anyway)
        with self._step_lock, _lib.deferred_interrupts():
            return self._step()

    def _step(self) -> List[StepOutput]:
        """:meth:`step` under ``_step_lock``."""
        if self._closed:
            raise ValueError("the engine is closed")
        outputs: Dict[int, StepOutput] = {}
        self._drain(outputs)
        t0 = time.perf_counter()
        produced = 0
        if self._rows:
            produced += self._decode(outputs)
        self._admit(outputs)
        produced += self._prefill(outputs)
        self._leave()
        if produced:
            self._recent.append((time.perf_counter(), produced))
            self._counts["steps"] += 1
            self._counts["step_ms"] += int((time.perf_counter() - t0) * 1e6)
        return list(outputs.values())

    def run_until_done(self) -> Dict[int, List[int]]:
        """Step until no request is left; returns the generated tokens of every request that
        finished meanwhile, by id."""
        done: Dict[int, List[int]] = {}
        while self.has_work():
            for out in self.step():
                if out.finished:
                    done[out.request_id] = list(self._requests[out.request_id].tokens)
        return done

    def _drain(self, outputs: Dict[int, StepOutput]) -> None:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        for kind, req in items:
            if kind == "add":
                self._queue.append(req)
                self._counts["requests"] += 1
            elif not req.finished:
                self._finish(req, "abort")
                outputs[req.request_id] = StepOutput(req.request_id, [], True)
        self._queue = collections.deque(r for r in self._queue if not r.finished)
        for r in [r for r in self._prefilling if r.finished]:
            self._prefilling.remove(r)
            r._runner.close()
            r._runner = None
        self._leave()  # aborted rows leave before the decode call

    def _reserved(self) -> int:
        return sum(r._cost for r in self._rows) + sum(r._cost for r in self._prefilling)

    def _cost(self, positions: int) -> int:
        """The cache bytes admission counts for a request of ``positions`` (its ``prompt +
        max_new_tokens``): ``max_length`` positions on contiguous caches; ``positions`` in whole
        blocks on paged ones (quantized: the native ring, plus a sealed block for each whole
        quant_group of positions beyond the residual window; the rest stay in the ring)."""
        bs = self.block_size or 1
        if self.paged and self._sealed_position_bytes:
            sealed = max(0, positions - self._residual) // bs * bs
            return self._ring_bytes + sealed * self._sealed_position_bytes
        if not self.paged or not self._position_bytes:
            return self._request_bytes
        return -(-positions // bs) * bs * self._position_bytes

    def _cost_of(self, req: Request) -> int:
        return self._cost(req.prompt.size + req.max_new_tokens)

    def _beyond_budget(self, prompt: int, max_new: int, cost: int) -> str:
        where = f"in blocks of {self.block_size} positions" if self.paged else f"for max_length={self.max_length}"
        return (f"the request can never fit: {prompt} prompt tokens + max_new_tokens={max_new} need {cost} bytes of "
                f"caches ({where}), more than the engine's whole budget of {self.budget} bytes")

    def _admit(self, outputs: Dict[int, StepOutput]) -> None:
        while self._queue and len(self._rows) + len(self._prefilling) < self.max_batch:
            req = self._queue[0]
            cost = self._cost_of(req)
            error: Optional[BaseException] = None
            if self.budget is not None and self._reserved() + cost > self.budget:
                if cost <= self.budget:
                    self._counts["admission_paused"] += 1
                    return
                # its size learnt from the first run: it alone can never start
                error = ValueError(self._beyond_budget(req.prompt.size, req.max_new_tokens, cost))
            else:
                try:
                    # max_length given, never left to the runner's choice: adopting needs one fixed length
                    req._runner = StateRunner(self.session, self.io, 1, self.max_length,
                                              dict(self._state_options, max_length=self.max_length))
                except MemoryError as e:
                    if self._rows or self._prefilling:  # the machine is out of room: wait for rows to leave
                        self._counts["admission_paused"] += 1
                        return
                    error = e  # nothing will leave: it can never start
                except Exception as e:  # its state cannot be made: it alone ends
                    error = e
            self._queue.popleft()
            if error is not None:
                self._fail(req, error, outputs)
                continue
            req._cost = cost
            req._seq = req.prompt.copy()
            self._prefilling.append(req)

    def _prefill(self, outputs: Dict[int, StepOutput]) -> int:
        room = self.max_tokens_per_step
        produced = 0
        for req in list(self._prefilling):
            if room <= 0:
                break
            try:
                if self.prefix_cache and req._prefilled == 0 and req._runner.length == 0:
                    req.reused_tokens = req._prefilled = req._runner.reuse_prefix(req.prompt)
                    self._counts["prefix_tokens"] += req.reused_tokens
                    self._counts["prefix_hits"] += int(req.reused_tokens > 0)
                start = req._prefilled
                n = min(room, req.prompt.size - start)
                logits = req._runner.run(req.prompt[None, start:start + n])
            except Exception as e:
                # This request's prompt cannot run (a token id beyond a vocabulary the model
                # does not declare, its state out of memory, ...): it runs on a state of its
                # own, so it alone ends and the others go on.
                self._prefilling.remove(req)
                self._fail(req, e, outputs)
                continue
            if self._vocab is None:
                self._vocab = int(np.shape(logits)[-1])
            req._prefilled += n
            room -= n
            self._counts["prompt_tokens"] += n
            if req._prefilled < req.prompt.size:
                continue
            self._prefilling.remove(req)
            try:
                tok = self._choose(req, np.asarray(logits[0, -1], dtype=np.float32))
            except Exception as e:  # its logits cannot be chosen from (NaN, every token banned): it alone ends
                self._fail(req, e, outputs)
                continue
            req.first_token_time = time.perf_counter()
            produced += 1
            if self._after_token(req, tok):
                req._runner.close()
                req._runner = None
            else:
                self._join(req)
            outputs[req.request_id] = StepOutput(req.request_id, [tok], req.finished)
        return produced

    def _join(self, req: Request) -> None:
        state = req._runner.state
        req._runner = None
        if not self._request_bytes:  # caches whose geometry only the first run told
            self._position_bytes = _position_bytes(state.info())
            self._request_bytes = self._position_bytes * self.max_length
            req._cost = self._cost_of(req)
        if self._state is None:
            self._state = state
        else:
            self._state.adopt(state)
        self._rows.append(req)

    def _decode(self, outputs: Dict[int, StepOutput]) -> int:
        rows = self._rows
        state = self._state
        P = state.length
        B = len(rows)
        held = np.array([r._seq.size - 1 for r in rows], np.int64)
        mask = (np.arange(P + 1)[None, :] >= (P - held)[:, None]).astype(np.int64)
        ids = np.array([[r._seq[-1]] for r in rows], np.int64)
        feeds = step_feeds(self.io, ids, mask, P)
        try:
            logits, = self.session.run([self.io.logits], feeds, state=state)
        except Exception as e:
            # The running requests share this state, which the call may have left half-written:
            # they end; queued and prefilling requests (states of their own) go on.
            _log.exception("the decode call failed: its %d running requests end", B)
            for req in rows:
                if not req.finished:
                    self._fail(req, e, outputs)
            self._rows = []
            self._state = None
            with contextlib.suppress(Exception):
                state.close()
            return 0
        logits = np.asarray(logits)
        for b in range(B):
            req = rows[b]
            if req.finished:  # aborted meanwhile
                continue
            try:
                tok = self._choose(req, np.asarray(logits[b, -1], dtype=np.float32))
            except Exception as e:  # (as in _prefill: this request alone ends; its row leaves after the step)
                self._fail(req, e, outputs)
                continue
            self._after_token(req, tok)
            outputs[req.request_id] = StepOutput(req.request_id, [tok], req.finished)
        self._counts["decode_rows"] += B
        return B

    def _choose(self, req: Request, logits: np.ndarray) -> int:
        row = logits[None, :]
        # (the eos ids are banned until the request holds min_new_tokens new tokens)
        prompt = req._seq.size - len(req.tokens)
        processed = lp.process(row, req.options, req._seq[None, :], eos=req.stop.eos,
                               min_length=prompt + req.options.min_new_tokens, begin=prompt,
                               max_length=prompt + req.max_new_tokens)
        tok = int(lp.choose(processed, req.options.do_sample, req.rng)[0])
        if req.logprobs is not None:
            logp = lp.log_softmax(row)[0]
            req.token_logprobs.append(float(logp[tok]))
            if req.logprobs > 0:
                top = np.argsort(-logp, kind="stable")[:req.logprobs]
                req.top_logprobs.append({int(t): float(logp[t]) for t in top})
        return tok

    def _after_token(self, req: Request, tok: int) -> bool:
        """Record ``tok``; finish the request when it stops. Returns True when finished."""
        req._seq = np.append(req._seq, tok)
        req.tokens.append(tok)
        self._counts["generated_tokens"] += 1
        if req.stop.hit(req._seq[-max([len(s) for s in req.stop.stop_sequences] + [1]):]):
            self._finish(req, "stop")
        elif len(req.tokens) >= req.max_new_tokens:
            self._finish(req, "length")
        return req.finished

    def _fail(self, req: Request, error: BaseException, outputs: Dict[int, StepOutput]) -> None:
        """End ``req`` (already out of the queue and the running lists) with ``finish_reason ==
        "error"`` because a model call or its state failed; the others go on."""
        _log.warning("request %d failed: %s: %s", req.request_id, type(error).__name__, error)
        req.error = str(error)
        if req._runner is not None:
            req._runner.close()
            req._runner = None
        self._finish(req, "error")
        outputs[req.request_id] = StepOutput(req.request_id, [], True)

    def _finish(self, req: Request, reason: str) -> None:
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        self._counts["finished_" + reason] += 1

    def _leave(self) -> None:
        keep = [i for i, r in enumerate(self._rows) if not r.finished]
        if len(keep) == len(self._rows):
            return
        if not keep:
            self._state.close()
            self._state = None
        else:
            self._state.select(keep)
        self._rows = [self._rows[i] for i in keep]

    # -- figures ------------------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """Counters and gauges: ``running``, ``prefilling``, ``queued``, ``requests`` (added),
        ``finished`` (by reason), ``prompt_tokens``, ``generated_tokens``, ``steps``,
        ``mean_step_ms``, ``tokens_per_s`` (over the recent steps), ``cache_reserved_bytes`` /
        ``cache_committed_bytes`` (the running requests' caches), ``budget``,
        ``request_bytes`` (what one request reserves), ``admission_paused`` (steps that left
        requests queued for the budget), ``cache_blocks_used`` / ``cache_blocks_free`` (None for
        the contiguous layout; a paged engine with no request running uses 0 blocks and has
        no pool, so ``cache_blocks_free`` is None then), ``prefix_hits`` / ``prefix_tokens``
        (requests that attached a registered prompt prefix and the tokens they reused, counted
        since the engine started; 0 without a prefix cache)."""
        with self._lock:
            pending = sum(1 for k, _ in self._inbox if k == "add")
        c = self._counts
        recent = list(self._recent)
        tps = 0.0
        if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
            tps = sum(n for _, n in recent[1:]) / (recent[-1][0] - recent[0][0])
        state = self._state
        committed, used, free = 0, (0 if self.paged else None), None
        if state is not None and not state.closed:
            try:
                info = state.info()
            except ValueError:  # closed by a concurrent step
                info = None
            if info is not None:
                committed = int(info["totals"].get("committed_bytes", 0))
                if self.paged:
                    used = sum(int(layer.get("blocks_used", 0)) for layer in info["layers"])
                    free = sum(int(layer.get("blocks_free", 0)) for layer in info["layers"])
        return {"running": len(self._rows), "prefilling": len(self._prefilling), "queued": len(self._queue) + pending,
                "requests": c["requests"] + pending,
                "finished": {r: c["finished_" + r] for r in ("stop", "length", "abort", "error")},
                "prompt_tokens": c["prompt_tokens"], "generated_tokens": c["generated_tokens"],
                "steps": c["steps"], "mean_step_ms": (c["step_ms"] / 1e3 / c["steps"]) if c["steps"] else 0.0,
                "tokens_per_s": tps, "cache_reserved_bytes": self._reserved(), "cache_committed_bytes": committed,
                "budget": self.budget, "request_bytes": self._request_bytes,
                "admission_paused": c["admission_paused"], "max_batch": self.max_batch,
                "cache_blocks_used": used, "cache_blocks_free": free, "prefix_hits": c["prefix_hits"],
                "prefix_tokens": c["prefix_tokens"]}

    def fresh(self) -> "Engine":
        """A new engine with no requests over the same session and with the same options (what
        :class:`~onnx_light_kv.serve.http.EngineLoop` rebuilds after a failed step when it was
        given no factory)."""
        return type(self)(self.session, **self._config)

    def close(self) -> None:
        """Abort everything and release the caches: every request not finished yet (queued ones
        and those added since the last step included) ends with ``finish_reason == "abort"``.
        Afterwards :meth:`add_request` and :meth:`step` raise ``ValueError`` and
        :meth:`has_work` is False; closing again does nothing."""
        with self._step_lock:  # after a step in progress; one close at a time
            with self._lock:
                self._closed = True
                items = list(self._inbox)
                self._inbox.clear()
            added = [req for kind, req in items if kind == "add"]
            self._counts["requests"] += len(added)
            for req in added + list(self._queue) + list(self._prefilling) + list(self._rows):
                if not req.finished:
                    self._finish(req, "abort")
                if req._runner is not None:
                    req._runner.close()
                    req._runner = None
            self._queue.clear()
            self._prefilling.clear()
            self._rows.clear()
            if self._state is not None:
                self._state.close()
                self._state = None

    _COPY_ADVICE = ("it owns its requests and their KV caches (a copy would share them); use fresh() for a new "
                    "engine over the same session with the same options")
    _PICKLE_ADVICE = "create an Engine over a session loaded in the receiving process"

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Engine(running={len(self._rows)}, prefilling={len(self._prefilling)}, queued={len(self._queue)}, "
                f"max_batch={self.max_batch}, max_length={self.max_length})")
