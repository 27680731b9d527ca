"""``no_repeat_ngram_size``, ``min_new_tokens`` and ``max_length``: the logits processors against a
plain reading of transformers' rules, and generation with them (greedy, sampling, beams,
speculative decoding, the Generator) against a reference loop that applies the same rules by
hand to an onnxruntime session."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv.generation import logits_process as lp
from onnx_light_kv.generation.options import SamplingOptions

import _gen_common as gc


def _banned_plain(seq: Sequence[int], n: int) -> List[int]:
    """transformers' _get_ngrams / _get_generated_ngrams, written as plain loops."""
    seq = list(seq)
    if len(seq) + 1 < n:
        return []
    grams: Dict[Tuple[int, ...], List[int]] = {}
    for i in range(len(seq) - n + 1):
        g = tuple(seq[i:i + n])
        grams.setdefault(g[:-1], []).append(g[-1])
    return grams.get(tuple(seq[len(seq) + 1 - n:]), [])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram_equals_plain_rule(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(200):
        length = int(rng.integers(0, 12))
        seqs = rng.integers(0, 5, size=(3, length))
        logits = rng.standard_normal((3, 7)).astype(np.float32)
        out = lp.no_repeat_ngram(logits, seqs, n)
        for r in range(3):
            want = logits[r].copy()
            want[_banned_plain(seqs[r], n)] = -np.inf
            np.testing.assert_array_equal(out[r], want)
    same = np.zeros((1, 4), np.float32)
    assert lp.no_repeat_ngram(same, np.zeros((1, 0), np.int64), 2) is same  # nothing to ban: no copy


def test_no_repeat_ngram_leaves_padding_and_foreign_ids_out() -> None:
    logits = np.zeros((2, 6), np.float32)
    seqs = np.array([[0, 0, 0, 3, 4, 3], [9, 9, 2, 9, 2, 9]])
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = lp.no_repeat_ngram(logits, seqs, 2, mask)
    # row 0 is [0, 3, 4, 3]: 3 was followed by 4; the padding's (0, 0) pairs do not count
    assert np.isneginf(out[0]).tolist() == [False, False, False, False, True, False]
    # row 1: 9 was followed by 9 (beyond the 6 logits: skipped) and by 2
    assert np.isneginf(out[1]).tolist() == [False, False, True, False, False, False]


def test_ban_eos_and_process_min_length() -> None:
    logits = np.arange(12, dtype=np.float32).reshape(2, 6)
    opts = SamplingOptions(min_new_tokens=2)
    seqs = np.zeros((2, 3), np.int64)
    out = lp.process(logits, opts, seqs, eos=(5, 1, 99), min_length=4)
    assert np.isneginf(out[:, [1, 5]]).all() and np.isfinite(np.delete(out, [1, 5], axis=1)).all()
    np.testing.assert_array_equal(lp.process(logits, opts, seqs, eos=(5,), min_length=3), logits)
    assert lp.ban_eos(logits, ()) is logits


@pytest.mark.parametrize("bad", [dict(no_repeat_ngram_size=-1), dict(min_new_tokens=-2),
                                 dict(no_repeat_ngram_size=1.5), dict(min_new_tokens="3")])
def test_option_errors(bad: dict) -> None:
    err = TypeError if any(isinstance(v, (float, str)) for v in bad.values()) else ValueError
    with pytest.raises(err):
        olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=2, **bad)


def _reference(prompt: np.ndarray, steps: int, n: int = 0, min_new: int = 0, eos: Sequence[int] = ()) -> List[int]:
    """Greedy decoding by hand on the onnxruntime twin, full recompute each step, applying the
    plain n-gram and min-new-tokens rules."""
    sess = gc.ort("llama")
    names = [i.name for i in sess.get_inputs()]
    seq = list(prompt)
    new: List[int] = []
    for _ in range(steps):
        ids = np.array([seq], np.int64)
        feeds = {"input_ids": ids}
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(len(seq), dtype=np.int64)[None, :]
        for i in sess.get_inputs():
            if i.name.startswith("past"):
                shape = [1 if d == "batch" else (0 if isinstance(d, str) else d) for d in i.shape]
                feeds[i.name] = np.zeros(shape, np.float32)
        logits = sess.run(None, feeds)[0][0, -1].astype(np.float64)
        if n:
            logits[_banned_plain(seq, n)] = -np.inf
        if len(new) < min_new:
            logits[list(eos)] = -np.inf
        tok = int(np.argmax(logits))
        seq.append(tok)
        new.append(tok)
        if tok in eos:
            break
    return new


