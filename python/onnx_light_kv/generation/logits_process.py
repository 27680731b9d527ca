"""Logits processors as plain numpy functions over ``[rows, vocab]`` float32 arrays.

They follow transformers' processors and warpers of the same names, applied in transformers'
order by :func:`process`: sequence bias, repetition penalty, no-repeat n-grams, bad words, the
eos ban of a minimum length, the forced eos, the exponential length penalty, suppressed tokens, then (when sampling) temperature, top-k, top-p,
min-p, typical-p, epsilon and eta cutoffs. Filtered tokens get ``-inf``; the warpers always
leave at least one token.

A row holding ``+inf`` logits (a tiny repetition penalty overflows float32, as may a float16
model's logits) takes the limit of its values growing without bound: its probability is spread
evenly over its ``+inf`` entries, 0 elsewhere. :func:`softmax` and :func:`log_softmax` apply
that rule (and so do top-p, min-p and sampling, which read them); greedy choice takes the first
``+inf`` entry, argmax's rule for ties.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np

from .options import SamplingOptions

__all__ = ["sequence_bias", "bad_words", "repetition_penalty", "no_repeat_ngram", "suppress", "ban_eos", "force",
           "length_decay", "temperature",
           "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "log_softmax", "softmax", "process",
           "choose", "sample"]


def sequence_bias(logits: np.ndarray, sequences: np.ndarray, biases: Sequence[Tuple[Tuple[int, ...], float]],
                  mask: Optional[np.ndarray] = None) -> np.ndarray:
    """transformers' ``sequence_bias``: for each ``(ids, bias)`` of ``biases``, ``bias`` is added
    to the logit of ``ids[-1]`` in the rows whose last ids are ``ids[:-1]`` (a one-id sequence:
    in every row). ``sequences [rows, length]`` are the ids so far; ``mask`` (same shape, 0 for
    padding) keeps a row's left padding from matching. The biases of a step are summed first
    and added once, one-id sequences first, as transformers adds them; ids beyond the
    vocabulary are skipped. Returns a new array (``logits`` itself when nothing applies)."""
    vocab = logits.shape[-1]
    bias: Optional[np.ndarray] = None
    ones = [(ids, b) for ids, b in biases if len(ids) == 1 and ids[0] < vocab]
    longer = sorted(((ids, b) for ids, b in biases if len(ids) > 1 and ids[-1] < vocab), key=lambda e: len(e[0]))
    if ones:
        bias = np.zeros((1, vocab), np.float32)
        for ids, b in ones:
            bias[0, ids[0]] = b
    width = sequences.shape[-1]
    for ids, b in longer:
        n = len(ids) - 1
        if n > width:
            continue
        rows = (sequences[:, width - n:] == np.asarray(ids[:-1])).all(axis=-1)
        if mask is not None:
            rows &= (mask[:, width - n:] != 0).all(axis=-1)
        if rows.any():
            if bias is None or bias.shape[0] == 1:
                bias = np.zeros((sequences.shape[0], vocab), np.float32) + (0 if bias is None else bias)
            with np.errstate(invalid="ignore"):
                bias[rows, ids[-1]] += np.float32(b)
    if bias is None:
        return logits
    with np.errstate(invalid="ignore"):
        return (np.asarray(logits, dtype=np.float32) + bias).astype(np.float32)


def bad_words(logits: np.ndarray, sequences: np.ndarray, words: Sequence[Tuple[int, ...]],
              eos: Sequence[int] = (), mask: Optional[np.ndarray] = None) -> np.ndarray:
    """transformers' ``bad_words_ids``: :func:`sequence_bias` with ``-inf`` for each word, the
    one-id words equal to an ``eos`` id left out (as transformers leaves them)."""
    return sequence_bias(logits, sequences, [(w, -np.inf) for w in words if not (len(w) == 1 and w[0] in eos)], mask)


def repetition_penalty(logits: np.ndarray, sequences: np.ndarray, penalty: float,
                       mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Divide positive (multiply negative) logits of the tokens already in each row by ``penalty``.

    ``sequences [rows, length]`` are the ids so far (ids beyond the vocabulary are skipped, a
    negative one raises ``ValueError``); ``mask`` (same shape, 0 for padding) excludes padding
    positions. Returns a new array (``logits`` itself when ``penalty == 1``).
    The products are taken in float64 (a penalty beyond float32's range does not round to 0 or
    ``inf``); those beyond float32's range become ``-inf`` or ``+inf`` (the module docstring)."""
    if penalty == 1.0 or sequences.shape[1] == 0:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    vocab = out.shape[-1]
    for r in range(out.shape[0]):
        ids = sequences[r] if mask is None else sequences[r][mask[r] != 0]
        ids = np.unique(ids)
        if ids.size and ids[0] < 0:
            raise ValueError(f"repetition_penalty: negative token id {int(ids[0])}")
        ids = ids[ids < vocab]  # ids beyond the logits have nothing to penalize (as transformers)
        v = out[r, ids].astype(np.float64)
        with np.errstate(over="ignore"):
            out[r, ids] = np.where(v < 0, v * penalty, v / penalty)
    return out


