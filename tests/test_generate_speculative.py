"""Speculative decoding (draft model, prompt lookup): greedy output token for token the greedy
output; rejected drafts undone on both runners."""

from __future__ import annotations

import numpy as np
import pytest

import _gen_common as gc

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.generation.speculative import PromptLookup, accept_greedy  # noqa: E402

N = 16


@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_draft_is_target_accepts_everything(k: int) -> None:
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=N, draft_session=gc.ours("llama"),
                        num_draft_tokens=k)
    np.testing.assert_array_equal(out.new_tokens[0], want)
    s = out.stats
    assert s.accepted_draft_tokens > 0 and s.accepted_draft_tokens == s.draft_tokens
    assert s.model_runs < N  # fewer target runs than tokens


def test_huge_num_draft_tokens_sizes_the_cache_by_what_can_be_drafted() -> None:
    """At most max_new_tokens - 1 drafts are proposed, so the cache does not grow with
    num_draft_tokens (10**9 asked for gigabytes before, and a budget error)."""
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, 8)
    for k in (4, 10**9):
        out = olkv.generate(gc.ours("llama"), gc.PROMPT, max_new_tokens=8, draft_session=gc.ours("llama"),
                            num_draft_tokens=k)
        np.testing.assert_array_equal(out.new_tokens[0], want)


@pytest.mark.parametrize("target,draft", [("llama", "gpt2"), ("gpt2", "llama"), ("llama-mask", "llama")])
def test_other_draft_model_gives_the_greedy_output(target: str, draft: str) -> None:
    want = gc.ort_greedy(gc.model(target), gc.PROMPT, N)
    out = olkv.generate(gc.ours(target), gc.PROMPT, max_new_tokens=N, draft_session=gc.ours(draft, seed=3),
                        num_draft_tokens=3)
    np.testing.assert_array_equal(out.new_tokens[0], want)
    assert out.stats.draft_tokens > 0 and out.stats.accepted_draft_tokens < out.stats.draft_tokens


def test_prompt_lookup_gives_the_greedy_output_and_accepts_repeats() -> None:
    # the greedy continuation of the base prompt, repeated in the prompt, makes lookups succeed
    cont = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    prompt = np.concatenate([gc.PROMPT, cont, gc.PROMPT])
    want = gc.ort_greedy(gc.model("llama"), prompt, N)
    out = olkv.generate(gc.ours("llama"), prompt, max_new_tokens=N, prompt_lookup=4)
    np.testing.assert_array_equal(out.new_tokens[0], want)
    # seeded weights: with this prompt the lookups propose 6 tokens and the target keeps 1
    assert out.stats.draft_tokens > 0 and out.stats.accepted_draft_tokens > 0


def test_speculative_batch_and_stops() -> None:
    ids, mask = gc.padded(gc.PROMPTS)
    refs = [gc.ort_greedy(gc.model("llama"), p, N) for p in gc.PROMPTS]
    eos = int(refs[0][5])
    out = olkv.generate(gc.ours("llama"), ids, attention_mask=mask, max_new_tokens=N, draft_session=gc.ours("llama"),
                        eos_token_id=eos, pad_token_id=1)
    for r, ref in enumerate(refs):
        stop = int(np.flatnonzero(ref == eos)[0]) + 1 if (ref == eos).any() else N
        np.testing.assert_array_equal(out.new_tokens[r][:stop], ref[:stop], err_msg=f"row {r}")
        assert (out.new_tokens[r][stop:] == 1).all()


def test_speculative_on_onnxruntime_gqa_buffers() -> None:
    """Fixed-capacity past buffers (truncate only moves the valid length)."""
    want = gc.ort_greedy(gc.model("llama"), gc.PROMPT, N)
    out = olkv.generate(gc.ort("llama-gqa-ort"), gc.PROMPT, max_new_tokens=N, draft_session=gc.ours("gpt2"))
    np.testing.assert_array_equal(out.new_tokens[0], want)


def test_prompt_lookup_and_accept_greedy_units() -> None:
    seq = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    drafts, q = PromptLookup(3).propose(seq, 2, np.random.default_rng(0))
    assert drafts == [8, 9] and q is None
    assert PromptLookup(3).propose(np.array([1, 2, 3]), 2, np.random.default_rng(0))[0] == []
    rows = np.eye(4)[[1, 2, 0]]  # argmax 1, 2, 0
    assert accept_greedy(rows, [1, 2]) == (2, 0)
    assert accept_greedy(rows, [1, 3]) == (1, 2)
    assert accept_greedy(rows[:1], []) == (0, 1)


def test_speculative_errors() -> None:
    sess = gc.ours("llama")
    with pytest.raises(ValueError, match="num_beams"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=3, num_beams=2, draft_session=sess)
    with pytest.raises(ValueError, match="either"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=3, draft_session=sess, prompt_lookup=2)


@pytest.mark.parametrize("how", ["draft", "lookup"])
def test_speculative_scores_equal_greedy_scores(how: str) -> None:
    """return_scores with speculative decoding: per token, the target's processed
    log-probabilities at that position, as plain greedy decoding reports them; a padded batch
    merges its rows' steps (a row that stopped earlier reads -inf)."""
    sess = gc.ours("llama")
    kw = dict(draft_session=sess) if how == "draft" else dict(prompt_lookup=3)
    ids, mask = gc.padded(gc.PROMPTS[:2])
    eos = int(gc.ort_greedy(gc.model("llama"), gc.PROMPTS[1], 4)[3])
    want = olkv.generate(sess, ids, attention_mask=mask, max_new_tokens=8, return_scores=True, repetition_penalty=1.3,
                         eos_token_id=eos, pad_token_id=0)
    got = olkv.generate(sess, ids, attention_mask=mask, max_new_tokens=8, return_scores=True, repetition_penalty=1.3,
                        eos_token_id=eos, pad_token_id=0, num_draft_tokens=3, **kw)
    np.testing.assert_array_equal(got.sequences, want.sequences)
    assert got.scores is not None and want.scores is not None and len(got.scores) == len(want.scores)
    for step, (g, w) in enumerate(zip(got.scores, want.scores)):
        assert g.shape == w.shape == (2, gc.CFG.vocab)
        live = np.isfinite(w)
        np.testing.assert_array_equal(np.isfinite(g), live, err_msg=f"step {step}")
        np.testing.assert_allclose(g[live], w[live], atol=2e-4, err_msg=f"step {step}")


def test_speculative_takes_the_state_max_length_greedy_takes() -> None:
    """A verification step never stores more than the prompt and every new token but the last,
    so a state max_length that holds them serves speculative decoding too (it asked for
    num_draft_tokens more)."""
    from onnx_light_kv import models as M

    cfg = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256)
    sess = olkv.InferenceSession(M.model_bytes(M.build("llama", cfg)), threads=1)
    prompt = np.arange(1, 31)
    want = olkv.generate(sess, prompt, max_new_tokens=10).sequences
    for kw in (dict(prompt_lookup=4), dict(draft_session=sess, num_draft_tokens=3)):
        got = olkv.generate(sess, prompt, max_new_tokens=10, state_options={"max_length": 39}, **kw)
        np.testing.assert_array_equal(got.sequences, want)
        with pytest.raises(ValueError, match="cannot hold the 39 positions"):
            olkv.generate(sess, prompt, max_new_tokens=10, state_options={"max_length": 38}, **kw)
