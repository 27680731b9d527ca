"""Validated generation options, the per-row stop conditions they define, and prompts (token ids
with their attention mask) as every generation entry point takes them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet, Any, Iterable, List, Mapping, Optional, Tuple, Union

import numpy as np

from .._validate import integer, real

__all__ = ["SamplingOptions", "StopCondition", "check_vocabulary", "pad_id", "prompt_ids"]


@dataclass(frozen=True)
class SamplingOptions:
    """How the next token is chosen (transformers' names and meanings).

    ``no_repeat_ngram_size`` (0: off) bans every token that would repeat an n-gram of that size
    already in the row; ``min_new_tokens`` (0: off) bans the eos ids until a row holds that
    many new tokens (:func:`.logits_process.process` applies both, given the eos ids and the
    length they read).

    Token constraints (always applied, as transformers applies them):

    - ``sequence_bias``: ``{(ids...): bias}`` or ``[[ids, bias], ...]``; the bias (a float,
      ``-inf`` bans) is added to the logit of a sequence's last id in the rows that end with the
      ids before it (a one-id sequence: in every row).
    - ``bad_words_ids``: ``[[ids], ...]``, sequences that must never be produced; the last id of
      each is banned where the row ends with the ids before it. A one-id entry equal to an eos id
      is ignored, as in transformers.
    - ``suppress_tokens``: ids banned at every step.
    - ``begin_suppress_tokens``: ids banned at the first new token.
    - ``forced_eos_token_id``: id(s) that the last position before the maximum length must be
      (every other id banned there).
    - ``exponential_decay_length_penalty``: ``(start, factor)``; once a row holds more than
      ``start`` new tokens, the eos logits grow by ``|logit| * (factor ** n - 1)`` after ``n``
      more.

    Sampling warpers after min-p (only when sampling): ``typical_p`` (1: off; locally typical
    sampling), ``epsilon_cutoff`` and ``eta_cutoff`` (0: off; truncation sampling by a fixed
    or an entropy-dependent probability floor).

    The fields are checked and normalized by the project's one rule per argument kind
    (:mod:`onnx_light_kv._validate`): ``do_sample`` must be a ``bool`` (``TypeError``
    otherwise), ``top_k`` an integer (``1.5`` or ``"2"`` raise ``TypeError``), the others real
    numbers (strings raise ``TypeError``) that are finite and in range (``ValueError``)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    sequence_bias: Any = ()
    bad_words_ids: Any = ()
    suppress_tokens: Any = ()
    begin_suppress_tokens: Any = ()
    forced_eos_token_id: Any = ()
    exponential_decay_length_penalty: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise TypeError(f"do_sample must be a bool, got {type(self.do_sample).__name__}")
        temperature = real(self.temperature, "temperature")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        top_p = real(self.top_p, "top_p")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        repetition_penalty = real(self.repetition_penalty, "repetition_penalty")
        if not repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        fields = {"do_sample": bool(self.do_sample), "temperature": temperature,
                  "top_k": integer(self.top_k, "top_k", lo=0), "top_p": top_p,
                  "min_p": real(self.min_p, "min_p", lo=0.0, hi=1.0), "repetition_penalty": repetition_penalty,
                  "no_repeat_ngram_size": integer(self.no_repeat_ngram_size, "no_repeat_ngram_size", lo=0),
                  "min_new_tokens": integer(self.min_new_tokens, "min_new_tokens", lo=0),
                  "epsilon_cutoff": _cutoff(self.epsilon_cutoff, "epsilon_cutoff"),
                  "eta_cutoff": _cutoff(self.eta_cutoff, "eta_cutoff"),
                  "sequence_bias": _sequence_bias(self.sequence_bias),
                  "bad_words_ids": _id_sequences(self.bad_words_ids, "bad_words_ids"),
                  "suppress_tokens": _ids(self.suppress_tokens, "suppress_tokens"),
                  "begin_suppress_tokens": _ids(self.begin_suppress_tokens, "begin_suppress_tokens")}
        fields["forced_eos_token_id"] = _ids(self.forced_eos_token_id, "forced_eos_token_id")
        fields["exponential_decay_length_penalty"] = _decay(self.exponential_decay_length_penalty)
        typical = real(self.typical_p, "typical_p")
        if not 0.0 < typical <= 1.0:
            raise ValueError(f"typical_p must be in (0, 1] (1: off), got {typical}")
        fields["typical_p"] = typical
        forced = set(fields["forced_eos_token_id"])
        if forced and forced <= set(fields["suppress_tokens"]):
            # (transformers' GenerationConfig refuses it too) the last position would have every
            # logit -inf: greedy choice would emit token 0, sampling would fail there
            raise ValueError(f"every forced_eos_token_id {sorted(forced)} is also in suppress_tokens: the last "
                             "position would have no token left")
        for name, value in fields.items():
            object.__setattr__(self, name, value)  # frozen: normalized once, here

    def check_vocabulary(self, vocab: Optional[int]) -> None:
        """``ValueError`` when a token id of the constraints lies at or beyond ``vocab`` (None:
        nothing is checked), naming the option."""
        for name, ids in (("sequence_bias", [i for seq, _ in self.sequence_bias for i in seq]),
                          ("bad_words_ids", [i for seq in self.bad_words_ids for i in seq]),
                          ("suppress_tokens", self.suppress_tokens),
                          ("begin_suppress_tokens", self.begin_suppress_tokens),
                          ("forced_eos_token_id", self.forced_eos_token_id)):
            check_vocabulary(np.asarray(ids, np.int64), vocab, name)


def _ids(value: Any, what: str) -> Tuple[int, ...]:
    """Token ids (an int or an iterable of ints, each >= 0 and within int64)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be an int or a list of ints, got {type(value).__name__}")
    if isinstance(value, np.ndarray) and value.ndim == 0:  # a 0-d array is one id, as operator.index reads it
        value = value[()]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (integer(value, what, lo=0),)
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a list of ints, got {type(value).__name__}") from None
    return tuple(integer(v, what, lo=0) for v in items)


def _decay(value: Any) -> Optional[Tuple[int, float]]:
    """``exponential_decay_length_penalty``: None, or ``(start, factor)`` with ``start`` >= 0
    new tokens and a finite ``factor`` > 0."""
    if value is None:
        return None
    # (a dict or a set has a length of 2 too, but no order: value[0] would be a KeyError or a
    # bare "not subscriptable" TypeError)
    if (isinstance(value, (str, bytes, Mapping, AbstractSet)) or not hasattr(value, "__len__")
            or len(value) != 2):
        raise TypeError(f"exponential_decay_length_penalty must be a (start, factor) pair, got "
                        f"{type(value).__name__}")
    start, factor_value = list(value)
    factor = real(factor_value, "exponential_decay_length_penalty's factor")
    if not factor > 0:
        raise ValueError(f"exponential_decay_length_penalty's factor must be > 0, got {factor}")
    return integer(start, "exponential_decay_length_penalty's start", lo=0), factor


def _cutoff(value: Any, name: str) -> float:
    """A probability floor in ``[0, 1)`` (0: off)."""
    v = real(value, name)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{name} must be in [0, 1) (0: off), got {v}")
    return v


def _id_sequences(value: Any, what: str) -> Tuple[Tuple[int, ...], ...]:
    """Non-empty token id sequences (an iterable of iterables of ints; an int in it is a one-id
    sequence), as ``stop_sequences`` and ``bad_words_ids`` take them."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be a list of lists of ints, got {type(value).__name__}")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} must be a list of lists of ints, got {type(value).__name__}") from None
    seqs = tuple(_ids(s, f"each sequence of {what}") for s in items)
    if any(len(s) == 0 for s in seqs):
        raise ValueError(f"the sequences of {what} must not be empty")
    return seqs


