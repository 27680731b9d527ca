"""Beam search with transformers' scoring, length penalty and early-stopping rule.

All ``batch * num_beams`` beams live in one runner; each step the chosen beams are gathered
with ``runner.reorder`` (the prompt is run once per row and then expanded to the beams).
Per step and row: the ``max(2, 1 + n_eos) * num_beams`` best continuations of all beams
(summed log-probabilities after the logits processors; ``n_eos`` the number of eos ids, so
that ``num_beams`` continue even when eos continuations fill the top) are scanned in order;
an eos continuation ranked among the first ``num_beams`` becomes a finished hypothesis
scored ``sum_logprobs / generated_len ** length_penalty`` (the eos counted), the others
continue until ``num_beams`` beams are found. A row is done when it holds ``num_beams``
hypotheses and: ``early_stopping=True``; ``False``: the best running beam's score normalized
at the current length cannot beat the worst kept hypothesis; ``"never"``: the same bound
taken at the longest possible length when ``length_penalty > 0``. At the last step every
continuation ranked among the first ``num_beams`` is offered as a finished hypothesis, eos
or not (transformers' max-length criterion), and each row returns its
``num_return_sequences`` best.

A beam slot that no candidate fills holds no hypothesis (score ``-inf``): the first step's
copies of the prompt beyond the first beam (whose continuations would only repeat its own),
and the slots left when eos continuations or the sampling warpers use up a row's candidates.
Such slots never become candidates or hypotheses, and a row left without running beams is
done. Only real hypotheses are returned: a row that ends with fewer than
``num_return_sequences`` of them raises ``ValueError`` (in beam sampling the warpers keep at
least ``max(2, number of eos ids + 1)`` tokens per beam, transformers' ``min_tokens_to_keep``, so
beams branch even at ``top_k=1``; eos continuations can still use up a small row's candidates).

A continuation that ends with one of the stop sequences (which may start in the prompt) is
finished like an eos continuation, its stop tokens kept.

Beam sampling (``do_sample=True``) follows transformers: the log-probabilities go through the
repetition penalty and the sampling warpers (temperature, top-k, top-p, min-p), the beams'
running scores are added, and the candidates of a row (as many as above) are drawn without
replacement from the softmax of those summed scores over all its beams' continuations, then
ranked by score (see :func:`_sampled` for rows with fewer candidates of non-zero
probability). The rest is as above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple, Union

import numpy as np

from . import logits_process as lp
from .options import SamplingOptions, StopCondition

__all__ = ["BeamHypotheses", "beam_search", "BeamResult"]


@dataclass
class BeamHypotheses:
    """The best finished hypotheses of one row: ``(score, generated tokens, sum_logprobs)``."""

    num_beams: int
    length_penalty: float
    early_stopping: Union[bool, str]
    max_new_tokens: int
    hyps: List[Tuple[float, np.ndarray, float]] = field(default_factory=list)

    @property
    def worst_score(self) -> float:
        """The lowest kept score (``+inf`` while fewer than ``num_beams`` are kept)."""
        return min(h[0] for h in self.hyps) if len(self.hyps) >= self.num_beams else float("inf")

    def add(self, tokens: np.ndarray, sum_logprobs: float) -> None:
        """Offer a finished hypothesis (its generated tokens, eos included)."""
        score = sum_logprobs / (max(len(tokens), 1) ** self.length_penalty)
        if len(self.hyps) < self.num_beams or score > self.worst_score:
            self.hyps.append((score, tokens, sum_logprobs))
            if len(self.hyps) > self.num_beams:
                worst = min(range(len(self.hyps)), key=lambda i: self.hyps[i][0])
                del self.hyps[worst]

    def is_done(self, best_sum_logprobs: float, generated_len: int) -> bool:
        """Whether no running beam can still enter the kept hypotheses."""
        if len(self.hyps) < self.num_beams:
            return False
        if self.early_stopping is True:
            return True
        if self.early_stopping == "never" and self.length_penalty > 0:
            best = best_sum_logprobs / (self.max_new_tokens ** self.length_penalty)
        else:
            best = best_sum_logprobs / (max(generated_len, 1) ** self.length_penalty)
        return self.worst_score >= best


@dataclass
class BeamResult:
    """Per returned sequence: generated tokens, score; plus per-step log-probabilities."""

    tokens: List[np.ndarray]
    scores: np.ndarray
    step_scores: List[np.ndarray]


def _top(scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest entries of each row, best first (ties: lower index first).

    A value partition finds each row's n-th largest score; the entries at or above it (ties
    included) are then ranked, so ties at the boundary keep the lower indices."""
    rows, width = scores.shape
    n = min(n, width)
    out = np.empty((rows, n), np.int64)
    for r, row in enumerate(scores):
        th = np.partition(row, width - n)[width - n]
        idx = np.flatnonzero(row >= th)
        out[r] = idx[np.lexsort((idx, -row[idx]))][:n]
    return out