def no_repeat_ngram(logits: np.ndarray, sequences: np.ndarray, n: int,
                    mask: Optional[np.ndarray] = None) -> np.ndarray:
    """transformers' ``no_repeat_ngram_size``: in each row, the tokens that would complete an
    n-gram already present in the row (its last ``n - 1`` ids followed by the token) get
    ``-inf``; ``n = 1`` bans every id the row holds. ``sequences [rows, length]`` are the ids so
    far; ``mask`` (same shape, 0 for padding) leaves a row's left padding out, so padding never
    forms an n-gram. Ids beyond the vocabulary are skipped. Returns a new array (``logits``
    itself when ``n == 0`` or no row is long enough)."""
    if n <= 0:
        return logits
    out: Optional[np.ndarray] = None
    vocab = logits.shape[-1]
    for r in range(sequences.shape[0]):
        seq = sequences[r] if mask is None else sequences[r][mask[r] != 0]
        if seq.size < n:  # (no n-gram yet; transformers bans nothing there either)
            continue
        windows = np.lib.stride_tricks.sliding_window_view(seq, n)
        if n > 1:
            windows = windows[(windows[:, :-1] == seq[seq.size - n + 1:]).all(axis=1)]
        banned = windows[:, -1]
        banned = banned[(banned >= 0) & (banned < vocab)]
        if banned.size:
            if out is None:
                out = np.array(logits, dtype=np.float32, copy=True)
            out[r, banned] = -np.inf
    return logits if out is None else out