def test_greedy_no_repeat_ngram_equals_reference() -> None:
    plain = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=24).new_tokens[0].tolist()
    assert len(set(zip(plain, plain[1:]))) < len(plain) - 1  # the case repeats bigrams without the rule
    for n in (1, 2, 3):
        got = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=24, no_repeat_ngram_size=n)
        row = got.new_tokens[0].tolist()
        assert row == _reference(gc.PROMPT, 24, n=n)
        full = gc.PROMPT.tolist() + row
        grams = [tuple(full[i:i + n]) for i in range(len(full) - n + 1)]
        assert len(grams) == len(set(grams))


def test_min_new_tokens_holds_back_eos() -> None:
    plain = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=12).new_tokens[0].tolist()
    eos = plain[1]  # the second token: without the rule generation stops there
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=12, eos_token_id=eos)
    assert out.new_tokens[0].tolist()[:2] == [plain[0], eos] and out.new_tokens.shape[1] == 2
    for min_new in (1, 2, 5, 12):
        got = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=12, eos_token_id=eos,
                            min_new_tokens=min_new, pad_token_id=0)
        row = [int(t) for t in got.new_tokens[0]]
        want = _reference(gc.PROMPT, 12, min_new=min_new, eos=[eos])
        assert row[:len(want)] == want
        assert eos not in row[:min_new]


def test_constraints_in_beams_sampling_speculative_and_generator() -> None:
    sess = gc.ours("llama")
    kw = dict(max_new_tokens=16, no_repeat_ngram_size=2)
    greedy = olkv.generate(sess, gc.PROMPT, **kw).new_tokens[0].tolist()
    # speculative decoding gives the greedy tokens under the same processors
    assert olkv.generate(sess, gc.PROMPT, prompt_lookup=3, **kw).new_tokens[0].tolist() == greedy
    assert olkv.generate(sess, gc.PROMPT, draft_session=gc.ours("llama", seed=1), **kw).new_tokens[0].tolist() == greedy
    g = olkv.Generator(sess, max_length=gc.PROMPT.size + 16, no_repeat_ngram_size=2)
    g.append_tokens(gc.PROMPT)
    while not g.is_done():
        g.generate_next_token()
    assert g.get_sequence(0)[gc.PROMPT.size:].tolist() == greedy
    for out in (olkv.generate(sess, gc.PROMPT, num_beams=3, num_return_sequences=3, **kw),
                olkv.generate(sess, gc.PROMPT, do_sample=True, num_return_sequences=4, seed=0, top_k=0, **kw)):
        for row in out.sequences.tolist():
            grams = list(zip(row, row[1:]))
            assert len(grams) == len(set(grams))
    eos = greedy[0]
    for extra in (dict(num_beams=2), dict(do_sample=True, seed=3), dict(prompt_lookup=2)):
        out = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, eos_token_id=eos, min_new_tokens=4, **extra)
        assert eos not in out.new_tokens[0].tolist()[:4]
    g = olkv.Generator(sess, max_length=gc.PROMPT.size + 6, eos_token_id=eos, min_length=gc.PROMPT.size + 3)
    g.append_tokens(gc.PROMPT)
    for _ in range(3):
        g.generate_next_token()
    assert eos not in g.get_sequence(0)[gc.PROMPT.size:].tolist()


def test_min_length_counts_the_prompt() -> None:
    sess = gc.ours("llama")
    plain = olkv.generate(sess, gc.PROMPT, max_new_tokens=8).new_tokens[0].tolist()
    eos = plain[1]
    for min_length, min_new in ((gc.PROMPT.size + 4, 0), (gc.PROMPT.size + 2, 4), (3, 0)):
        got = olkv.generate(sess, gc.PROMPT, max_new_tokens=8, eos_token_id=eos, min_length=min_length,
                            min_new_tokens=min_new, pad_token_id=0)
        want = olkv.generate(sess, gc.PROMPT, max_new_tokens=8, eos_token_id=eos, pad_token_id=0,
                             min_new_tokens=max(min_new, min_length - gc.PROMPT.size))
        np.testing.assert_array_equal(got.sequences, want.sequences)
    with pytest.raises(ValueError):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=2, min_length=-1)


