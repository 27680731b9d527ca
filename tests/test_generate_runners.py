"""The two runners give the same tokens: the cache path (GenerationState from
``create_state``, feeds without pasts) and the tensor path (presents fed back as pasts)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import _gen_common as gc
import _ort_compare as oc

olkv = pytest.importorskip("onnx_light_kv")

N = 12


@pytest.mark.parametrize("variant", ["llama", "llama-mask", "llama-derived-positions", "llama-opset24"])
def test_greedy_same_tokens_on_both_runners(variant: str) -> None:
    sess = gc.ours(variant)
    if not hasattr(sess, "create_state"):
        pytest.skip("this build's InferenceSession has no cache path")
    on_state = olkv.generate(sess, gc.PROMPT, max_new_tokens=N)
    on_tensor = olkv.generate(sess, gc.PROMPT, max_new_tokens=N, state_options=False)
    assert on_state.stats.runner == "state" and on_tensor.stats.runner == "tensor"
    np.testing.assert_array_equal(on_state.sequences, on_tensor.sequences)
    np.testing.assert_array_equal(on_state.new_tokens[0], gc.ort_greedy(gc.model(variant), gc.PROMPT, N))


def test_padded_batch_beams_and_speculative_same_on_both_runners() -> None:
    sess = gc.ours("llama-mask")
    if not hasattr(sess, "create_state"):
        pytest.skip("this build's InferenceSession has no cache path")
    ids, mask = gc.padded(gc.PROMPTS)
    cases = [dict(input_ids=ids, attention_mask=mask),
             dict(input_ids=ids[:2], attention_mask=mask[:2], num_beams=3, num_return_sequences=2, eos_token_id=23),
             dict(input_ids=gc.PROMPT, draft_session=gc.ours("llama")),
             dict(input_ids=gc.PROMPT, draft_session=gc.ours("gpt2", seed=2), num_draft_tokens=2)]
    for kw in cases:
        a = olkv.generate(sess, max_new_tokens=N, **kw)
        b = olkv.generate(sess, max_new_tokens=N, state_options=False, **kw)
        assert a.stats.runner == "state" and b.stats.runner == "tensor"
        np.testing.assert_array_equal(a.sequences, b.sequences, err_msg=str(sorted(kw)))
        if a.sequences_scores is not None:
            np.testing.assert_allclose(a.sequences_scores, b.sequences_scores, atol=1e-4)
        assert a.stats.accepted_draft_tokens == b.stats.accepted_draft_tokens


def test_generator_on_the_state_appends_only_new_tokens() -> None:
    sess = gc.ours("llama")
    if not hasattr(sess, "create_state"):
        pytest.skip("this build's InferenceSession has no cache path")
    g = olkv.Generator(sess, max_length=64)
    g.append_tokens(gc.PROMPT)
    for _ in range(N):
        g.generate_next_token()
    assert g.runner_kind == "state"
    totals = g._runner.state.info()["totals"]
    row = 2 * gc.CFG.layers * gc.CFG.kv_heads * gc.CFG.head_dim * 4  # K and V of one token, all layers
    # the prompt and every fed token copied once; the newest token is not run yet
    assert totals["append_bytes"] == row * (gc.PROMPT.size + N - 1)
    assert totals["export_bytes"] == 0 and totals["copy_bytes"] == 0
    first = g.sequences
    g.rewind_to(gc.PROMPT.size + 3)
    while g.length < first.shape[1]:
        g.generate_next_token()
    np.testing.assert_array_equal(g.sequences, first)
    np.testing.assert_array_equal(first[0, gc.PROMPT.size:], gc.ort_greedy(gc.model("llama"), gc.PROMPT, N))


def test_state_options() -> None:
    sess = gc.ours("llama")
    if not hasattr(sess, "create_state"):
        pytest.skip("this build's InferenceSession has no cache path")
    half = olkv.generate(sess, gc.PROMPT, max_new_tokens=4, state_options={"dtype": "float16"})
    assert half.stats.runner == "state" and half.new_tokens.shape == (1, 4)
    # a present that another node reads keeps the model on the tensor path
    m = onnx.ModelProto()
    m.CopyFrom(gc.model("llama"))
    m.graph.node.append(onnx.helper.make_node("Identity", ["present.0.key"], ["present_copy"]))
    m.graph.output.append(onnx.helper.make_tensor_value_info("present_copy", onnx.TensorProto.FLOAT, None))
    kept = oc.ours(m)
    assert not all(p["rewritten"] for p in kept.cache_plan())
    with pytest.raises(NotImplementedError, match="tensor path"):
        olkv.generate(kept, gc.PROMPT, max_new_tokens=2, state_options={})
    out = olkv.generate(kept, gc.PROMPT, max_new_tokens=N)
    assert out.stats.runner == "tensor"
    np.testing.assert_array_equal(out.new_tokens[0], gc.ort_greedy(gc.model("llama"), gc.PROMPT, N))
    assert olkv.generate(gc.ours("gpt2"), gc.PROMPT, max_new_tokens=2).stats.runner == "state"  # Concat pasts
    with pytest.raises(NotImplementedError, match="create_state"):
        olkv.generate(gc.ort("llama"), gc.PROMPT, max_new_tokens=2, state_options={})
    with pytest.raises(TypeError, match="state_options"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=2, state_options="yes")


def test_state_options_that_cannot_hold_the_generation_are_refused_up_front() -> None:
    """A state ``max_length`` below the positions the generation may store, or a ``batch`` (the
    prompt sets the rows), is refused with ValueError before any token is made (a too-short state
    used to run out of room mid-way, losing the tokens made, and ``batch`` gave an internal
    TypeError); a ``max_length`` one below prompt + max_new_tokens fits (the last token is not
    stored)."""
    sess = gc.ours("llama")
    if not hasattr(sess, "create_state"):
        pytest.skip("this build's InferenceSession has no cache path")
    n = gc.PROMPT.size
    for opts in ({"max_length": n + 4}, {"max_length": n + 4, "quant": "int8"}):
        with pytest.raises(ValueError, match="cannot hold"):
            olkv.generate(sess, gc.PROMPT, max_new_tokens=6, state_options=opts)
    out = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, state_options={"max_length": n + 5})
    assert out.new_tokens.shape == (1, 6)
    with pytest.raises(ValueError, match="batch"):
        olkv.generate(sess, gc.PROMPT, max_new_tokens=2, state_options={"batch": 2})
    with pytest.raises(ValueError, match="cannot hold"):
        olkv.Generator(sess, max_length=n + 20, state_options={"max_length": n + 4}).append_tokens(gc.PROMPT[None])


class _RefusingStates:
    """A session whose state runs raise NotImplementedError, as the cache path does for a form
    its plan accepted but a run refuses; everything else is the real session's."""

    def __init__(self, sess: object) -> None:
        self._sess = sess
        self.refused = 0

    def run(self, outputs, feeds, state=None):  # type: ignore[no-untyped-def]
        if state is not None:
            self.refused += 1
            raise NotImplementedError("CacheAttention: the attention mask has shape (1, 4, 6, 6)")
        return self._sess.run(outputs, feeds)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sess, name)