def _sequence_bias(value: Any) -> Tuple[Tuple[Tuple[int, ...], float], ...]:
    """transformers' ``sequence_bias``: a dict ``{ids: bias}`` (ids a tuple, or an int for one id)
    or a list of ``[ids, bias]`` pairs, as ``((ids...), bias)`` pairs; a bias is a real number,
    ``-inf`` and ``+inf`` included (NaN: ``ValueError``); a sequence given twice: ``ValueError``."""
    if value is None:
        return ()
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (str, bytes)):
        raise TypeError(f"sequence_bias must be a dict {{(ids...): bias}} or a list of [ids, bias], "
                        f"got {type(value).__name__}")
    else:
        try:
            pairs = [tuple(p) for p in value]
        except TypeError:
            raise TypeError("sequence_bias must be a dict {(ids...): bias} or a list of [ids, bias] pairs") from None
        if any(len(p) != 2 for p in pairs):
            raise ValueError("sequence_bias must be a list of [ids, bias] pairs")
    out: List[Tuple[Tuple[int, ...], float]] = []
    for ids, bias in pairs:
        seq = _ids(ids, "each sequence of sequence_bias")
        if not seq:
            raise ValueError("the sequences of sequence_bias must not be empty")
        b = real(bias, f"the bias of {list(seq)}", finite=False)
        if math.isnan(b):
            raise ValueError(f"the bias of {list(seq)} is NaN")
        out.append((seq, b))
    if len({seq for seq, _ in out}) != len(out):
        raise ValueError("sequence_bias names a sequence twice")
    return tuple(out)