def test_max_length_stands_for_max_new_tokens() -> None:
    sess = gc.ours("llama")
    want = olkv.generate(sess, gc.PROMPT, max_new_tokens=5)
    got = olkv.generate(sess, gc.PROMPT, max_length=gc.PROMPT.size + 5)
    np.testing.assert_array_equal(got.sequences, want.sequences)
    # both: max_new_tokens wins (transformers' rule)
    both = olkv.generate(sess, gc.PROMPT, max_new_tokens=5, max_length=gc.PROMPT.size + 2)
    np.testing.assert_array_equal(both.sequences, want.sequences)
    ids, mask = gc.padded(gc.PROMPTS)
    padded = olkv.generate(gc.ours("llama-mask"), ids, attention_mask=mask, max_length=ids.shape[1] + 3)
    assert padded.sequences.shape == (len(gc.PROMPTS), ids.shape[1] + 3)
    with pytest.raises(ValueError, match="max_new_tokens .* or max_length"):
        olkv.generate(sess, gc.PROMPT)
    with pytest.raises(ValueError, match="leaves no room"):
        olkv.generate(sess, gc.PROMPT, max_length=gc.PROMPT.size)
    with pytest.raises(ValueError):
        olkv.generate(sess, gc.PROMPT, max_length=0)
    with pytest.raises(TypeError):
        olkv.generate(sess, gc.PROMPT, max_length=7.0)


# Recorded from transformers 5.25.0 on the torch twin of the llama-optimum fixture
# (scripts/make_fixtures.py build_model("llama")): generate(do_sample=False, pad_token_id=251,
# return_dict_in_generate=True, output_scores=True, **kw); new tokens and sequences_scores. The eos
# id 11 of the min_new_tokens cases is plain greedy's second new token.
_HF_CASES = [
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=12, no_repeat_ngram_size=1),
     [[23, 75, 223, 27, 67, 196, 170, 15, 189, 39, 59, 210]], None),
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=10, num_beams=3, num_return_sequences=2, no_repeat_ngram_size=3),
     [[23, 99, 112, 27, 80, 33, 194, 177, 194, 177], [23, 99, 112, 27, 10, 80, 33, 194, 177, 194]], [-3.2532, -3.256]),
    ([108, 35, 195, 236], dict(max_new_tokens=8, min_new_tokens=5, eos_token_id=11),
     [[223, 205, 219, 189, 196, 223, 205, 177]], None),
    ([108, 35, 195, 236], dict(max_new_tokens=6, num_beams=2, min_new_tokens=4, eos_token_id=11),
     [[223, 205, 97, 167, 196, 223]], [-3.003]),
    ([108, 35, 195, 236], dict(max_length=9), [[223, 11, 196, 223, 223]], None),
]


@pytest.mark.parametrize("case", range(len(_HF_CASES)))
def test_equals_transformers_recorded(case: int) -> None:
    import _fixtures as fx

    prompt, kw, want, want_scores = _HF_CASES[case]
    sess = olkv.InferenceSession(fx.model_path("llama-optimum"), threads=1)
    out = olkv.generate(sess, np.array(prompt), pad_token_id=251, **kw)
    assert out.new_tokens.tolist() == want
    if want_scores is not None:
        np.testing.assert_allclose(out.sequences_scores, want_scores, atol=2e-4)


def test_pad_token_id_marks_padding_without_a_mask_as_transformers() -> None:
    """Without attention_mask, a pad_token_id that is no eos id marks the padding (transformers'
    rule); recorded from transformers 5.25 on the llama-optimum fixture's torch twin."""
    import _fixtures as fx

    sess = olkv.InferenceSession(fx.model_path("llama-optimum"), threads=1)
    ids = np.array([[251, 251, 5, 6, 7], [8, 9, 10, 11, 12]])
    out = olkv.generate(sess, ids, max_new_tokens=5, pad_token_id=251)
    assert out.sequences.tolist() == [[251, 251, 5, 6, 7, 67, 146, 49, 170, 67],
                                      [8, 9, 10, 11, 12, 41, 190, 150, 249, 163]]
    # an eos pad id marks nothing (the rows are read as given), as there
    as_given = olkv.generate(sess, ids, max_new_tokens=2, pad_token_id=251, eos_token_id=251)
    masked = olkv.generate(sess, ids, attention_mask=np.ones_like(ids), max_new_tokens=2, pad_token_id=251,
                           eos_token_id=251)
    np.testing.assert_array_equal(as_given.sequences, masked.sequences)
    with pytest.raises(ValueError, match="pad_token_id=6 elsewhere than as left padding"):
        olkv.generate(sess, ids, max_new_tokens=2, pad_token_id=6)
    with pytest.raises(ValueError, match="holds only pad_token_id=251"):
        olkv.generate(sess, np.array([[251, 251], [4, 5]]), max_new_tokens=2, pad_token_id=251)


