"""Sampling: the logits processors against naive references, seeded determinism, and the
distribution of sampled tokens (chi-square, fixed seed, loose bound) for plain and speculative
sampling."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import _gen_common as gc

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.generation import logits_process as lp  # noqa: E402
from onnx_light_kv.generation.speculative import accept_sampled  # noqa: E402


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


def _naive_filter(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The expected sampling distribution, one row, written with plain loops."""
    x = [float(v) / temperature for v in logits]
    keep = [True] * len(x)
    if top_k:
        order = sorted(range(len(x)), key=lambda i: -x[i])
        for i in order[top_k:]:
            if x[i] < x[order[top_k - 1]]:
                keep[i] = False
    probs = _softmax(np.array([v if k else -np.inf for v, k in zip(x, keep)]))
    if top_p < 1.0:
        order = sorted(range(len(x)), key=lambda i: -probs[i])
        total = 0.0
        for i in order:
            if total >= top_p:
                keep[i] = False
            total += probs[i]
        probs = _softmax(np.array([v if k else -np.inf for v, k in zip(x, keep)]))
    if min_p > 0:
        m = probs.max()
        keep = [k and probs[i] >= min_p * m for i, k in enumerate(keep)]
        probs = _softmax(np.array([v if k else -np.inf for v, k in zip(x, keep)]))
    return probs