def suppress(logits: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """``logits`` with the ``ids`` (those inside the vocabulary) set to ``-inf`` in every row:
    transformers' ``suppress_tokens`` and ``begin_suppress_tokens``. Returns a new array
    (``logits`` itself when no id applies)."""
    ids = [i for i in ids if 0 <= i < logits.shape[-1]]
    if not ids:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    out[:, ids] = -np.inf
    return out


def ban_eos(logits: np.ndarray, eos: Sequence[int]) -> np.ndarray:
    """:func:`suppress` of the ``eos`` ids: transformers' ``min_new_tokens`` / ``min_length``
    before a row reaches that length."""
    return suppress(logits, eos)


def temperature(logits: np.ndarray, t: float) -> np.ndarray:
    """``logits / t``. Where a temperature is so small that a row's quotients overflow float32
    (``t = 1e-38`` turns large logits into ``+inf``, or every logit of a row of log-probabilities
    into ``-inf``; a ``t`` below float32's range divides by 0), the row takes the limit
    ``t -> 0``: its largest logits become 0 and every other one ``-inf``, so sampling picks the
    greedy token instead of reading a NaN softmax."""
    if t == 1.0:
        return logits
    x = np.asarray(logits, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = x / np.float32(t)
    lost = np.isneginf(out).all(axis=-1) & ~np.isneginf(x).all(axis=-1)  # every quotient overflowed to -inf
    # (a NaN logit passes through, as at t = 1: sampling refuses it)
    made_nan = np.isnan(out) & ~np.isnan(x)
    bad = (made_nan.any(axis=-1) | np.isposinf(out).any(axis=-1) | lost) & ~np.isnan(x).any(axis=-1)
    for r in np.flatnonzero(bad & ~np.isnan(logits).all(axis=-1)):
        row = logits[r]
        out[r] = np.where(row == np.nanmax(row), np.float32(0), np.float32(-np.inf))
    return out


def top_k(logits: np.ndarray, k: int, keep: int = 1) -> np.ndarray:
    """Keep the ``k`` largest logits of each row (ties with the k-th are kept), others ``-inf``;
    at least ``keep`` (transformers' ``min_tokens_to_keep``)."""
    if k > 0:
        k = max(k, keep)
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    return np.where(logits < _kth_largest(logits, k), -np.inf, logits).astype(np.float32)


def top_p(logits: np.ndarray, p: float, keep: int = 1) -> np.ndarray:
    """Nucleus filtering: keep the smallest set of most probable tokens whose probability
    reaches ``p`` (transformers' rule: drop the tokens whose ascending cumulative probability
    is at most ``1 - p``; the ``keep`` most probable tokens are always kept)."""
    if p >= 1.0:
        return logits
    order = np.argsort(logits, axis=-1, kind="stable")
    sorted_logits = np.take_along_axis(logits, order, axis=-1)
    # float32 probabilities, cumulative sums and cutoff, as transformers computes them (a
    # float64 cutoff 1 - p = 0.0999... kept a token whose float32 cumulative sum is 0.1)
    cum = np.cumsum(softmax(sorted_logits).astype(np.float32), axis=-1, dtype=np.float32)
    drop_sorted = cum <= np.float32(1.0 - p)
    drop_sorted[:, -max(1, keep):] = False
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, -np.inf, logits).astype(np.float32)


def min_p(logits: np.ndarray, p: float, keep: int = 1) -> np.ndarray:
    """Drop tokens whose probability is below ``p`` times the row's largest probability, keeping
    at least the ``keep`` most probable."""
    if p <= 0.0:
        return logits
    # prob_i < p * prob_max compared in log space, in float64 (exactly as the ratio of the
    # float32 logits' probabilities: a product of rounded probabilities kept or dropped tokens
    # right at the cutoff); a +inf maximum keeps only the +inf entries (the module docstring's
    # limit), a NaN row stays as it is
    x = np.asarray(logits, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        drop = x - x.max(axis=-1, keepdims=True) < np.log(p)
    if keep > 1:
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :keep]
        np.put_along_axis(drop, order, False, axis=-1)
    return np.where(drop, -np.inf, logits).astype(np.float32)


def _kth_largest(logits: np.ndarray, keep: int) -> np.ndarray:
    """Each row's ``keep``-th largest logit, ``[rows, 1]`` (the last when ``keep`` exceeds the row)."""
    k = min(max(keep, 1), logits.shape[-1])
    return np.partition(logits, -k, axis=-1)[:, -k][:, None]


def typical_p(logits: np.ndarray, mass: float, keep: int = 1) -> np.ndarray:
    """Locally typical sampling (transformers' ``typical_p``): sort the tokens by how far their
    information ``-log p`` lies from the row's entropy, keep the closest ones until their
    probability reaches ``mass`` (the first token whose cumulative probability is not below
    ``mass`` included, and every token tied with it), and at least ``keep``."""
    if mass >= 1.0:
        return logits
    x = np.asarray(logits, dtype=np.float32)
    logp = log_softmax(x)
    p = np.exp(logp)
    with np.errstate(invalid="ignore"):
        entropy = -np.nansum(logp * p, axis=-1, keepdims=True, dtype=np.float32)
        distance = np.abs(-logp - entropy)
    order = np.argsort(distance, axis=-1, kind="stable")
    sorted_distance = np.take_along_axis(distance, order, axis=-1)
    cum = np.cumsum(softmax(np.take_along_axis(x, order, axis=-1)).astype(np.float32), axis=-1, dtype=np.float32)
    last = np.minimum((cum < np.float32(mass)).sum(axis=-1), x.shape[-1] - 1)
    drop_sorted = sorted_distance > np.take_along_axis(sorted_distance, last[:, None], axis=-1)
    drop_sorted[:, :max(keep, 1)] = False
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, -np.inf, x).astype(np.float32)