def test_max_new_tokens_beyond_int64_names_itself() -> None:
    with pytest.raises(ValueError, match="max_new_tokens=9223372036854775807 after a prompt of 7 positions"):
        olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=2 ** 63 - 1)


# --- sequence bias, bad words, suppressed tokens and the typical / epsilon / eta warpers ---

def _recorded_warpers() -> dict:
    """transformers' outputs on fixed logits (scripts/record_warpers.py)."""
    import json
    import os

    with open(os.path.join(os.path.dirname(__file__), "fixtures", "transformers-warpers.json")) as f:
        return json.load(f)


def _matrix(rows: list) -> np.ndarray:
    return np.array([[-np.inf if v is None else v for v in row] for row in rows], dtype=np.float32)


def test_warpers_equal_transformers_recorded() -> None:
    doc = _recorded_warpers()
    matrices = [_matrix(m) for m in doc["matrices"]]
    warpers = {"typical_p": lp.typical_p, "epsilon_cutoff": lp.epsilon_cutoff, "eta_cutoff": lp.eta_cutoff}
    assert len(doc["warped"]) == 72
    for case in doc["warped"]:
        got = np.isneginf(warpers[case["warper"]](matrices[case["matrix"]], case["value"], case["keep"]))
        want = np.array([[c == "1" for c in row] for row in case["dropped"]])
        assert (got == want).all(), case["warper"] + f" {case['value']} keep={case['keep']} matrix {case['matrix']}"
        assert (~got).sum(axis=1).min() >= case["keep"]


def test_sequence_bias_and_bad_words_equal_transformers_recorded() -> None:
    doc = _recorded_warpers()
    x = _matrix(doc["matrices"][0])
    seqs = np.array(doc["sequences"])
    biases = [(tuple(ids), b) for ids, b in doc["sequence_bias"]]
    np.testing.assert_array_equal(lp.sequence_bias(x, seqs, biases), _matrix(doc["sequence_bias_out"]))
    words = [tuple(w) for w in doc["bad_words"]]
    np.testing.assert_array_equal(lp.bad_words(x, seqs, words, eos=doc["bad_words_eos"]), _matrix(doc["bad_words_out"]))


def test_sequence_bias_equals_plain_rule() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        width = int(rng.integers(0, 6))
        seqs = rng.integers(0, 4, size=(3, width))
        mask = np.ones_like(seqs)
        pad = int(rng.integers(0, width + 1)) if width else 0
        mask[0, :pad] = 0
        biases = {}
        for _ in range(int(rng.integers(1, 5))):
            ids = tuple(int(i) for i in rng.integers(0, 4, size=int(rng.integers(1, 4))))
            biases[ids] = float(rng.choice([-np.inf, -1.5, 0.25, 2.0]))
        logits = rng.standard_normal((3, 5)).astype(np.float32)
        out = lp.sequence_bias(logits, seqs, list(biases.items()), mask)
        for r in range(3):
            row = [int(t) for t, m in zip(seqs[r], mask[r]) if m]
            want = np.zeros(5, np.float32)
            for ids, b in biases.items():
                if len(ids) == 1 or (len(ids) - 1 <= len(row) and tuple(row[len(row) - len(ids) + 1:]) == ids[:-1]):
                    want[ids[-1]] += np.float32(b)
            np.testing.assert_array_equal(out[r], logits[r] + want)
    same = np.zeros((1, 4), np.float32)
    assert lp.sequence_bias(same, np.zeros((1, 2), np.int64), [((1, 2, 3), 1.0), ((9,), 1.0)]) is same


