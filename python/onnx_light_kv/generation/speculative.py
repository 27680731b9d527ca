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

__all__ = ["DraftModel", "PromptLookup", "speculative_decode"]


class DraftModel:
    """Drafts with a decoder ``runner`` of one row, holding a prefix of the sequence."""

    def __init__(self, runner: Any, opts: SamplingOptions) -> None:
        self.runner, self.opts = runner, opts

    def propose(self, seq: np.ndarray, k: int, rng: np.random.Generator) -> Tuple[List[int], Optional[np.ndarray]]:
        """Up to ``k`` draft tokens after ``seq`` and the draft's distributions ``[k, vocab]``
        (None when greedy)."""
        drafts: List[int] = []
        probs: List[np.ndarray] = []
        cur = seq
        for _ in range(k):
            logits = self.runner.run(cur[None, self.runner.length:])[:, -1, :].astype(np.float32)
            processed = lp.process(logits, self.opts, cur[None, :])
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
                       emit: Callable[[List[int]], None], on_prefill: Callable[[], None]) -> Tuple[np.ndarray, dict]:
    """Generate up to ``max_new_tokens`` after the 1-D ``prompt`` on the one-row runner ``target``.

    ``emit(tokens)`` receives the tokens each verification step adds; ``on_prefill()`` is
    called after the prompt run. Returns the generated tokens and counts
    ``{"draft_tokens", "accepted_draft_tokens", "verify_steps"}``."""
    stats = {"draft_tokens": 0, "accepted_draft_tokens": 0, "verify_steps": 0}
    seq = prompt.astype(np.int64)
    logits = target.run(seq[None, :])[:, -1, :].astype(np.float32)
    on_prefill()
    first = lp.choose(lp.process(logits, opts, seq[None, :]), opts.do_sample, rng)
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
        accepted: List[int] = []
        cur = seq
        nxt = -1
        for i in range(len(drafts) + 1):
            processed = lp.process(out[i:i + 1], opts, cur[None, :])
            if i == len(drafts):  # every draft accepted: the target's own next token
                nxt = int(lp.choose(processed, opts.do_sample, rng)[0])
                break
            d = drafts[i]
            if not opts.do_sample:
                t = int(np.argmax(processed[0]))
                if t == d:
                    accepted.append(d)
                    cur = np.append(cur, d)
                    continue
                nxt = t
                break
            p = lp.softmax(processed)[0]
            qi = q[i] if q is not None else np.eye(1, p.size, d)[0]
            if rng.random() * qi[d] < p[d]:  # accept with probability min(1, p/q)
                accepted.append(d)
                cur = np.append(cur, d)
                continue
            resid = np.maximum(p - qi, 0.0)
            total = resid.sum()
            nxt = int(lp.sample((resid / total)[None, :], rng)[0]) if total > 0 else int(lp.sample(p[None, :], rng)[0])
            break
        stats["accepted_draft_tokens"] += len(accepted)
        produced = accepted + [nxt]
        kept: List[int] = []
        for t in produced:
            if new >= max_new_tokens:
                break
            seq = np.append(seq, t)
            kept.append(t)
            new += 1
            if stop.hit(seq):
                finished = True
                break
        target.truncate(seq.size - 1)
        proposer.accept(seq)
        emit(kept)
    return seq[prompt.size:], stats
