"""Beam search equals a plain reference beam search (transformers' scoring, length penalty and
early-stopping rule) that recomputes every beam from an empty past with onnxruntime."""

from __future__ import annotations

import warnings
from typing import Any, List, Sequence, Tuple

import numpy as np
import pytest

import _gen_common as gc

olkv = pytest.importorskip("onnx_light_kv")


def reference_beam_search(mp: Any, prompt: np.ndarray, num_beams: int, max_new: int, eos: List[int],
                          length_penalty: float, early_stopping: Any, nrs: int,
                          stops: Sequence[Sequence[int]] = ()) -> List[Tuple[float, List[int]]]:
    """Plain loops: every candidate of every beam, sorted; transformers' beam search rules
    (``max(2, 1 + len(eos)) * num_beams`` candidates, the best running beam in the stopping
    bound, the first ``num_beams`` candidates finished at the length limit). A candidate that
    ends with one of ``stops`` (prompt included) finishes like eos."""
    sess = gc.ort("llama")
    beams = [(0.0, [])] + [(-1e9, []) for _ in range(num_beams - 1)]
    finished: List[Tuple[float, List[int]]] = []
    done = False
    vocab = gc.CFG.vocab
    for step in range(max_new):
        cands = []
        for b, (score, toks) in enumerate(beams):
            lp = gc.full_logprobs(sess, mp, list(prompt) + toks)
            cands += [(score + lp[t], b, t) for t in range(vocab)]
        cands.sort(key=lambda c: (-c[0], c[1] * vocab + c[2]))
        top = cands[:max(2, 1 + len(eos)) * num_beams]
        new = []
        if step == max_new - 1:  # the length limit: the first num_beams finish, eos or not
            for score, b, t in top[:num_beams]:
                finished.append((score / (step + 1) ** length_penalty, beams[b][1] + [t]))
            finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
            done = True
            break
        for rank, (score, b, t) in enumerate(top):
            seq = list(prompt) + beams[b][1] + [t]
            if t in eos or any(len(q) <= len(seq) and seq[-len(q):] == list(q) for q in stops):
                if rank < num_beams:
                    finished.append((score / (step + 1) ** length_penalty, beams[b][1] + [t]))
                    finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
                continue
            new.append((score, beams[b][1] + [t]))
            if len(new) == num_beams:
                break
        if len(finished) >= num_beams:
            worst = finished[-1][0]
            if early_stopping is True:
                done = True
            else:
                length = max_new if (early_stopping == "never" and length_penalty > 0) else step + 1
                done = not new or worst >= new[0][0] / length ** length_penalty
        beams = new
        if done:
            break
    if not done:
        for score, toks in beams:
            finished.append((score / len(toks) ** length_penalty, toks))
        finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
    return sorted(finished, key=lambda f: -f[0])[:nrs]


def _eos_candidates() -> List[int]:
    """Tokens that beam search meets early on this prompt, so hypotheses finish mid-way."""
    greedy = gc.ort_greedy(gc.model("llama"), gc.PROMPT, 6)
    return [int(greedy[2]), int(greedy[4])]


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping,nrs,use_eos", [
    (3, 1.0, False, 1, False),
    (3, 1.0, False, 3, True),
    (4, 0.5, True, 2, True),
    (2, 2.0, "never", 2, True),
    (3, -1.0, False, 2, True),
])
def test_beam_search_equals_reference(num_beams: int, length_penalty: float, early_stopping: Any, nrs: int,
                                      use_eos: bool) -> None:
    max_new = 6
    eos = _eos_candidates() if use_eos else []
    want = reference_beam_search(gc.model("llama"), gc.PROMPT, num_beams, max_new, eos, length_penalty,
                                 early_stopping, nrs)
    for sess in (gc.ours("llama"), gc.ort("llama")):
        out = olkv.generate(sess, gc.PROMPT, max_new_tokens=max_new, num_beams=num_beams, length_penalty=length_penalty,
                            early_stopping=early_stopping, num_return_sequences=nrs, eos_token_id=eos or None,
                            pad_token_id=0)
        assert out.sequences.shape[0] == nrs
        for r, (score, toks) in enumerate(want):
            row = out.new_tokens[r]
            np.testing.assert_array_equal(row[:len(toks)], toks, err_msg=f"sequence {r}")
            assert (row[len(toks):] == 0).all()
            assert out.sequences_scores[r] == pytest.approx(score, abs=2e-4)
        np.testing.assert_array_equal(out.sequences[:, :gc.PROMPT.size], np.tile(gc.PROMPT, (nrs, 1)))


def test_beam_search_stop_sequences_equal_reference() -> None:
    """A continuation completing a stop sequence is a finished hypothesis, like eos; one stop
    sequence starts in the prompt."""
    greedy = gc.ort_greedy(gc.model("llama"), gc.PROMPT, 6)
    stops = [[int(greedy[1]), int(greedy[2])], [int(gc.PROMPT[-1]), int(greedy[0])]]
    want = reference_beam_search(gc.model("llama"), gc.PROMPT, 3, 6, [], 1.0, False, 3, stops)
    assert any(len(toks) < 6 for _, toks in want), "the stop sequences must end some hypotheses early"
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=6, num_beams=3, num_return_sequences=3,
                        stop_sequences=stops, pad_token_id=0)
    for r, (score, toks) in enumerate(want):
        row = out.new_tokens[r]
        np.testing.assert_array_equal(row[:len(toks)], toks, err_msg=f"sequence {r}")
        assert (row[len(toks):] == 0).all()
        assert out.sequences_scores[r] == pytest.approx(score, abs=2e-4)