def test_suppress_and_process_order() -> None:
    logits = np.arange(12, dtype=np.float32).reshape(2, 6)
    seqs = np.array([[0, 1, 2], [3, 4, 5]])
    opts = SamplingOptions(suppress_tokens=[5, 99], begin_suppress_tokens=[0], bad_words_ids=[[1], [4, 5, 2]],
                           sequence_bias={(2,): 100.0})
    out = lp.process(logits, opts, seqs, begin=3)
    # row 1 ends with 4, 5: the bad word (4, 5, 2) bans 2 there, whatever its bias
    assert np.isneginf(out).tolist() == [[True, True, False, False, False, True], [True, True, True, False, False, True]]
    assert out[0, 2] == 102.0
    later = lp.process(logits, opts, seqs, begin=2)  # not the first new token: 0 stays
    assert np.isfinite(later[:, 0]).all()
    # the warpers run only when sampling, after min-p; each keeps `keep` tokens
    warp = SamplingOptions(do_sample=True, typical_p=0.01, epsilon_cutoff=0.9, eta_cutoff=0.9)
    assert np.isfinite(lp.process(logits, warp, seqs, sampling=False)).all()
    assert (np.isfinite(lp.process(logits, warp, seqs)).sum(axis=1) == 1).all()
    assert (np.isfinite(lp.process(logits, warp, seqs, keep=3)).sum(axis=1) >= 3).all()


@pytest.mark.parametrize("bad, err", [
    (dict(typical_p=0.0), ValueError), (dict(typical_p=1.5), ValueError), (dict(typical_p="0.5"), TypeError),
    (dict(epsilon_cutoff=1.0), ValueError), (dict(eta_cutoff=-0.1), ValueError), (dict(eta_cutoff=float("nan")), ValueError),
    (dict(bad_words_ids=[[]]), ValueError), (dict(bad_words_ids=[[-1]]), ValueError), (dict(bad_words_ids="ab"), TypeError),
    (dict(bad_words_ids=[[1.5]]), TypeError), (dict(bad_words_ids=[[300]]), ValueError),
    (dict(sequence_bias={(): 1.0}), ValueError), (dict(sequence_bias={(3,): float("nan")}), ValueError),
    (dict(sequence_bias={(3,): "x"}), TypeError), (dict(sequence_bias=[[[3], 1.0, 2]]), ValueError),
    (dict(sequence_bias=[[[3], 1.0], [(3,), 2.0]]), ValueError), (dict(sequence_bias={(3, 256): 1.0}), ValueError),
    (dict(suppress_tokens=[256]), ValueError), (dict(begin_suppress_tokens=[-2]), ValueError),
    (dict(suppress_tokens=2.5), TypeError),
    (dict(forced_eos_token_id=256), ValueError), (dict(forced_eos_token_id=[-1]), ValueError),
    (dict(exponential_decay_length_penalty=(1, 0.0)), ValueError),
    (dict(exponential_decay_length_penalty=(-1, 1.5)), ValueError),
    (dict(exponential_decay_length_penalty=1.5), TypeError),
    (dict(exponential_decay_length_penalty=(1.5, 1.5)), TypeError),
    (dict(exponential_decay_length_penalty={1: 1.5, 2: 1.5}), TypeError),  # no order (was a KeyError)
    (dict(exponential_decay_length_penalty={1, 2}), TypeError),
    (dict(forced_eos_token_id=[11, 12], suppress_tokens=[12, 11, 3]), ValueError),  # nothing left at the end
])
def test_constraint_option_errors(bad: dict, err: type) -> None:
    with pytest.raises(err):
        olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=2, **bad)


