"""The built-in decoders in our runtime match onnxruntime over prefill + 32 greedy decode steps.

Each case runs the same ModelProto in both runtimes through ``greedy_generate`` (present fed
back as past on every step) and requires identical greedy tokens, logits within the tolerance
below at every step, and the final present tensors (which contain every past position, since
each step copies the past forward) equal within the present tolerance.

Tolerances (absolute, logits of magnitude ~30, present values of magnitude ~1-10):
* float32: logits 2e-3, presents 1e-4 (observed differences between summation orders ~1e-5).
* float16: logits 0.25, presents 0.02 (a few fp16 ulps; onnxruntime widens many fp16 kernels
  to fp32 internally, we may round at different points).
Sizes are small (2 layers, hidden 64) so the file runs in seconds.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest

import _ort_compare as oc

M = oc.models()
STEPS = 32
PROMPTS = {1: np.array([[3, 17, 42, 5, 99, 7, 250]], dtype=np.int64),
           2: np.array([[3, 17, 42, 5, 99, 7, 250], [1, 1, 2, 3, 5, 8, 13]], dtype=np.int64)}
LOGIT_TOL = {"float32": 2e-3, "float16": 0.25}
PRESENT_TOL = {"float32": 1e-4, "float16": 2e-2}

CASES = [
    ("llama", {}, 1),
    ("llama", {}, 2),
    ("llama", {"norm": "decomposed", "position_ids_input": False}, 1),
    ("llama", {"attention_mask_input": True}, 1),
    ("llama", {"opset": 24}, 1),
    ("gpt2", {}, 1),
    ("gpt2", {}, 2),
    ("gpt2", {"fused_qkv": False, "mask": "additive", "gelu": "erf", "layernorm": "decomposed"}, 1),
    ("gpt2", {"gelu": "tanh", "position_ids_input": False}, 1),
    # geometry: MQA with head_dim 128 and 3 layers; a long prompt crossing kernel block sizes
    ("llama", {"layers": 3, "q_heads": 4, "kv_heads": 1, "head_dim": 128, "hidden": 96}, 2),
    ("llama", {"prompt_len": 300}, 1),
    ("gpt2", {"prompt_len": 300, "q_heads": 2, "head_dim": 32}, 1),
    # our session with two threads (parallel kernels inside a whole decoder)
    ("llama", {"threads": 2, "prompt_len": 40}, 2),
    ("gpt2", {"threads": 2, "prompt_len": 40}, 2),
]
CONFIG_FIELDS = {"layers", "hidden", "q_heads", "kv_heads", "head_dim", "vocab", "opset"}


def _id(case: Any) -> str:
    kind, variant, batch = case
    extra = "-".join(f"{k}={v}" for k, v in variant.items())
    return f"{kind}-b{batch}" + (f"-{extra}" if extra else "")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_decoder_greedy_matches_onnxruntime(case: Any, dtype: str) -> None:
    kind, variant, batch = case
    variant = dict(variant)
    geometry = {k: variant.pop(k) for k in list(variant) if k in CONFIG_FIELDS}
    prompt_len = variant.pop("prompt_len", 0)
    threads = variant.pop("threads", 1)
    cfg = M.DecoderConfig(**{**dict(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256,
                                    dtype=dtype, max_positions=512), **geometry})
    model = M.build(kind, cfg, **variant)
    prompt = PROMPTS[batch]
    if prompt_len:
        prompt = np.random.default_rng(prompt_len).integers(0, cfg.vocab, size=(batch, prompt_len))
    sess = oc.ours(model, threads=threads)  # skips while our InferenceSession does not exist
    want = M.greedy_generate(oc.ort(model), model, prompt, STEPS)
    got = M.greedy_generate(sess, model, prompt, STEPS)

    assert got.prefill_logits.dtype == want.prefill_logits.dtype
    oc.assert_close("prefill logits", got.prefill_logits, want.prefill_logits, 0, LOGIT_TOL[dtype])
    for step in range(STEPS + 1):
        oc.assert_close(f"logits of step {step}", got.step_logits[step], want.step_logits[step], 0, LOGIT_TOL[dtype])
        np.testing.assert_array_equal(got.tokens[:, step], want.tokens[:, step], err_msg=f"greedy token of step {step}")
    assert set(got.presents) == set(want.presents)
    for name in want.presents:
        oc.assert_close(name, got.presents[name], want.presents[name], PRESENT_TOL[dtype], PRESENT_TOL[dtype])


def test_session_reports_decoder_inputs_and_outputs() -> None:
    """get_inputs()/get_outputs() list the graph's names in order, like onnxruntime."""
    model = M.llama_decoder(M.DecoderConfig(layers=2))
    sess = oc.ours(model)
    want = oc.ort(model)
    assert [i.name for i in sess.get_inputs()] == [i.name for i in want.get_inputs()]
    assert [o.name for o in sess.get_outputs()] == [o.name for o in want.get_outputs()]


def test_present_observed_only_when_requested() -> None:
    """Asking only for logits gives the same logits as asking for everything."""
    model = M.gpt2_decoder(M.DecoderConfig(layers=2))
    sess = oc.ours(model)
    feeds: Dict[str, np.ndarray] = {"input_ids": PROMPTS[1], "position_ids": np.arange(7)[None, :]}
    feeds.update({n: np.zeros((1, 4, 0, 16), np.float32) for n in M.past_names(2)})
    (only,) = sess.run(["logits"], feeds)
    every = sess.run(None, feeds)
    np.testing.assert_array_equal(only, every[0])
    assert len(every) == 1 + 2 * 2


def test_node_args_match_onnxruntime() -> None:
    """get_inputs()/get_outputs(): names, element types and symbolic/fixed dims like onnxruntime."""
    model = M.gpt2_decoder(M.DecoderConfig(layers=1, dtype="float16"))
    ours, want = oc.ours(model), oc.ort(model)
    for got_args, want_args in ((ours.get_inputs(), want.get_inputs()), (ours.get_outputs(), want.get_outputs())):
        assert [(a.name, a.type, list(a.shape)) for a in got_args] == [(a.name, a.type, list(a.shape)) for a in want_args]


def test_model_with_external_data_from_path(tmp_path: Any) -> None:
    """Initializers in a side file next to the model (exporter layout) load from the model path."""
    model = M.llama_decoder(M.DecoderConfig(layers=2))
    path = M.save_model(model, tmp_path / "decoder.onnx", external_data=True)
    assert (tmp_path / "decoder.onnx.data").stat().st_size > 100_000
    got = M.greedy_generate(oc.ours(path), model, PROMPTS[1], 4)
    want = M.greedy_generate(oc.ort(path), model, PROMPTS[1], 4)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    oc.assert_close("logits", got.logits, want.logits, 0, LOGIT_TOL["float32"])