@pytest.mark.parametrize("kw", [dict(), dict(do_sample=True, seed=3), dict(num_beams=2), dict(prompt_lookup=2)],
                         ids=["greedy", "sampling", "beams", "speculative"])
def test_a_first_run_the_cache_path_refuses_falls_back_to_the_tensor_path(kw: dict) -> None:
    """state_options=None: the tensor path takes over, with a warning, and gives its tokens;
    an explicit state_options keeps the error."""
    sess = gc.ours("llama")
    want = olkv.generate(sess, gc.PROMPT, max_new_tokens=6, state_options=False, **kw)
    refusing = _RefusingStates(sess)
    with pytest.warns(RuntimeWarning, match="the cache path refused this model at its first run"):
        got = olkv.generate(refusing, gc.PROMPT, max_new_tokens=6, **kw)
    np.testing.assert_array_equal(got.sequences, want.sequences)
    assert refusing.refused >= 1 and got.stats.runner == "tensor"
    with pytest.raises(NotImplementedError, match="attention mask"):
        olkv.generate(refusing, gc.PROMPT, max_new_tokens=6, state_options={}, **kw)
    g = olkv.Generator(refusing, max_length=20)
    with pytest.warns(RuntimeWarning):
        g.append_tokens(gc.PROMPT)
    g.generate_next_token()
    assert g.runner_kind == "tensor"
    g.close()
