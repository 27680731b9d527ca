"""Sampling: the logits processors against naive references, seeded determinism, and the
distribution of sampled tokens (chi-square, fixed seed, loose bound) for plain and speculative
sampling."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

import _gen_common as gc

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.generation import SamplingOptions  # noqa: E402
from onnx_light_kv.generation import logits_process as lp  # noqa: E402
from onnx_light_kv.generation.speculative import accept_sampled  # noqa: E402

INF = np.inf


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


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("penalty,row,want", [
    (1e-40, [2.0, -1.0, 0.0, 5.0], [INF, -1e-40, 0.0, 5.0]),  # 2 / 1e-40 overflows float32: +inf
    (1e-300, [2.0, -1.0, 0.0, 5.0], [INF, -0.0, 0.0, 5.0]),  # (a float32 penalty would be 0: 0 / 0 = NaN)
    (1e300, [2.0, -1.0, 0.0, 5.0], [0.0, -INF, 0.0, 5.0]),
    (2.0, [2.0, -1.0, 0.0, 5.0], [1.0, -2.0, 0.0, 5.0]),
])
def test_repetition_penalty_beyond_float32(penalty: float, row: list, want: list) -> None:
    """Any finite penalty > 0 is taken exactly (float64 products), the results beyond float32's
    range become infinities, never NaN, and no numpy warning leaks (token 3 is not penalized)."""
    got = lp.repetition_penalty(np.array([row], np.float32), np.array([[0, 1, 2]]), penalty)
    np.testing.assert_array_equal(got[0], np.array(want, np.float32))


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("t,row,want", [
    (1e-38, [5.0, -5.0, 5.0, -1.0], [0.0, -INF, 0.0, -INF]),  # quotients overflow to +inf
    (1e-38, [-5.0, -6.0, -INF, -7.0], [0.0, -INF, -INF, -INF]),  # log-probabilities: all overflow to -inf
    (1e-300, [1.0, 2.0, 0.0, 2.0], [-INF, 0.0, -INF, 0.0]),  # t rounds to 0 in float32: 1 / 0
    (1e-300, [0.0, -3.0, 0.0, -INF], [0.0, -INF, 0.0, -INF]),  # 0 / 0
    (0.5, [INF, 1.0, INF, -INF], [0.0, -INF, 0.0, -INF]),  # +inf logits: the +inf entries
    (0.5, [1.0, -2.0, 0.0, -INF], [2.0, -4.0, 0.0, -INF]),  # plain quotients
])
def test_temperature_limit_without_warnings(t: float, row: list, want: list) -> None:
    np.testing.assert_array_equal(lp.temperature(np.array([row], np.float32), t)[0], np.array(want, np.float32))


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("options", [dict(), dict(temperature=0.5), dict(temperature=2.0), dict(top_k=3),
                                     dict(top_p=0.9), dict(min_p=0.1), dict(top_k=4, top_p=0.8, min_p=0.2)])
def test_posinf_logits_are_uniform_over_their_entries_whatever_the_options(options: dict) -> None:
    """+inf logits (a tiny repetition penalty overflows float32) take one limit, with or
    without a temperature (t == 1 skips the division): the probability is spread evenly over
    the +inf entries; a row without +inf is unchanged; greedy choice takes the first +inf."""
    x = np.array([[-1.0, INF, 1.0, INF, -INF, 3.0], [0.5, 1.0, 0.0, 2.0, -1.0, 0.0]], np.float32)
    processed = lp.process(x, SamplingOptions(do_sample=True, **options), np.zeros((2, 0), np.int64))
    probs = lp.softmax(processed)
    np.testing.assert_allclose(probs[0], [0.0, 0.5, 0.0, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(np.exp(lp.log_softmax(processed)[0]), probs[0], atol=1e-7)
    alone = lp.process(x[1:], SamplingOptions(do_sample=True, **options), np.zeros((1, 0), np.int64))
    np.testing.assert_array_equal(processed[1:], alone)
    assert np.isfinite(probs[1]).all() and probs[1].sum() == pytest.approx(1.0)
    draws = np.concatenate([lp.choose(processed, True, np.random.default_rng(s))[:1] for s in range(200)])
    assert set(draws.tolist()) == {1, 3}
    assert lp.choose(lp.process(x, SamplingOptions(), np.zeros((2, 0), np.int64)), False, None)[0] == 1


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_tiny_repetition_penalty_samples_the_seen_tokens_at_any_temperature() -> None:
    """repetition_penalty=1e-40 turns the positive logits of the tokens seen so far into +inf:
    sampling draws among them, at temperature 1 as at 0.999 (same seed, same draws), through
    generate and Generator alike (it used to return token 0, a NaN softmax's pick, at t == 1)."""
    sess = gc.ours("llama")
    kw = dict(do_sample=True, repetition_penalty=1e-40, seed=0)
    outs = [olkv.generate(sess, gc.PROMPT, max_new_tokens=8, temperature=t, **kw).new_tokens[0] for t in (1.0, 0.999)]
    assert set(outs[0].tolist()) <= set(gc.PROMPT.tolist())
    np.testing.assert_array_equal(outs[0], outs[1])
    g = olkv.Generator(sess, **kw)
    g.append_tokens(gc.PROMPT)
    for _ in range(8):
        g.generate_next_token()
    np.testing.assert_array_equal(g.sequences[0, gc.PROMPT.size:], outs[0])


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
    for t in (1e-38, 1e-45, 1e-300):  # logits / t overflow float32: sampling picks the greedy tokens
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # (1e-300 is 0 in float32: no divide warning)
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


# Cases where a probability sits exactly on the cutoff, with transformers 5.25's results
# (TopPLogitsWarper, MinPLogitsWarper: float32 probabilities, sums and cutoff); a float64 cutoff
# kept one token too many (or dropped one).
@pytest.mark.parametrize("row,p,kept", [
    ([0.0] * 10, 0.9, 9),
    ([0.0] * 5, 0.8, 4),
    ([0.0] * 10, 0.8, 8),
    ([1.0986123, 0.0], 0.75, 1),
])
def test_top_p_cutoff_in_float32_as_transformers(row: list, p: float, kept: int) -> None:
    out = lp.top_p(np.array([row], np.float32), p)
    assert int(np.isfinite(out).sum()) == kept


@pytest.mark.parametrize("row,p,kept", [
    ([-0.91629076, -1.2039728, -1.2039728], 0.75, 3),
    ([1.0986123, 0.0], 1 / 3, 1),
])
def test_min_p_cutoff_in_float32_as_transformers(row: list, p: float, kept: int) -> None:
    out = lp.min_p(np.array([row], np.float32), p)
    assert int(np.isfinite(out).sum()) == kept


def test_nan_logits_are_refused_by_sampling_not_made_greedy() -> None:
    """A NaN logit passes through the temperature (it made the row greedy at t != 1 and not at
    t = 1), and sampling a row with NaN, or with every token -inf, raises ValueError as
    transformers does (it returned token 0)."""
    row = np.array([[1.0, np.nan, 3.0, 2.0]], np.float32)
    assert np.isnan(lp.temperature(row, 0.7)[0, 1])
    rng = np.random.default_rng(0)
    for t in (1.0, 0.7):
        with pytest.raises(ValueError, match="NaN"):
            lp.choose(lp.temperature(row, t), True, rng)
    with pytest.raises(ValueError, match="-inf"):
        lp.choose(np.full((1, 4), -np.inf, np.float32), True, rng)
    assert int(lp.choose(row, False, rng)[0]) == 1  # greedy takes the first NaN, as torch.argmax


def test_repetition_penalty_ids_beyond_the_vocabulary() -> None:
    x = np.array([[2.0, -2.0, 3.0, -1.0, 4.0]], np.float32)
    out = lp.repetition_penalty(x, np.array([[1, 7]]), 2.0)  # 7 is beyond the 5 logits: skipped
    np.testing.assert_array_equal(out, [[2.0, -4.0, 3.0, -1.0, 4.0]])
    with pytest.raises(ValueError, match="negative"):
        lp.repetition_penalty(x, np.array([[1, -1]]), 2.0)
