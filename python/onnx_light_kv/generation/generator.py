"""Step-by-step generation with onnxruntime-genai's verbs (greedy and sampling).

``Generator(session, **options)`` keeps the rows' token sequences and their KV state between
calls: ``append_tokens`` runs the model over new tokens (a prompt, or the next turn of a chat:
the history is never recomputed), ``generate_next_token`` picks one token per row,
``rewind_to`` drops positions from the end. :func:`~onnx_light_kv.generate` drives the same
class for greedy and sampled generation.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Optional, Union

import numpy as np

from .. import _lib
from . import logits_process as lp
from .decoder_io import DecoderIO
from .._validate import integer, optional_integer
from ..cache import _Uncopyable
from .options import SamplingOptions, StopCondition, check_vocabulary, pad_id, prompt_ids
from .runner import make_runner, require_truncate

__all__ = ["Generator"]


class Generator(_Uncopyable):
    """Step-by-step generation over one decoder session (onnxruntime-genai's ``og.Generator``).

    ``session``: our :class:`~onnx_light_kv.InferenceSession` or an ``onnxruntime``
    session of a decoder with past/present inputs (see :mod:`.decoder_io`).
    ``max_length``: most positions per row, prompt included (generation is done there; needed
    for models whose pasts are fixed-capacity buffers). ``do_sample``, ``temperature``,
    ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``: as in transformers (``top_k``
    defaults to 50 as there and in onnxruntime-genai; 0 means the whole vocabulary),
    ``no_repeat_ngram_size`` (0: off; bans a token that would repeat an n-gram of that size in
    the row, its left padding left out). ``min_length`` (onnxruntime-genai's and transformers'
    meaning: positions per row, prompt and its left padding included): the eos ids are banned
    while a row is shorter (stop sequences are not). ``eos_token_id``
    (int or list) and ``stop_sequences`` (lists of ids) finish a row; ``pad_token_id`` (default:
    the first eos id inside the model's vocabulary, else 0) is what finished rows produce; it
    and the tokens must lie inside a vocabulary the model fixes (else ``ValueError``). ``seed`` seeds the numpy
    ``Generator`` used for sampling. ``state_options``: None uses the session's cache path
    (``create_state``) when it rewrites every layer, else the tensor path; False forces the
    tensor path; a dict of ``create_state`` keyword arguments requires the cache path.

    Rows advance together: ``append_tokens`` takes ``[batch, n]`` ids; the first call may pass
    an ``attention_mask`` with zeros for left padding (models with an ``attention_mask`` input).

    A generator cannot be copied (``copy.copy``, ``copy.deepcopy``) or pickled: TypeError. Its
    rows' KV state lives in its session (a generation state's native caches, or past tensors
    the session returned), which a copy would share. To continue the same rows independently,
    create another ``Generator`` and ``append_tokens(g.sequences, g.attention_mask)``.
    """

    def __init__(self, session: Any, *, max_length: Optional[int] = None, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_length: int = 0,
                 eos_token_id: Union[int, Iterable[int], None] = None,
                 stop_sequences: Optional[Iterable[Iterable[int]]] = None, pad_token_id: Optional[int] = None,
                 seed: Optional[int] = None, state_options: Union[None, bool, Dict[str, Any]] = None) -> None:
        self.session = session
        self.io = DecoderIO.from_session(session)
        self.max_length = optional_integer(max_length, "max_length", lo=1)
        self.options = SamplingOptions(do_sample, temperature, top_k, top_p, min_p, repetition_penalty,
                                       no_repeat_ngram_size)
        self.min_length = integer(min_length, "min_length", lo=0)
        self.stop = StopCondition.of(eos_token_id, stop_sequences)
        self.pad_token_id = pad_id(optional_integer(pad_token_id, "pad_token_id", lo=0), self.stop, self.io.vocab)
        self.rng = np.random.default_rng(optional_integer(seed, "seed", lo=0))
        self._state_options = state_options
        # the state holds every position up to max_length (appends run them all); generate(),
        # which never runs its last token, sets False
        self._stores_all = True
        # the width at which options.begin_suppress_tokens apply (generate sets its prompt's)
        self._begin = -1
        self._runner: Any = None
        self._seq = np.zeros((0, 0), np.int64)
        self._mask = np.zeros((0, 0), np.int64)
        # the length each finished row had when it finished (-1: not finished): rewind_to keeps
        # a row finished only while its stopping token is among the kept positions
        self._done_at = np.zeros(0, np.int64)
        self._logits: Optional[np.ndarray] = None
        self._last_processed: Optional[np.ndarray] = None
        self._closed = False
        self.timings: Dict[str, float] = {"prefill_s": 0.0, "decode_s": 0.0, "decode_runs": 0}

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the generator is closed")

    # -- state ---------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        """Number of rows (0 before the first ``append_tokens``)."""
        return int(self._seq.shape[0])

    @property
    def length(self) -> int:
        """Positions per row so far (padding included)."""
        return int(self._seq.shape[1])

    @property
    def sequences(self) -> np.ndarray:
        """``[batch, length]`` int64 ids of every row so far (a copy)."""
        return self._seq.copy()

    @property
    def attention_mask(self) -> np.ndarray:
        """``[batch, length]`` int64: 0 marks left padding (a copy)."""
        return self._mask.copy()

    @property
    def last_scores(self) -> Optional[np.ndarray]:
        """Log-probabilities ``[batch, vocab]`` (after the logits processors) that the latest
        ``generate_next_token`` chose from (computed on first access)."""
        if self._last_processed is None:
            return None
        return lp.log_softmax(self._last_processed)

    @property
    def runner_kind(self) -> str:
        """"state" (the session's cache path) or "tensor" (past/present fed back); "" before
        the first ``append_tokens``."""
        return self._runner.kind if self._runner is not None else ""

    def cache_bytes(self) -> int:
        """Bytes of K/V the rows hold now."""
        return self._runner.cache_bytes() if self._runner is not None else 0

    # -- onnxruntime-genai verbs ---------------------------------------------------------
    def append_tokens(self, tokens: Any, attention_mask: Any = None) -> None:
        """Run the model over ``tokens`` (``[batch, n]`` or ``[n]`` for one row) after what the
        rows hold; ``attention_mask`` (same shape, first call only) marks left padding with 0.
        Ids and mask follow :func:`~onnx_light_kv.generate`'s rule (:func:`.options.prompt_ids`:
        the mask is read as ``mask != 0`` and must be left padding, else ``ValueError``).
        A call that raises (a bad id, a mask the cache path does not take) changes nothing: the
        rows, their state and the next token's logits stay as they were."""
        self._check_open()
        first = self._runner is None or self.length == 0
        if attention_mask is not None and not first:
            raise ValueError("attention_mask is accepted only with the first tokens (left padding)")
        ids, mask = prompt_ids(tokens, attention_mask, "tokens")
        check_vocabulary(ids, self.io.vocab, "tokens")
        if not first and ids.shape[0] != self.batch:
            raise ValueError(f"tokens have {ids.shape[0]} rows; this generator has {self.batch}")
        if self.max_length is not None and self.length + ids.shape[1] > self.max_length:
            raise ValueError(f"{self.length + ids.shape[1]} positions exceed max_length={self.max_length}")
        if self._runner is None or self._runner.batch != ids.shape[0]:
            # the new runner first: if it cannot be made (a budget, an interrupt), the old one
            # and the rows stay as they were
            runner = make_runner(self.session, self.io, ids.shape[0], self.max_length, self._state_options,
                                 stores_all=self._stores_all)
            if self._runner is not None:
                self._runner.close()
            self._runner = runner
            self._seq = np.zeros((ids.shape[0], 0), np.int64)
            self._mask = np.zeros((ids.shape[0], 0), np.int64)
            self._done_at = np.full(ids.shape[0], -1, np.int64)
        is_prefill = self._runner.length == 0
        kept = (self._seq, self._mask, self._done_at, self._runner.length)
        self._seq = np.concatenate([self._seq, ids], axis=1)
        self._mask = np.concatenate([self._mask, mask], axis=1)
        self._done_at = np.full(self.batch, -1, np.int64)
        t = time.perf_counter()
        try:
            self._compute()
        except BaseException:
            self._seq, self._mask, self._done_at, held = kept
            runner = self._runner
            if runner is not None and not self._closed and runner.length > held:
                runner.truncate(held)  # positions a failed run may have attached (a reused prefix)
            raise
        dt = time.perf_counter() - t
        self.timings["prefill_s" if is_prefill else "decode_s"] += dt

    def generate_next_token(self) -> None:
        """Choose one token per row from the current logits (after the processors) and append
        it; finished rows get ``pad_token_id``. Raises ``RuntimeError`` when :meth:`is_done`.
        A Ctrl-C during the call takes effect at its end (the rows, the random stream and the
        state move together)."""
        with _lib.deferred_interrupts():
            self._next_token()

    def _next_token(self) -> None:
        """:meth:`generate_next_token`'s body."""
        self._check_open()
        if self._runner is None or self.length == 0:
            raise RuntimeError("append_tokens must come before generate_next_token")
        if self.is_done():
            raise RuntimeError("generation is done (every row finished or max_length reached)")
        if self._logits is None:
            t = time.perf_counter()
            self._compute()
            self.timings["decode_s"] += time.perf_counter() - t
            self.timings["decode_runs"] += 1
        processed = lp.process(self._logits, self.options, self._seq, self._mask, eos=self.stop.eos,
                               min_length=self.min_length, begin=self._begin,
                               max_length=-1 if self.max_length is None else self.max_length)
        self._last_processed = processed
        tok = lp.choose(processed, self.options.do_sample, self.rng)
        done = self._done
        tok[done] = self.pad_token_id
        self._seq = np.concatenate([self._seq, tok[:, None]], axis=1)
        self._mask = np.concatenate([self._mask, np.ones((self.batch, 1), np.int64)], axis=1)
        newly = self.stop.hits(self._seq, self._mask) & ~done  # (a row's padding never matches)
        self._done_at[newly] = self.length
        self._logits = None

    def get_next_tokens(self) -> np.ndarray:
        """``[batch]`` int64: the newest token of each row."""
        if self.length == 0:
            raise RuntimeError("no tokens yet")
        return self._seq[:, -1].copy()

    def get_sequence(self, index: int) -> np.ndarray:
        """Row ``index``'s ids so far, without its left padding (``TypeError`` for an index that
        is not an integer, ``IndexError`` out of range)."""
        index = integer(index, "index")
        if not -self.batch <= index < self.batch:
            raise IndexError(f"row {index} out of range for batch {self.batch}")
        return self._seq[index][self._mask[index] != 0].copy()

    @property
    def _done(self) -> np.ndarray:
        """``[batch]`` bool: which rows finished (derived from ``_done_at``)."""
        return self._done_at >= 0

    def is_done(self) -> bool:
        """True when every row finished or the rows reached ``max_length``."""
        if self.batch == 0:
            return False
        return bool(self._done.all()) or (self.max_length is not None and self.length >= self.max_length)

    def done_rows(self) -> np.ndarray:
        """``[batch]`` bool: which rows finished (eos or a stop sequence)."""
        return self._done

    def get_logits(self) -> np.ndarray:
        """``[batch, vocab]`` float32 logits (before the processors) for the next position."""
        self._check_open()
        if self._runner is None or self.length == 0:
            raise RuntimeError("append_tokens must come before get_logits")
        if self._logits is None:
            self._compute()
        return self._logits.copy()

    def rewind_to(self, length: int) -> None:
        """Drop every position from ``length`` on (0 empties the rows); the next token is then
        computed from the kept ones, as if the dropped ones had never been appended (on a
        quantized state, ``state_options={"quant": ...}``, up to quantization: kept positions
        that were sealed since stay quantized, and a sealed chunk the rewind cuts keeps the
        scales its dropped rows helped set). Raises
        ``NotImplementedError`` (changing nothing) on the tensor path of a model with
        window-sized shared buffers, which keep only the most recent positions. Raises
        ``ValueError`` (changing nothing) when ``length`` is above 0 but would keep only left
        padding of some row: that row would have no token to continue from."""
        self._check_open()
        length = integer(length, "rewind length", lo=0, hi=self.length)
        if length == self.length:
            return
        if length:
            empty = np.flatnonzero(~self._mask[:, :length].any(axis=1))
            if empty.size:
                first = int(np.argmax(self._mask[empty[0]] != 0))
                raise ValueError(f"rewind length {length} would keep only the left padding of row {int(empty[0])} "
                                 f"(its first token is at position {first}); rewind to 0 or to at least "
                                 f"{int(max(np.argmax(self._mask != 0, axis=1))) + 1}")
        keep = max(length - 1, 0)
        if self._runner.length > keep:
            require_truncate(self._runner, "rewind_to")
        self._seq = self._seq[:, :length]
        self._mask = self._mask[:, :length]
        if self._runner.length > keep:
            self._runner.truncate(keep)
        # a row stays finished while the token that finished it is kept; prompt tokens never
        # finish a row (append_tokens does not check them either)
        self._done_at[self._done_at > length] = -1
        self._logits = None

    def close(self) -> None:
        """Release the KV state. Later calls of the generation verbs raise ``ValueError``
        (closing twice is allowed); the sequences so far stay readable."""
        self._closed = True
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    _COPY_ADVICE = ("its KV state belongs to it (a copy would share it); create another Generator and "
                    "append_tokens(g.sequences, g.attention_mask) to continue the same rows independently")
    _PICKLE_ADVICE = ("send its sequences and attention_mask and append_tokens them to a Generator in the receiving "
                      "process")

    def __repr__(self) -> str:
        from .._format import human_bytes, summary

        rows = int(self._seq.shape[0])
        return summary("Generator", runner=self.runner_kind or None, rows=rows, length=int(self._seq.shape[1]),
                       max_length=self.max_length, done=f"{int(self._done.sum())}/{rows}" if rows else None,
                       cache=human_bytes(self.cache_bytes()) if self._runner is not None else None)

    # -- internals -------------------------------------------------------------------------
    def _compute(self) -> None:
        """Run the positions the runner does not hold yet; keep the last position's logits."""
        runner = self._runner  # (read once: close() from another thread sets it to None)
        if runner is None or self._closed:
            raise ValueError("the generator is closed")
        start = runner.length
        if self.io.max_positions is not None:  # (a sum over the rows per step otherwise spent for nothing)
            self.io.check_positions(int(self._mask.sum(axis=1).max()), "the next run")
        logits = runner.run(self._seq[:, start:], self._mask[:, start:])
        self._logits = np.asarray(logits[:, -1, :], dtype=np.float32)