def _sampled(scores: np.ndarray, n: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Per row, ``n`` indices drawn without replacement from ``softmax(row)``, ranked by score,
    best first (ties: lower index first). When fewer than ``n`` have a probability that is not
    zero in float64 (a low temperature underflows), the rest are the best-scoring remaining
    finite candidates (the draw's limit as the probabilities vanish); filtered candidates and
    empty beam slots (``-inf``) are never taken, so a row may get fewer than ``n`` (none when
    every score is ``-inf``)."""
    live = np.isfinite(scores).any(axis=1)
    probs = np.zeros(scores.shape, np.float64)
    kept = scores[live]
    shifted = kept - kept.max(axis=1, keepdims=True)  # in float64: summed scores may pass float32's range
    with np.errstate(over="ignore"):  # differences beyond float32's range: probability 0 either way
        probs[live] = lp.softmax(shifted.astype(np.float32))
    out: List[np.ndarray] = []
    for row, p in zip(scores, probs):
        m = min(n, int(np.count_nonzero(p)))
        picked = rng.choice(p.size, size=m, replace=False, p=p)
        if m < n:
            rest = row.copy()
            rest[picked] = -np.inf
            more = _top(rest[None, :], min(n - m, rest.size))[0]
            picked = np.concatenate([picked, more[np.isfinite(rest[more])]])
        out.append(picked[np.lexsort((picked, -row[picked]))])
    return out


def beam_search(runner: Any, prompt: np.ndarray, mask: np.ndarray, opts: SamplingOptions, stop: StopCondition,
                max_new_tokens: int, num_beams: int, length_penalty: float, early_stopping: Union[bool, str],
                num_return_sequences: int, pad_token_id: int, return_scores: bool = False,
                on_step: Any = None, rng: Optional[np.random.Generator] = None) -> BeamResult:
    """Run beam search on ``runner`` (holding nothing yet) from ``prompt [batch, s]``.

    ``runner`` holds ``batch`` rows (the prompt runs once per row and is copied to the beams
    by ``reorder``) or, when its row count is fixed, ``batch * num_beams`` rows.
    Returns, for each row in order, its ``num_return_sequences`` best hypotheses (generated
    tokens only) and their scores. ``on_step()`` is called after each model run. ``rng`` draws
    the candidates when ``opts.do_sample``. Raises ``ValueError`` when a row ends with fewer
    than ``num_return_sequences`` hypotheses (the module docstring)."""
    batch, k = prompt.shape[0], num_beams
    rows = np.repeat(np.arange(batch), k)
    if runner.batch == batch * k and k > 1:  # a runner of fixed rows: every beam runs the prompt
        logits = np.asarray(runner.run(prompt[rows], mask[rows])[:, -1, :], dtype=np.float32)
    else:  # run the prompt once per row, then copy it to the beams
        logits = np.asarray(runner.run(prompt, mask)[:, -1, :], dtype=np.float32)
        runner.reorder(rows)
        logits = logits[rows]
    if on_step is not None:
        on_step()
    seq_prompt, mask_prompt = prompt[rows], mask[rows]
    gen = np.zeros((batch * k, 0), np.int64)
    beam_scores = np.zeros((batch, k), np.float64)
    beam_scores[:, 1:] = -np.inf  # empty slots until the first step: the beams would all be the prompt
    beam_scores = beam_scores.reshape(-1)
    hyps = [BeamHypotheses(k, length_penalty, early_stopping, max_new_tokens) for _ in range(batch)]
    done = np.zeros(batch, bool)
    step_scores: List[np.ndarray] = []
    eos = set(stop.eos)
    # the sampling filters leave at least min_keep tokens (transformers' min_tokens_to_keep), and each
    # step ranks min_keep * num_beams candidates a row (its beams_to_keep); the eos ids are counted
    # as given, repeats included, as there
    min_keep = max(2, 1 + len(stop.eos))
    keep = min_keep * k
    vocab = logits.shape[-1]
    if k > vocab:
        raise ValueError(f"num_beams={k} exceeds the vocabulary ({vocab} tokens): there are not that many "
                         "distinct hypotheses")
    if opts.do_sample and rng is None:
        rng = np.random.default_rng()
    # the prompt tails a stop sequence may start in (padding removed)
    longest = max((len(q) for q in stop.stop_sequences), default=0)
    tails = [prompt[b][mask[b] != 0][-longest:] if longest > 1 else prompt[b, :0] for b in range(batch)]

    def finishes(b: int, src: int, tok: int) -> bool:
        if tok in eos:
            return True
        if not stop.stop_sequences:
            return False
        return stop.hit(np.concatenate([tails[b], gen[src], [tok]]))

    for step in range(max_new_tokens):
        full = np.concatenate([seq_prompt, gen], axis=1)
        full_mask = np.concatenate([mask_prompt, np.ones_like(gen)], axis=1)
        logprobs = lp.log_softmax(logits)
        processed = lp.process(logprobs, opts, full, full_mask, keep=min_keep, eos=stop.eos,
                               min_length=seq_prompt.shape[1] + opts.min_new_tokens, begin=seq_prompt.shape[1],
                               max_length=seq_prompt.shape[1] + max_new_tokens)
        if return_scores:
            step_scores.append(processed)
        total = (processed.astype(np.float64) + beam_scores[:, None]).reshape(batch, k * vocab)
        best = _sampled(total, keep, rng) if opts.do_sample else _top(total, keep)
        last = step == max_new_tokens - 1
        new_beam = np.repeat(np.arange(batch) * k, k)
        new_tok = np.full(batch * k, pad_token_id, np.int64)
        new_score = np.zeros(batch * k, np.float64)
        for b in range(batch):
            if done[b]:
                continue
            n = 0
            for rank, flat in enumerate(best[b]):
                src, tok = b * k + int(flat) // vocab, int(flat) % vocab
                score = float(total[b, flat])
                if score == -np.inf:  # (ranked best first: no candidate is left)
                    break
                if last:  # the length limit finishes the first num_beams, eos or not
                    if rank == k:
                        break
                    hyps[b].add(np.append(gen[src], tok), score)
                    continue
                if finishes(b, src, tok):
                    if rank < k:
                        hyps[b].add(np.append(gen[src], tok), score)
                    continue
                new_beam[b * k + n], new_tok[b * k + n], new_score[b * k + n] = src, tok, score
                n += 1
                if n == k:
                    break
            new_score[b * k + n:(b + 1) * k] = -np.inf  # slots no candidate filled
            # the best running beam (slot 0: the candidates are ranked) against the kept ones
            done[b] = last or n == 0 or hyps[b].is_done(float(new_score[b * k]), step + 1)
        gen = np.concatenate([gen[new_beam], new_tok[:, None]], axis=1)
        beam_scores = new_score
        if done.all():
            break
        runner.reorder(new_beam)
        logits = np.asarray(runner.run(new_tok[:, None])[:, -1, :], dtype=np.float32)
        if on_step is not None:
            on_step()
    for b in range(batch):
        if not done[b]:
            for j in range(k):
                if beam_scores[b * k + j] > -np.inf:
                    hyps[b].add(gen[b * k + j].copy(), float(beam_scores[b * k + j]))
    tokens: List[np.ndarray] = []
    scores: List[float] = []
    for b in range(batch):
        found = len(hyps[b].hyps)
        if found < num_return_sequences:
            raise ValueError(f"beam search found {found} hypothes{'is' if found == 1 else 'es'} for row {b}, "
                             f"fewer than num_return_sequences={num_return_sequences}: the sampling warpers "
                             f"(top_k, top_p, min_p, a vanishing temperature) or the eos ids left fewer candidates "
                             f"than the {k} beams; widen the warpers or lower num_return_sequences")
        ranked = sorted(hyps[b].hyps, key=lambda h: -h[0])[:num_return_sequences]
        for score, toks, _ in ranked:
            tokens.append(toks)
            scores.append(score)
    return BeamResult(tokens=tokens, scores=np.array(scores, np.float32), step_scores=step_scores)