def test_beam_sampling_seeded_and_limits() -> None:
    """Beam sampling: a seed fixes the output, seeds differ; top_k=1 leaves one candidate per
    step (the greedy continuation); a temperature near 0 ranks candidates as beam search does."""
    sess = gc.ours("llama")
    kw = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, do_sample=True)
    a = olkv.generate(sess, gc.PROMPT, seed=7, **kw)
    b = olkv.generate(sess, gc.PROMPT, seed=7, **kw)
    np.testing.assert_array_equal(a.sequences, b.sequences)
    np.testing.assert_array_equal(a.sequences_scores, b.sequences_scores)
    # (this model is confident: a high temperature spreads the candidates)
    outs = {olkv.generate(sess, gc.PROMPT, seed=s, temperature=8.0, **kw).new_tokens[0].tobytes() for s in range(8)}
    assert len(outs) > 1, "different seeds should sample different beams"
    greedy = gc.ort_greedy(gc.model("llama"), gc.PROMPT, 6)
    one = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, num_beams=3, do_sample=True, top_k=1, seed=1)
    np.testing.assert_array_equal(one.new_tokens[0], greedy[:6])
    beams = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, num_beams=3, num_return_sequences=3)
    for t in (1e-5, 1e-38):  # (1e-38: summed scores beyond float32's range used to give NaN probabilities)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            cold = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, num_beams=3, num_return_sequences=3,
                                 do_sample=True, temperature=t, seed=3)
        np.testing.assert_array_equal(cold.new_tokens, beams.new_tokens)
        # the scores are those of the warped (temperature-divided) log-probabilities, as in transformers
        np.testing.assert_allclose(cold.sequences_scores * t, beams.sequences_scores, rtol=1e-3)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("warp", [dict(temperature=1e-300)])
def test_beam_sampling_returns_only_real_hypotheses(warp: dict) -> None:
    """A temperature whose probabilities underflow leaves one candidate with non-zero
    probability per beam, so one hypothesis (the greedy continuation, scored by its warped
    log-probabilities): it comes back alone, and asking for more raises ValueError instead of
    returning the empty beams as copies of it (scored about -1e9 / len)."""
    sess = gc.ours("llama")
    kw = dict(max_new_tokens=6, num_beams=3, do_sample=True, seed=0, **warp)
    with pytest.raises(ValueError, match="found 1 hypothesis for row 0, fewer than num_return_sequences=3"):
        olkv.generate(sess, gc.PROMPT, num_return_sequences=3, **kw)
    with pytest.raises(ValueError, match="found 1 hypothesis"):
        olkv.generate(sess, gc.PROMPT, num_return_sequences=2, **kw)
    one = olkv.generate(sess, gc.PROMPT, **kw)
    greedy = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, return_scores=True)
    np.testing.assert_array_equal(one.new_tokens, greedy.new_tokens)
    mean = np.mean([s[0, t] for s, t in zip(greedy.scores, greedy.new_tokens[0])])
    want = 0.0 if "temperature" in warp else mean  # (the t -> 0 limit's log-probabilities are 0)
    assert one.sequences_scores[0] == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("warp", [dict(top_k=1), dict(top_k=0, top_p=0.01), dict(top_k=0, min_p=0.99)])
def test_beam_sampling_filters_keep_two_tokens_as_transformers(warp: dict) -> None:
    """In beam sampling the filters keep at least max(2, eos ids + 1) tokens per beam
    (transformers' min_tokens_to_keep), so beams branch even at top_k=1. Outputs recorded from
    transformers 5.25 on the llama-optimum fixture's torch twin (the same for seeds 0-2; before,
    the beams could not branch: one hypothesis, or ValueError for two)."""
    import _fixtures as fx

    sess = olkv.InferenceSession(fx.model_path("llama-optimum"), threads=1)
    kw = dict(do_sample=True, num_beams=2, max_new_tokens=3, eos_token_id=[26], pad_token_id=251, **warp)
    for seed in range(3):
        out = olkv.generate(sess, np.array([[13, 52]]), length_penalty=2.0, seed=seed, **kw)
        assert out.sequences.tolist() == [[13, 52, 163, 197, 26]]
        assert out.sequences_scores[0] == pytest.approx(-1.0390, abs=2e-4)
    two = olkv.generate(sess, np.array([[13, 52]]), num_return_sequences=2, seed=0, **kw)
    assert two.sequences.tolist() == [[13, 52, 26, 251, 251], [13, 52, 163, 197, 26]]
    np.testing.assert_allclose(two.sequences_scores, [-3.0144, -3.1169], atol=2e-4)