def epsilon_cutoff(logits: np.ndarray, epsilon: float, keep: int = 1) -> np.ndarray:
    """Epsilon sampling (transformers' ``epsilon_cutoff``): drop the tokens whose probability is
    below ``epsilon``, keeping at least the ``keep`` most probable."""
    if epsilon <= 0.0:
        return logits
    return _floor(logits, softmax(logits) < epsilon, keep)


def eta_cutoff(logits: np.ndarray, epsilon: float, keep: int = 1) -> np.ndarray:
    """Eta sampling (transformers' ``eta_cutoff``): drop the tokens whose probability is below
    ``min(epsilon, sqrt(epsilon) * exp(-entropy))``, keeping at least the ``keep`` most
    probable."""
    if epsilon <= 0.0:
        return logits
    probs = softmax(logits)
    with np.errstate(invalid="ignore", divide="ignore"):
        entropy = -np.where(probs > 0, probs * np.log(probs), 0.0).sum(axis=-1, keepdims=True)
    eta = np.minimum(epsilon, math.sqrt(epsilon) * np.exp(-entropy))
    return _floor(logits, probs < eta, keep)


def _floor(logits: np.ndarray, below: np.ndarray, keep: int) -> np.ndarray:
    """``logits`` with the ``below`` entries set to ``-inf``, except the ``keep`` largest of
    each row (and those tied with the ``keep``-th)."""
    x = np.asarray(logits, dtype=np.float32)
    drop = below & (x < _kth_largest(x, keep))
    return np.where(drop, -np.inf, x).astype(np.float32)


def _shifted(logits: np.ndarray) -> np.ndarray:
    """``logits - rowmax`` in float32 (float64 stays float64): numpy's float32 ``exp`` is
    vectorized and an order of magnitude faster than float64's, which matters at vocabularies
    of 32k-256k on every generated token. A row whose maximum is ``+inf`` becomes 0 at its
    ``+inf`` entries and ``-inf`` elsewhere (the module docstring's limit), not NaN."""
    x = np.asarray(logits)
    if x.dtype != np.float64:
        x = x.astype(np.float32, copy=False)
    top = x.max(axis=-1, keepdims=True)
    inf = np.isposinf(top)
    if inf.any():
        x = np.where(inf, np.where(np.isposinf(x), x.dtype.type(0), x.dtype.type(-np.inf)), x)
        top = np.where(inf, x.dtype.type(0), top)
    with np.errstate(invalid="ignore"):  # a row of -inf only (or NaN) gives NaN: sampling refuses it
        return x - top


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, float64 (``-inf`` logits get probability 0). The exponentials are
    taken in the input's precision (float32 unless float64) and summed in float64."""
    e = np.exp(_shifted(logits))
    return e / e.sum(axis=-1, keepdims=True, dtype=np.float64)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, float32 (exponentials in the input's precision, sums in float64;
    within 2e-6 of a float64 computation for float32 logits)."""
    d = _shifted(logits)
    lse = np.log(np.exp(d).sum(axis=-1, keepdims=True, dtype=np.float64))
    return (d - lse).astype(np.float32)


def force(logits: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """Every logit ``-inf`` except the ``ids`` (those inside the vocabulary), which are 0:
    transformers' ``forced_eos_token_id`` at the last position."""
    out = np.full(logits.shape, -np.inf, dtype=np.float32)
    out[:, [i for i in ids if 0 <= i < logits.shape[-1]]] = 0.0
    return out