# Recorded from transformers 5.25.0 as _HF_CASES above (greedy or beam search; new tokens and
# sequences_scores).
_HF_CONSTRAINT_CASES = [
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=12, bad_words_ids=[[99], [189, 189], [223, 205]]),
     [[23, 75, 223, 27, 67, 196, 170, 15, 15, 15, 189, 149]], None),
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=12, sequence_bias={(23,): -1.0, (75,): 0.4, (196, 223): -4.0,
                                                                     (189, 189, 231): -2.5}),
     [[166, 227, 149, 140, 170, 194, 117, 223, 149, 65, 29, 156]], None),
    ([108, 35, 195, 236], dict(max_new_tokens=8, suppress_tokens=[11, 75], begin_suppress_tokens=[223]),
     [[29, 223, 67, 223, 205, 219, 212, 223]], None),
    ([108, 35, 195, 236], dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, bad_words_ids=[[223, 223], [67]]),
     [[223, 11, 196, 196, 223, 77, 196, 223], [223, 11, 196, 196, 223, 77, 196, 196]], [-2.787, -2.8548]),
    ([108, 35, 195, 236], dict(max_new_tokens=6, eos_token_id=11, bad_words_ids=[[11], [196]]), [[223, 11]], None),
    ([108, 35, 195, 236], dict(max_new_tokens=6, num_beams=2, sequence_bias=[[[223], -0.5], [[11, 196], 1.25]],
                               begin_suppress_tokens=[223]),
     [[219, 189, 196, 196, 223, 205]], [-3.1225]),
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=7, forced_eos_token_id=11), [[23, 99, 75, 189, 189, 231, 11]], None),
    ([5, 17, 42, 99, 7, 130], dict(max_new_tokens=7, forced_eos_token_id=[12], num_beams=3),
     [[23, 99, 112, 27, 80, 33, 12]], [-2.8377]),
    # plain greedy stops at eos 67 after 8 tokens, at eos 75 after 6
    ([108, 35, 195, 236], dict(max_new_tokens=10, eos_token_id=67, exponential_decay_length_penalty=(2, 1.6)),
     [[223, 11, 196, 223, 67]], None),
    ([108, 35, 195, 236], dict(max_new_tokens=10, eos_token_id=75, exponential_decay_length_penalty=(0, 2.0)),
     [[223, 75]], None),
    ([108, 35, 195, 236], dict(max_new_tokens=10, num_beams=2, eos_token_id=196, exponential_decay_length_penalty=(1, 1.3)),
     [[223, 11, 149, 196]], [-2.5439]),
]


@pytest.mark.parametrize("state_options", [None, False], ids=["cache", "tensor"])
@pytest.mark.parametrize("case", range(len(_HF_CONSTRAINT_CASES)))
def test_constraints_equal_transformers_recorded(case: int, state_options: object) -> None:
    import _fixtures as fx

    prompt, kw, want, want_scores = _HF_CONSTRAINT_CASES[case]
    sess = olkv.InferenceSession(fx.model_path("llama-optimum"), threads=1)
    out = olkv.generate(sess, np.array(prompt), pad_token_id=251, state_options=state_options, **kw)
    assert out.new_tokens.tolist() == want
    if want_scores is not None:
        np.testing.assert_allclose(out.sequences_scores, want_scores, atol=2e-4)


def test_constraints_in_sampling_and_speculative_decoding() -> None:
    """Sampling and speculative decoding read the same processed logits: banned tokens never
    appear, the first new token avoids begin_suppress_tokens, and speculative greedy output
    equals plain greedy output under the constraints."""
    sess = gc.ours("llama")
    kw = dict(bad_words_ids=[[23], [99, 75]], suppress_tokens=[189], begin_suppress_tokens=[166],
              sequence_bias={(223,): -3.0})
    sampled = olkv.generate(sess, gc.PROMPT, max_new_tokens=24, do_sample=True, seed=5, typical_p=0.9,
                            epsilon_cutoff=0.001, eta_cutoff=0.001, num_return_sequences=4, **kw)
    for row in sampled.new_tokens.tolist():
        assert 23 not in row and 189 not in row and row[0] != 166
        assert all((a, b) != (99, 75) for a, b in zip(row, row[1:]))
    plain = olkv.generate(sess, gc.PROMPT, max_new_tokens=16, **kw)
    spec = olkv.generate(sess, gc.PROMPT, max_new_tokens=16, prompt_lookup=3, **kw)
    np.testing.assert_array_equal(spec.sequences, plain.sequences)
    draft = olkv.generate(sess, gc.PROMPT, max_new_tokens=16, draft_session=gc.ours("llama", seed=1), **kw)
    np.testing.assert_array_equal(draft.sequences, plain.sequences)


def test_forced_eos_and_length_decay_in_speculative_decoding() -> None:
    sess = gc.ours("llama")
    for kw in (dict(forced_eos_token_id=11), dict(eos_token_id=[67, 75], exponential_decay_length_penalty=(2, 1.5))):
        plain = olkv.generate(sess, gc.PROMPT, max_new_tokens=9, **kw)
        if "forced_eos_token_id" in kw:
            assert plain.new_tokens[0, -1] == 11
        spec = olkv.generate(sess, gc.PROMPT, max_new_tokens=9, prompt_lookup=2, **kw)
        np.testing.assert_array_equal(spec.sequences, plain.sequences)
