"""Speculative decoding: a proposer drafts tokens, the target verifies them in one run.

Proposers: :class:`DraftModel` (a smaller decoder with the same vocabulary, run token by
token) and :class:`PromptLookup` (copies the tokens that followed the latest earlier occurrence
of the sequence's last n-gram; no model). The target runs ``[last token, d1 .. dk]`` as one step
of ``k + 1`` positions. Greedy: drafts are accepted while they equal the target's argmax, then
the target's own token follows, so the output is token for token the greedy output. Sampling:
draft ``d_i`` drawn from ``q`` is accepted with probability ``min(1, p(d_i) / q(d_i))``; on a
rejection the token is drawn from ``max(0, p - q)`` renormalized, after all acceptances from
the target's next distribution: the standard rule, which leaves the distribution unchanged
(a prompt-lookup draft is a point mass ``q``). Rejected positions are removed from both runners
with ``truncate``. One row at a time (``generate`` runs batch rows one after another).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from . import logits_process as lp
from .options import SamplingOptions, StopCondition

__all__ = ["DraftModel", "PromptLookup", "speculative_decode", "accept_greedy", "accept_sampled",
           "check_draft_vocabulary"]


def check_draft_vocabulary(target: int, draft: int) -> None:
    """Raise ``ValueError`` unless the draft model's vocabulary size equals the target's."""
    if draft != target:
        raise ValueError(f"the draft model's vocabulary ({draft} logits) differs from the target's ({target}): "
                         "speculative decoding needs the same vocabulary")


def accept_greedy(processed: np.ndarray, drafts: List[int]) -> Tuple[int, int]:
    """Greedy verification: the number of leading drafts equal to the target's argmax over
    ``processed [k + 1, vocab]``, and the target's token after them."""
    best = np.argmax(processed, axis=-1)
    n = 0
    while n < len(drafts) and int(best[n]) == drafts[n]:
        n += 1
    return n, int(best[n])


def accept_sampled(p: np.ndarray, q: np.ndarray, drafts: List[int], rng: np.random.Generator) -> Tuple[int, int]:
    """The standard speculative sampling rule.

    ``p [k + 1, vocab]``: the target's distributions at each draft position and after the last;
    ``q [k, vocab]``: the distributions the drafts were drawn from. Draft ``i`` is accepted with
    probability ``min(1, p[i, d] / q[i, d])``; the first rejection draws the next token from
    ``max(0, p[i] - q[i])`` renormalized; after ``k`` acceptances it is drawn from ``p[k]``.
    Returns (accepted drafts, next token); the output tokens are distributed as the target's."""
    for i, d in enumerate(drafts):
        if rng.random() * q[i, d] < p[i, d]:
            continue
        resid = np.maximum(p[i] - q[i], 0.0)
        total = resid.sum()
        dist = resid / total if total > 0 else p[i]
        return i, int(lp.sample(dist[None, :], rng)[0])
    k = len(drafts)
    return k, int(lp.sample(p[k:k + 1], rng)[0])


class DraftModel:
    """Drafts with a decoder ``runner`` of one row, holding a prefix of the sequence."""

    def __init__(self, runner: Any, opts: SamplingOptions, vocab: Optional[int] = None) -> None:
        """``vocab``: the target's vocabulary size when known; the draft's logits must have it
        (:meth:`propose` raises ``ValueError`` otherwise, before any draft token is used)."""
        self.runner, self.opts, self.vocab = runner, opts, vocab
        # the eos ids banned while a sequence is shorter than min_length (speculative_decode sets
        # them: the target's rule, so that the drafts' distributions are the ones it verifies)
        self.eos: Tuple[int, ...] = ()
        self.min_length = 0

    def propose(self, seq: np.ndarray, k: int, rng: np.random.Generator) -> Tuple[List[int], Optional[np.ndarray]]:
        """Up to ``k`` draft tokens after ``seq`` and the draft's distributions ``[k, vocab]``
        (None when greedy)."""
        drafts: List[int] = []
        probs: List[np.ndarray] = []
        cur = seq
        for _ in range(k):
            logits = self.runner.run(cur[None, self.runner.length:])[:, -1, :].astype(np.float32)
            if self.vocab is not None:
                check_draft_vocabulary(self.vocab, logits.shape[-1])
            processed = lp.process(logits, self.opts, cur[None, :], eos=self.eos, min_length=self.min_length)
            if self.opts.do_sample:
                q = lp.softmax(processed)
                tok = int(lp.sample(q, rng)[0])
                probs.append(q[0])
            else:
                tok = int(np.argmax(processed[0]))
            drafts.append(tok)
            cur = np.append(cur, tok)
        return drafts, (np.stack(probs) if probs else None)

    def accept(self, seq: np.ndarray) -> None:
        """``seq`` is the sequence after verification: drop cached positions past its agreement."""
        keep = min(self.runner.length, seq.size - 1)
        self.runner.truncate(keep)

    def cache_bytes(self) -> int:
        """Bytes of K/V the draft holds."""
        return self.runner.cache_bytes()