def _chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df) (z = 3.719: p = 1e-4)."""
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def _chi2(counts: np.ndarray, probs: np.ndarray) -> Any:
    n = counts.sum()
    exp = probs * n
    assert counts[exp == 0].sum() == 0, "a filtered-out token was sampled"
    big = exp >= 5
    obs_cells = list(counts[big]) + [counts[~big & (exp > 0)].sum()]
    exp_cells = list(exp[big]) + [exp[~big & (exp > 0)].sum()]
    pairs = [(o, e) for o, e in zip(obs_cells, exp_cells) if e > 0]
    stat = sum((o - e) ** 2 / e for o, e in pairs)
    return stat, len(pairs) - 1


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k(k: int) -> None:
    x = np.array([[0.5, 2.0, -1.0, 2.0, 0.0, 3.0, 1.0, -2.0]], np.float32)
    got = lp.top_k(x, k)
    kth = np.sort(x[0])[::-1][k - 1]
    np.testing.assert_array_equal(np.isfinite(got[0]), x[0] >= kth)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8, 0.95, 0.999])
def test_top_p_and_min_p_against_naive(p: float) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16)).astype(np.float32) * 2
    for r in range(4):  # (rtol: the exponentials are float32)
        want = _naive_filter(x[r], 1.0, 0, p, 0.0)
        np.testing.assert_allclose(lp.softmax(lp.top_p(x[r:r + 1], p))[0], want, rtol=1e-6, atol=1e-12)
        want = _naive_filter(x[r], 1.0, 0, 1.0, p)
        np.testing.assert_allclose(lp.softmax(lp.min_p(x[r:r + 1], p))[0], want, rtol=1e-6, atol=1e-12)


def test_repetition_penalty_and_temperature() -> None:
    x = np.array([[2.0, -2.0, 1.0, -1.0]], np.float32)
    got = lp.repetition_penalty(x, np.array([[0, 1, 1, 0]]), 2.0)
    np.testing.assert_allclose(got, [[1.0, -4.0, 1.0, -1.0]])
    got = lp.repetition_penalty(x, np.array([[0, 3]]), 2.0, mask=np.array([[0, 1]]))  # padding excluded
    np.testing.assert_allclose(got, [[2.0, -2.0, 1.0, -2.0]])
    np.testing.assert_allclose(lp.temperature(x, 0.5), x * 2)
    # a temperature whose quotients overflow float32 takes the limit t -> 0 per row (greedy),
    # never a NaN softmax; rows that do not overflow are plain quotients
    y = np.array([[5.0, -5.0, 5.0, -1.0], [0.0, 0.0, 0.0, 0.0], [-np.inf, 9.0, 8.5, -np.inf]], np.float32)
    got = lp.temperature(y, 1e-38)
    np.testing.assert_array_equal(got[0], [0.0, -np.inf, 0.0, -np.inf])
    np.testing.assert_array_equal(got[1], [0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(got[2], [-np.inf, 0.0, -np.inf, -np.inf])
    assert np.isfinite(lp.softmax(got)).all()


def test_same_seed_same_tokens_and_greedy_limit() -> None:
    sess = gc.ours("llama")
    kw = dict(max_new_tokens=12, do_sample=True, temperature=1.3, top_k=50, top_p=0.95)
    a = olkv.generate(sess, gc.PROMPT, seed=7, **kw)
    b = olkv.generate(sess, gc.PROMPT, seed=7, **kw)
    np.testing.assert_array_equal(a.sequences, b.sequences)
    others = [olkv.generate(sess, gc.PROMPT, seed=s, **kw).new_tokens[0] for s in range(8, 12)]
    assert any(not np.array_equal(o, a.new_tokens[0]) for o in others)
    top1 = olkv.generate(sess, gc.PROMPT, max_new_tokens=12, do_sample=True, top_k=1, seed=3)
    np.testing.assert_array_equal(top1.new_tokens[0], gc.ort_greedy(gc.model("llama"), gc.PROMPT, 12))
    many = olkv.generate(sess, gc.PROMPT, seed=1, num_return_sequences=3, **kw)
    assert many.sequences.shape == (3, gc.PROMPT.size + 12)
    for t in (1e-38, 1e-45):  # logits / t overflow float32: sampling picks the greedy tokens
        cold = olkv.generate(sess, gc.PROMPT, max_new_tokens=12, do_sample=True, temperature=t, seed=3)
        np.testing.assert_array_equal(cold.new_tokens[0], top1.new_tokens[0])


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [(1.0, 0, 1.0, 0.0), (2.0, 5, 0.9, 0.0),
                                                          (3.0, 0, 1.0, 0.1)])
def test_first_token_distribution_chi_square(temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    vocab, n = 8, 4000
    mp = gc.model("llama", vocab=vocab, logit_scale=1.0)
    prompt = gc.PROMPT % vocab
    logits = gc.ort_logits_loop(mp, prompt, [])[0]
    probs = _naive_filter(logits, temperature, top_k, top_p, min_p)
    assert (probs > 0.01).sum() >= 3, "the test needs a spread-out distribution"
    sess = gc.ours("llama", vocab=vocab, logit_scale=1.0)
    out = olkv.generate(sess, np.tile(prompt, (n, 1)), max_new_tokens=1, do_sample=True,
                        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=1234)
    counts = np.bincount(out.new_tokens[:, 0], minlength=vocab)
    stat, df = _chi2(counts, probs)
    assert stat < _chi2_critical(df), f"chi2 {stat:.1f} (df {df}): counts {counts}, expected {probs * n}"


def test_speculative_acceptance_rule_keeps_the_target_distribution() -> None:
    rng = np.random.default_rng(5)
    vocab, k, n = 6, 3, 20000
    p = rng.dirichlet(np.ones(vocab), size=k + 1)
    q = rng.dirichlet(np.ones(vocab), size=k)
    first = np.zeros(vocab, np.int64)
    second = np.zeros(vocab, np.int64)
    accepted = 0
    for _ in range(n):
        drafts = [int(rng.choice(vocab, p=q[i])) for i in range(k)]
        m, nxt = accept_sampled(p, q, drafts, rng)
        out = drafts[:m] + [nxt]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
        accepted += m
    assert 0 < accepted < n * k
    for counts, probs in ((first, p[0]), (second, p[1])):
        stat, df = _chi2(counts, probs)
        assert stat < _chi2_critical(df), f"chi2 {stat:.1f}: {counts} vs {probs * counts.sum()}"


def test_sampled_speculative_is_seeded() -> None:
    sess = gc.ours("llama")
    kw = dict(max_new_tokens=10, do_sample=True, temperature=1.5, seed=11)
    a = olkv.generate(sess, gc.PROMPT, draft_session=gc.ours("llama", seed=1), **kw)
    b = olkv.generate(sess, gc.PROMPT, draft_session=gc.ours("llama", seed=1), **kw)
    np.testing.assert_array_equal(a.sequences, b.sequences)
    assert a.new_tokens.shape == (1, 10) and a.stats.draft_tokens > 0