def test_beam_sampling_with_few_candidates_branches_into_real_hypotheses() -> None:
    """top_k=2 fills 2 of 3 beams at the first step and all 3 after: three distinct hypotheses
    with real scores, best first."""
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=6, num_beams=3, num_return_sequences=3,
                        do_sample=True, top_k=2, seed=0)
    assert len({row.tobytes() for row in out.new_tokens}) == 3
    scores = out.sequences_scores
    assert (scores > -20).all() and (np.diff(scores) <= 0).all()


def test_beam_search_batch_rows_are_independent() -> None:
    ids, mask = gc.padded(gc.PROMPTS[:2])
    both = olkv.generate(gc.ours("llama-mask"), ids, attention_mask=mask, max_new_tokens=5, num_beams=3,
                         num_return_sequences=2, return_scores=True)
    assert both.sequences.shape == (4, ids.shape[1] + 5)
    assert len(both.scores) == 5 and both.scores[0].shape == (6, gc.CFG.vocab)
    for r, p in enumerate(gc.PROMPTS[:2]):
        one = olkv.generate(gc.ours("llama"), p, max_new_tokens=5, num_beams=3, num_return_sequences=2)
        np.testing.assert_array_equal(both.new_tokens[2 * r:2 * r + 2], one.new_tokens)
        np.testing.assert_allclose(both.sequences_scores[2 * r:2 * r + 2], one.sequences_scores, atol=1e-4)


def test_beam_search_one_beam_is_greedy_and_errors() -> None:
    sess = gc.ours("llama")
    with pytest.raises(ValueError, match="num_return_sequences"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=3, num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="streamer"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=3, num_beams=2, streamer=lambda t, s: None)
    with pytest.raises(ValueError, match="early_stopping"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=3, num_beams=2, early_stopping="sometimes")
    with pytest.raises(TypeError, match="early_stopping must be True, False or 'never', got int 1"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=3, num_beams=2, early_stopping=1)
    for lp in (300.0, -300.0, 1e308):  # 20 ** 300 overflowed (OverflowError), 20 ** -300 divided by zero
        with pytest.raises(ValueError, match=r"length_penalty must lie within \+-233.7 for max_new_tokens=20"):
            olkv.generate(sess, gc.PROMPT, max_new_tokens=20, num_beams=2, length_penalty=lp)


def test_beam_search_numpy_bool_early_stopping_is_the_bool() -> None:
    """``early_stopping=np.True_`` stops as ``True`` does (it passed the check, then acted as False)."""
    sess, eos = gc.ours("llama"), _eos_candidates()
    outs = [olkv.generate(sess, gc.PROMPT, max_new_tokens=12, num_beams=4, eos_token_id=eos, length_penalty=2.0,
                          early_stopping=v) for v in (True, np.True_, False, np.False_)]
    assert outs[0].sequences.shape != outs[2].sequences.shape  # the case tells True from False
    for a, b in ((outs[0], outs[1]), (outs[2], outs[3])):
        np.testing.assert_array_equal(a.sequences, b.sequences)
        np.testing.assert_array_equal(a.sequences_scores, b.sequences_scores)


# Recorded from transformers 5.25.0 (the same beam rules as 4.57.6, the version the fixtures
# were exported with) on the torch twin of the llama-optimum fixture (scripts/make_fixtures.py
# build_model("llama")): generate(do_sample=False, pad_token_id=251, return_dict_in_generate=True,
# output_scores=True, **kw); generated tokens (pads dropped) and sequences_scores. They exercise
# the three rules where a plain reading of BeamHypotheses differs: the stopping bound uses the
# best running beam (A), max(2, 1 + n_eos) * num_beams candidates (B), and the first num_beams
# candidates finishing at the length limit (C).
_HF_BEAM_CASES = [
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=5, num_beams=2, num_return_sequences=2, eos_token_id=[23, 166, 149]),
     [[23], [166]], [-3.3598, -3.8245]),
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=5, num_beams=2, num_return_sequences=2,
                                   eos_token_id=[23, 166, 149, 68], early_stopping="never"),
     [[226, 112, 27, 155, 160], [226, 112, 27, 155, 244]], [-3.3059, -3.3515]),
    ([108, 35, 195, 236], dict(max_new_tokens=2, num_beams=4, num_return_sequences=4, eos_token_id=[223, 29],
                               early_stopping=True, length_penalty=2.0),
     [[202, 223], [219, 189], [13, 223], [219, 192]], [-1.6687, -1.7396, -1.7541, -1.777]),
]


@pytest.mark.parametrize("case", range(len(_HF_BEAM_CASES)))
def test_beam_search_equals_transformers_recorded(case: int) -> None:
    import _fixtures as fx

    prompt, kw, want_tokens, want_scores = _HF_BEAM_CASES[case]
    sess = olkv.InferenceSession(fx.model_path("llama-optimum"), threads=1)
    out = olkv.generate(sess, np.array(prompt), pad_token_id=251, **kw)
    got = [[int(t) for t in row if t != 251] for row in out.new_tokens]
    assert got == want_tokens
    np.testing.assert_allclose(out.sequences_scores, want_scores, atol=2e-4)