class PromptLookup:
    """Drafts the tokens that followed the latest earlier match of the sequence's last n-gram
    (n from ``max_ngram`` down to 1), like transformers' prompt lookup decoding."""

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def propose(self, seq: np.ndarray, k: int, rng: np.random.Generator) -> Tuple[List[int], Optional[np.ndarray]]:
        """Up to ``k`` tokens copied from the sequence itself; no distributions (point masses)."""
        n_total = seq.size
        for n in range(min(self.max_ngram, n_total - 1), 0, -1):
            tail = seq[n_total - n:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[:n_total - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            for start in hits[::-1]:
                follow = seq[start + n:start + n + k]
                if follow.size and start + n < n_total:
                    return [int(t) for t in follow], None
        return [], None

    def accept(self, seq: np.ndarray) -> None:
        """Nothing to undo."""

    def cache_bytes(self) -> int:
        """No K/V."""
        return 0


def speculative_decode(target: Any, proposer: Any, prompt: np.ndarray, opts: SamplingOptions, stop: StopCondition,
                       max_new_tokens: int, num_draft_tokens: int, rng: np.random.Generator,
                       emit: Callable[[List[int]], None], on_prefill: Callable[[], None],
                       scores: Optional[List[np.ndarray]] = None) -> Tuple[np.ndarray, dict]:
    """Generate up to ``max_new_tokens`` after the 1-D ``prompt`` on the one-row runner ``target``.

    ``emit(tokens)`` receives the tokens each verification step adds; ``on_prefill()`` is
    called after the prompt run. ``scores``, when a list, receives per generated token the
    target's log-probabilities ``[1, vocab]`` after the logits processors at that position
    (what non-speculative decoding reports). Returns the generated tokens and counts
    ``{"draft_tokens", "accepted_draft_tokens", "verify_steps"}``."""
    stats = {"draft_tokens": 0, "accepted_draft_tokens": 0, "verify_steps": 0}
    seq = prompt.astype(np.int64)
    min_length = prompt.size + opts.min_new_tokens  # the eos ids are banned below it

    def process(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return lp.process(x, opts, ids[None, :], eos=stop.eos, min_length=min_length, begin=prompt.size,
                          max_length=prompt.size + max_new_tokens)

    if isinstance(proposer, DraftModel):
        proposer.eos, proposer.min_length = stop.eos, min_length
    logits = target.run(seq[None, :])[:, -1, :].astype(np.float32)
    on_prefill()
    if isinstance(proposer, DraftModel) and proposer.vocab is None:
        proposer.vocab = logits.shape[-1]
    processed = process(logits, seq)
    first = lp.choose(processed, opts.do_sample, rng)
    if scores is not None:
        scores.append(lp.log_softmax(processed))
    seq = np.append(seq, first[0])
    new = 1
    emit([int(first[0])])
    finished = stop.hit(seq)
    while new < max_new_tokens and not finished:
        k = min(num_draft_tokens, max_new_tokens - new - 1)
        drafts, q = proposer.propose(seq, k, rng) if k > 0 else ([], None)
        feed = np.array([seq[-1]] + drafts, np.int64)[None, :]
        out = target.run(feed)[0].astype(np.float32)  # [len(drafts) + 1, vocab]
        stats["verify_steps"] += 1
        stats["draft_tokens"] += len(drafts)
        # processed target rows, each given the drafts before it (only read when those were accepted)
        # (np.append of an empty list would turn the ids into float64)
        rows = [process(out[i:i + 1], np.append(seq, np.asarray(drafts[:i], np.int64)))[0]
                for i in range(len(drafts) + 1)]
        if opts.do_sample:
            p = lp.softmax(np.stack(rows))
            if q is None:  # prompt lookup: point masses
                q = np.zeros((len(drafts), p.shape[1]))
                q[np.arange(len(drafts)), drafts] = 1.0
            n, nxt = accept_sampled(p, q, drafts, rng)
        else:
            n, nxt = accept_greedy(np.stack(rows), drafts)
        accepted = drafts[:n]
        stats["accepted_draft_tokens"] += len(accepted)
        produced = accepted + [nxt]
        kept: List[int] = []
        for i, t in enumerate(produced):
            if new >= max_new_tokens:
                break
            seq = np.append(seq, t)
            kept.append(t)
            if scores is not None:
                scores.append(lp.log_softmax(rows[i][None, :]))
            new += 1
            if stop.hit(seq):
                finished = True
                break
        target.truncate(seq.size - 1)
        proposer.accept(seq)
        emit(kept)
    return seq[prompt.size:], stats
