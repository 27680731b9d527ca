"""Generator: onnxruntime-genai's verbs; step-by-step equals generate(); rewind and multi-turn."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import _gen_common as gc

olkv = pytest.importorskip("onnx_light_kv")

N = 10


def test_step_by_step_equals_generate_and_onnxruntime() -> None:
    g = olkv.Generator(gc.ours("llama"), max_length=gc.PROMPT.size + N)
    g.append_tokens(gc.PROMPT)
    got = []
    while not g.is_done():
        g.generate_next_token()
        got.append(int(g.get_next_tokens()[0]))
    assert len(got) == N and g.length == gc.PROMPT.size + N
    np.testing.assert_array_equal(got, gc.ort_greedy(gc.model("llama"), gc.PROMPT, N))
    np.testing.assert_array_equal(g.get_sequence(0), np.concatenate([gc.PROMPT, got]))
    with pytest.raises(RuntimeError, match="done"):
        g.generate_next_token()
    g.close()


def test_get_logits_matches_onnxruntime() -> None:
    g = olkv.Generator(gc.ours("llama"))
    g.append_tokens(gc.PROMPT)
    toks = []
    for _ in range(3):
        g.generate_next_token()
        toks.append(int(g.get_next_tokens()[0]))
    want = gc.ort_logits_loop(gc.model("llama"), gc.PROMPT, toks)
    np.testing.assert_allclose(g.get_logits()[0], want[-1], atol=2e-3)
    assert g.get_logits().shape == (1, gc.CFG.vocab)


@pytest.mark.parametrize("variant", ["llama", "gpt2"])
def test_rewind_then_regenerate_gives_the_same_tokens(variant: str) -> None:
    g = olkv.Generator(gc.ours(variant))
    g.append_tokens(gc.PROMPT)
    for _ in range(N):
        g.generate_next_token()
    first = g.sequences
    for keep in (gc.PROMPT.size + 4, gc.PROMPT.size, gc.PROMPT.size + 1):
        g.rewind_to(keep)
        assert g.length == keep
        while g.length < first.shape[1]:
            g.generate_next_token()
        np.testing.assert_array_equal(g.sequences, first, err_msg=f"after rewind_to({keep})")
    g.rewind_to(0)
    g.append_tokens(gc.PROMPT)
    for _ in range(N):
        g.generate_next_token()
    np.testing.assert_array_equal(g.sequences, first)
    with pytest.raises(ValueError, match="rewind"):
        g.rewind_to(first.shape[1] + 1)


def test_multi_turn_keeps_the_history() -> None:
    """Turn 2 appended to the same state equals a fresh run over the whole history."""
    sess = gc.ours("llama")
    g = olkv.Generator(sess)
    g.append_tokens(gc.PROMPT)
    for _ in range(5):
        g.generate_next_token()
    turn2 = np.array([11, 12, 13])
    g.append_tokens(turn2)
    for _ in range(5):
        g.generate_next_token()
    history = np.concatenate([g.sequences[0, :gc.PROMPT.size + 5], turn2])
    fresh = olkv.generate(sess, history, max_new_tokens=5)
    np.testing.assert_array_equal(g.sequences[0], fresh.sequences[0])


def test_padded_batch_and_eos() -> None:
    ids, mask = gc.padded(gc.PROMPTS)
    refs = [gc.ort_greedy(gc.model("llama-mask"), p, N) for p in gc.PROMPTS]
    eos = int(refs[2][1])
    g = olkv.Generator(gc.ours("llama-mask"), max_length=ids.shape[1] + N, eos_token_id=eos, pad_token_id=0)
    g.append_tokens(ids, attention_mask=mask)
    while not g.is_done():
        g.generate_next_token()
    for r, ref in enumerate(refs):
        row = g.get_sequence(r)[len(gc.PROMPTS[r]):]
        stop = int(np.flatnonzero(ref == eos)[0]) + 1 if (ref == eos).any() else N
        np.testing.assert_array_equal(row[:stop], ref[:stop])
        assert (row[stop:] == 0).all()
        assert g.done_rows()[r] == (ref == eos).any()


def test_rewind_into_left_padding_is_refused() -> None:
    """A rewind that would leave a row with only its left padding raises and changes nothing;
    rewinding to where every row keeps a token continues as before."""
    ids, mask = gc.padded(gc.PROMPTS)
    g = olkv.Generator(gc.ours("llama-mask"), pad_token_id=0)
    g.append_tokens(ids, attention_mask=mask)
    for _ in range(4):
        g.generate_next_token()
    first = g.sequences
    shortest = min(len(p) for p in gc.PROMPTS)
    for bad, row in ((1, 1), (ids.shape[1] - shortest, 2)):
        with pytest.raises(ValueError, match=f"left padding of row {row} .*at least {ids.shape[1] - shortest + 1}"):
            g.rewind_to(bad)
        np.testing.assert_array_equal(g.sequences, first)
    keep = ids.shape[1] - shortest + 1  # every row keeps a token (row 0 loses part of its prompt)
    g.rewind_to(keep)
    fresh = olkv.Generator(gc.ours("llama-mask"), pad_token_id=0)
    fresh.append_tokens(ids[:, :keep], attention_mask=mask[:, :keep])
    for _ in range(4):
        g.generate_next_token()
        fresh.generate_next_token()
    np.testing.assert_array_equal(g.sequences, fresh.sequences)
    g.rewind_to(0)
    assert g.length == 0


def test_errors() -> None:
    g = olkv.Generator(gc.ours("llama"), max_length=gc.PROMPT.size + 1)
    with pytest.raises(RuntimeError, match="append_tokens"):
        g.generate_next_token()
    with pytest.raises(TypeError):
        g.append_tokens(np.array([1.5]))
    with pytest.raises(ValueError, match="max_length"):
        g.append_tokens(np.arange(gc.PROMPT.size + 2))
    g.append_tokens(gc.PROMPT)
    with pytest.raises(ValueError, match="rows"):
        g.append_tokens(np.ones((2, 1), np.int64))
    with pytest.raises(IndexError):
        g.get_sequence(3)
    for bad in ("0", 1.0):  # an index that is not an integer is a TypeError, as in numpy
        with pytest.raises(TypeError, match="index must be an integer"):
            g.get_sequence(bad)
    np.testing.assert_array_equal(g.get_sequence(np.int64(0)), gc.PROMPT)
    with pytest.raises(ValueError, match="max_length"):
        olkv.Generator(gc.ours("llama"), max_length=0)


def test_failed_append_changes_nothing() -> None:
    """A call that raises (here a token id beyond the vocabulary: refused up front, or by the
    model's Gather where the vocabulary is not known up front) leaves the rows, their state and
    the next token exactly as they were."""
    sess = gc.ours("llama")
    g = olkv.Generator(sess, max_length=64)
    g.append_tokens(gc.PROMPT)
    before = g.sequences
    with pytest.raises(ValueError, match="beyond the model's vocabulary"):
        g.append_tokens([gc.CFG.vocab + 244])
    g.io = dataclasses.replace(g.io, vocab=None)  # as for a model whose logits' last dim is symbolic
    with pytest.raises(ValueError, match="out of range"):
        g.append_tokens([gc.CFG.vocab + 244])
    np.testing.assert_array_equal(g.sequences, before)
    for _ in range(4):
        g.generate_next_token()
    np.testing.assert_array_equal(g.get_sequence(0)[gc.PROMPT.size:], gc.ort_greedy(gc.model("llama"), gc.PROMPT, 4))


def test_closed_generator_raises() -> None:
    g = olkv.Generator(gc.ours("llama"), max_length=64)
    g.append_tokens(gc.PROMPT)
    g.close()
    g.close()  # twice is fine
    for verb in (g.generate_next_token, g.get_logits, lambda: g.rewind_to(1), lambda: g.append_tokens([4])):
        with pytest.raises(ValueError, match="closed"):
            verb()
    np.testing.assert_array_equal(g.get_sequence(0), gc.PROMPT)  # what it held stays readable


@pytest.mark.parametrize("state_options", [None, False])
def test_negative_token_ids_are_refused(state_options: object) -> None:
    """generate() and Engine refuse negative ids; so does append_tokens (an ONNX Gather would
    read them from the end of the embedding table), changing nothing."""
    g = olkv.Generator(gc.ours("llama"), state_options=state_options)
    with pytest.raises(ValueError, match="non-negative"):
        g.append_tokens(np.array([3, -1]))
    with pytest.raises(ValueError, match="at least one token"):
        g.append_tokens(np.zeros((0, 3), np.int64))
    assert g.length == 0
    g.append_tokens(gc.PROMPT)
    with pytest.raises(ValueError, match="non-negative"):
        g.append_tokens(np.array([-5]))
    g.generate_next_token()
    assert g.get_next_tokens()[0] == gc.ort_greedy(gc.model("llama"), gc.PROMPT, 1)[0]
    g.close()


@pytest.mark.parametrize("tokens,mask,exc,match", [
    ([], None, ValueError, "at least one token"),  # (an empty list is float64 to numpy: emptiness first)
    ([[]], None, ValueError, "at least one token"),
    (np.zeros((2, 0), np.int64), None, ValueError, "at least one token"),
    ([1.0, 2.0], None, TypeError, "integer token ids"),
    ([True, False], None, TypeError, "integer token ids"),
    (np.ones((1, 2, 2), np.int64), None, ValueError, r"\[batch, s\] or \[s\]"),
    ([3, -1], None, ValueError, "non-negative"),
    ([[3, 4, 5]], [[1, 1]], ValueError, "shape"),
    ([[3, 4, 5]], [["a", "b", "c"]], TypeError, "attention_mask must hold numbers"),
    ([[3, 4, 5]], [[1, 1, 0]], ValueError, "left padding: every row's last position"),
    ([[3, 4, 5]], [[1, 0, 1]], ValueError, "left padding: zeros only before"),  # (NotImplementedError / nothing)
    ([[3, 4, 5], [6, 7, 8]], [[0, 1, 1], [1, 0, 2]], ValueError, "left padding: zeros only before"),
])
@pytest.mark.parametrize("state_options", [None, False])
def test_append_tokens_and_generate_share_the_prompt_rule(tokens, mask, exc, match, state_options) -> None:
    """One rule for a prompt's ids and mask: append_tokens raises what generate raises (the ids
    named tokens there), before running anything, on both paths, and holds nothing after."""
    sess = gc.ours("llama-mask")
    with pytest.raises(exc, match=match) as by_generate:
        olkv.generate(sess, tokens, attention_mask=mask, max_new_tokens=2, state_options=state_options)
    g = olkv.Generator(sess, state_options=state_options)
    with pytest.raises(exc, match=match) as by_generator:
        g.append_tokens(tokens, attention_mask=mask)
    assert str(by_generator.value) == str(by_generate.value).replace("input_ids", "tokens")
    assert g.length == 0 and g.batch == 0
    g.append_tokens(gc.PROMPT)  # and it still works
    g.generate_next_token()
    assert g.get_next_tokens()[0] == gc.ort_greedy(gc.model("llama-mask"), gc.PROMPT, 1)[0]


@pytest.mark.parametrize("state_options", [None, False])
def test_append_tokens_reads_the_mask_as_nonzero(state_options: object) -> None:
    """A mask of any nonzero values for the tokens (2s, bools, 0.5) is the 0/1 mask, as in
    generate: same positions, same tokens (2s used to shift the position ids)."""
    sess = gc.ours("llama-mask")
    ids, mask = gc.padded(gc.PROMPTS)
    want = olkv.generate(sess, ids, attention_mask=mask, max_new_tokens=4, pad_token_id=0,
                         state_options=state_options)
    for given in (mask * 2, mask.astype(bool), mask.astype(np.float32) * 0.5):
        assert olkv.generate(sess, ids, attention_mask=given, max_new_tokens=4, pad_token_id=0,
                             state_options=state_options).sequences.tolist() == want.sequences.tolist()
        g = olkv.Generator(sess, pad_token_id=0, state_options=state_options)
        g.append_tokens(ids, attention_mask=given)
        np.testing.assert_array_equal(g.attention_mask, mask)
        for _ in range(4):
            g.generate_next_token()
        np.testing.assert_array_equal(g.sequences, want.sequences)


def test_stop_sequences_never_match_left_padding() -> None:
    """A stop sequence that would end in a row's left padding plus its first new token does not
    stop the row: batched rows give what each gives alone."""
    ids = np.array([[0, 0, 0, 5], [1, 2, 3, 4]])
    mask = np.array([[0, 0, 0, 1], [1, 1, 1, 1]])
    alone = olkv.Generator(gc.ours("llama-mask"))
    alone.append_tokens([5])
    alone.generate_next_token()
    first = int(alone.get_next_tokens()[0])
    stop = [[0, 0, 5, first]]  # the padding, the prompt and the first token
    g = olkv.Generator(gc.ours("llama-mask"), stop_sequences=stop, pad_token_id=0)
    g.append_tokens(ids, attention_mask=mask)
    g.generate_next_token()
    assert int(g.get_next_tokens()[0]) == first and not g.done_rows()[0]
    out = olkv.generate(gc.ours("llama-mask"), ids, attention_mask=mask, max_new_tokens=4, stop_sequences=stop,
                        pad_token_id=0)
    want = olkv.generate(gc.ours("llama-mask"), [5], max_new_tokens=4, stop_sequences=stop)
    np.testing.assert_array_equal(out.sequences[0, ids.shape[1]:], want.sequences[0, 1:])


def test_rewind_keeps_finished_rows_finished_and_prompts_live() -> None:
    """After rewind_to, a row is finished exactly when the token that finished it is kept: a row
    whose eos lies before the rewind point stays finished (and keeps getting padding), and a
    prompt ending in an eos id is live again, as right after append_tokens."""
    ids, mask = gc.padded(gc.PROMPTS)
    refs = [gc.ort_greedy(gc.model("llama-mask"), p, N) for p in gc.PROMPTS]
    eos = int(refs[2][1])  # row 2 stops at its second token
    g = olkv.Generator(gc.ours("llama-mask"), eos_token_id=eos, pad_token_id=1)
    g.append_tokens(ids, attention_mask=mask)
    for _ in range(6):
        g.generate_next_token()
    done = g.done_rows()
    assert done[2]
    stop_at = ids.shape[1] + 2  # row 2's eos is kept by a rewind to any later length
    g.rewind_to(stop_at + 1)
    np.testing.assert_array_equal(g.done_rows(), done & True)
    g.generate_next_token()
    assert int(g.get_next_tokens()[2]) == 1  # a finished row gets padding
    g.rewind_to(stop_at - 1)  # the eos is dropped: the row is live again and regenerates it
    assert not g.done_rows()[2]
    g.generate_next_token()
    assert int(g.get_next_tokens()[2]) == eos and g.done_rows()[2]

    prompt = np.append(gc.PROMPT, eos)  # a prompt ending in an eos id (a chat turn's end)
    h = olkv.Generator(gc.ours("llama-mask"), eos_token_id=eos)
    h.append_tokens(prompt)
    assert not h.is_done()
    h.generate_next_token()
    again = int(h.get_next_tokens()[0])
    h.rewind_to(prompt.size)
    assert not h.is_done()
    h.generate_next_token()
    assert int(h.get_next_tokens()[0]) == again


def test_append_that_cannot_make_its_state_keeps_the_old_one() -> None:
    """append_tokens with another row count (after rewind_to(0)) builds the new state before
    giving up the old: when that fails (the budget holds one row, not four), the generator
    still runs its one-row prompts."""
    g = olkv.Generator(gc.ours("llama"), max_length=64, state_options={"budget": 40000})
    g.append_tokens(gc.PROMPT[:4])
    g.generate_next_token()
    want = g.sequences
    g.rewind_to(0)
    with pytest.raises(olkv.BudgetError):
        g.append_tokens(np.ones((4, 2), np.int64))
    assert g.batch == 1 and g.length == 0
    g.append_tokens(gc.PROMPT[:4])
    g.generate_next_token()
    np.testing.assert_array_equal(g.sequences, want)


def test_state_max_length_must_hold_every_appended_position() -> None:
    """A Generator's appends run every position up to max_length, so a state of one position
    fewer is refused at the first append with ValueError (it failed with CapacityError at the
    append that reached the last position); one of max_length positions takes them all."""
    sess = gc.ours("llama")
    ids = np.arange(3, 23)
    g = olkv.Generator(sess, max_length=20, state_options={"max_length": 19})
    with pytest.raises(ValueError, match="max_length=19"):
        g.append_tokens(ids[:5])
    g = olkv.Generator(sess, max_length=20, state_options={"max_length": 20})
    g.append_tokens(ids[:19])
    g.append_tokens(ids[19:])
    assert g.get_sequence(0).size == 20