def length_decay(logits: np.ndarray, eos: Sequence[int], factor: float, n: int) -> np.ndarray:
    """transformers' ``exponential_decay_length_penalty`` ``n`` tokens past its start: each
    finite eos logit ``x`` becomes ``x + |x| * (factor ** n - 1)``."""
    ids = [e for e in eos if 0 <= e < logits.shape[-1]]
    if not ids or n <= 0:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    x = out[:, ids]
    with np.errstate(over="ignore", invalid="ignore"):
        penalty = np.abs(x) * np.float32(factor ** n - 1)
    out[:, ids] = x + np.where(np.isfinite(x), penalty, np.float32(0))
    return out


def process(logits: np.ndarray, opts: SamplingOptions, sequences: np.ndarray,
            mask: Optional[np.ndarray] = None, sampling: Optional[bool] = None, keep: int = 1,
            eos: Sequence[int] = (), min_length: int = 0, begin: int = -1, max_length: int = -1) -> np.ndarray:
    """The processed logits that greedy choice or sampling reads.

    The sequence bias, repetition penalty, ``opts.no_repeat_ngram_size``, bad words, the eos
    ban and suppressed tokens always apply; temperature, top-k, top-p, min-p, typical-p and the
    epsilon and eta cutoffs only when sampling (``sampling`` defaults to ``opts.do_sample``), as
    in transformers. ``keep``: the fewest tokens each warper leaves (transformers'
    ``min_tokens_to_keep``: 1, and for beam sampling the number of eos ids + 1, at least 2, so
    that beams can branch). ``eos`` are banned while ``sequences`` (prompt included, padding
    counted as transformers counts it) are shorter than ``min_length``: the caller's prompt
    width plus ``opts.min_new_tokens``. ``opts.begin_suppress_tokens`` are banned when
    ``sequences`` are ``begin`` positions wide: the caller's prompt width (-1: never), which
    also starts ``opts.exponential_decay_length_penalty``; ``opts.forced_eos_token_id`` is
    forced when they are ``max_length - 1`` wide (the last position; -1: never)."""
    out = sequence_bias(logits, sequences, opts.sequence_bias, mask)
    out = repetition_penalty(out, sequences, opts.repetition_penalty, mask)
    out = no_repeat_ngram(out, sequences, opts.no_repeat_ngram_size, mask)
    out = bad_words(out, sequences, opts.bad_words_ids, eos, mask)
    width = sequences.shape[-1]
    if width < min_length:
        out = ban_eos(out, eos)
    if opts.forced_eos_token_id and width == max_length - 1:
        out = force(out, opts.forced_eos_token_id)
    if opts.exponential_decay_length_penalty is not None and begin >= 0:
        start, factor = opts.exponential_decay_length_penalty
        out = length_decay(out, eos, factor, width - (begin + start))
    out = suppress(out, opts.suppress_tokens)
    if width == begin:
        out = suppress(out, opts.begin_suppress_tokens)
    if opts.do_sample if sampling is None else sampling:
        out = min_p(top_p(top_k(temperature(out, opts.temperature), opts.top_k, keep), opts.top_p, keep),
                    opts.min_p, keep)
        out = eta_cutoff(epsilon_cutoff(typical_p(out, opts.typical_p, keep), opts.epsilon_cutoff, keep),
                         opts.eta_cutoff, keep)
    return out


def choose(processed: np.ndarray, do_sample: bool, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row: argmax, or a draw from ``softmax(processed)`` with ``rng``."""
    if not do_sample:
        return np.argmax(processed, axis=-1).astype(np.int64)
    return sample(softmax(processed), rng)


def sample(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row from ``probs [rows, vocab]`` (rows sum to 1) with ``rng``. A row holding
    NaN (NaN logits) or no probability at all (every logit ``-inf``) raises ``ValueError``, as
    transformers' sampling refuses them."""
    if np.isnan(probs).any() or not (probs.sum(axis=-1) > 0).all():
        raise ValueError("cannot sample: the logits hold NaN, or every token of a row is -inf "
                         "(the model's output is not a distribution)")
    cum = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[0]) * cum[:, -1]
    idx = (cum > u[:, None]).argmax(axis=-1)
    return idx.astype(np.int64)