@dataclass(frozen=True)
class StopCondition:
    """When a row is finished: it produced one of ``eos`` or ended with one of ``stop_sequences``
    (the stopping tokens are kept in the output, as transformers does)."""

    eos: Tuple[int, ...] = ()
    stop_sequences: Tuple[Tuple[int, ...], ...] = ()

    @classmethod
    def of(cls, eos_token_id: Union[int, Iterable[int], None],
           stop_sequences: Optional[Iterable[Iterable[int]]]) -> "StopCondition":
        """Validate ``eos_token_id`` (an int or an iterable of ints: list, tuple, 1-D numpy array,
        iterator) and ``stop_sequences`` (an iterable of such iterables: a list of lists, a 2-D
        array; an int in it is a one-token sequence). Each argument is read once, so one-shot
        iterators work. ``TypeError`` for ids that are not integers or containers that are not
        iterable; ``ValueError`` for negative ids and empty stop sequences."""
        seqs = _id_sequences(stop_sequences, "stop_sequences")
        return cls(eos=_ids(eos_token_id, "eos_token_id"), stop_sequences=seqs)

    def hit(self, sequence: np.ndarray) -> bool:
        """Whether the 1-D ``sequence`` (ids so far, the newest last) is finished."""
        if sequence.size == 0:
            return False
        if int(sequence[-1]) in self.eos:
            return True
        for s in self.stop_sequences:
            n = len(s)
            if sequence.size >= n and tuple(int(t) for t in sequence[-n:]) == s:
                return True
        return False

    @property
    def longest(self) -> int:
        """The most trailing tokens :meth:`hit` reads (1 for eos alone)."""
        return max((len(s) for s in self.stop_sequences), default=1)

    def hits(self, sequences: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """:meth:`hit` for each row of ``sequences [rows, length]``; ``mask`` (same shape, 0 for
        left padding) leaves a row's padding out, so a stop sequence never matches it. Only the
        last :attr:`longest` positions are read (the cost per step does not grow with length)."""
        if not self.eos and not self.stop_sequences:
            return np.zeros(sequences.shape[0], dtype=bool)
        k = self.longest
        if mask is None:
            return np.array([self.hit(row) for row in sequences[:, -k:]], dtype=bool)
        return np.array([self.hit(row[m != 0]) for row, m in zip(sequences[:, -k:], mask[:, -k:])], dtype=bool)


def check_vocabulary(ids: np.ndarray, vocab: Optional[int], name: str) -> None:
    """Raise ``ValueError`` when ``ids`` (non-negative, any shape) hold a token id at or beyond
    ``vocab``, the model's vocabulary size (None: the model does not fix it; nothing is checked):
    the one rule of generate, Generator and the Engine, so that an id the embedding's Gather
    would refuse is named before the model runs."""
    if vocab is not None and ids.size and int(ids.max()) >= vocab:
        raise ValueError(f"{name}: token id {int(ids.max())} is beyond the model's vocabulary of {vocab} tokens "
                         f"(ids 0..{vocab - 1})")


def pad_id(pad_token_id: Optional[int], stop: StopCondition, vocab: Optional[int]) -> int:
    """The id fed to (and appended for) finished rows: ``pad_token_id`` where given (``ValueError``
    when beyond ``vocab``), else the first eos id inside the vocabulary, else 0."""
    if pad_token_id is not None:
        check_vocabulary(np.array([pad_token_id]), vocab, "pad_token_id")
        return pad_token_id
    return next((e for e in stop.eos if vocab is None or e < vocab), 0)


def prompt_ids(input_ids: Any, attention_mask: Any = None, name: str = "input_ids") -> Tuple[np.ndarray, np.ndarray]:
    """A prompt as ``([batch, s] int64 ids, [batch, s] int64 0/1 mask)``: the one rule of
    :func:`~onnx_light_kv.generate` and :meth:`.Generator.append_tokens` (``name`` is the ids'
    argument name in the messages).

    ``input_ids``: ``[batch, s]`` or ``[s]`` (one row) non-negative integer ids, ``batch, s > 0``.
    ``attention_mask``: None (no padding) or numbers of the same shape, nonzero for a token and 0
    for left padding (``mask != 0``, as transformers reads it: a mask of 2s is a mask of 1s).

    Raises:
        ValueError: no ids (checked first: an empty list, ``[]`` or ``[[]]``, is empty whatever
            dtype numpy gives it), another shape, a negative id; a mask of another shape, or one
            that is not left padding (a row's last position is 0, or a 0 follows a token).
        TypeError: ids that are not integers (floats, bools); a mask that does not hold numbers.
    """
    ids = np.asarray(input_ids)
    if ids.size == 0:
        raise ValueError(f"{name} must hold at least one token, got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2:
        raise ValueError(f"{name} must be [batch, s] or [s], got shape {ids.shape}")
    if ids.dtype == np.uint64 and int(ids.max()) > np.iinfo(np.int64).max:  # (astype would wrap it negative)
        raise ValueError(f"{name} holds id {int(ids.max())}, beyond any vocabulary (int64)")
    ids = ids.astype(np.int64)
    if ids.min() < 0:  # a Gather would read a negative id from the end of the vocabulary
        raise ValueError(f"{name} must be non-negative ids")
    if attention_mask is None:
        return ids, np.ones_like(ids)
    mask = np.asarray(attention_mask)
    if mask.ndim == 1:
        mask = mask[None, :]
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} differs from {name} shape {ids.shape}")
    if mask.dtype.kind not in "biuf":
        raise TypeError(f"attention_mask must hold numbers (0 for left padding), got dtype {mask.dtype}")
    mask = (mask != 0).astype(np.int64)
    if not mask[:, -1].all():
        raise ValueError("attention_mask must use left padding: every row's last position must be 1")
    if (np.diff(mask, axis=1) < 0).any():
        raise ValueError("attention_mask must use left padding: zeros only before a row's first token")
    return ids, mask
