"""The built-in decoder builders are coherent, checked with onnxruntime alone.

Tolerances (max |a - b| over the logits of prefill + 32 decode steps, logits of magnitude ~30):
* float32: 1e-3 absolute. Two independent onnxruntime kernels (standard Attention-23 with a
  growing past vs GroupQueryAttention with its shared buffer and in-op rotary) differ by
  ~1e-5 in practice; the bound leaves room for other CPUs' summation orders.
* float16: 0.125 absolute (about 4 fp16 ulps at |logit| ~ 30); observed ~0.03.
Greedy tokens must be identical and the present tensors equal within the same bounds, scaled
to their magnitude (~1-10).
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import onnx
import pytest

import _ort_compare as oc

M = oc.models()
STEPS = 32
PROMPT = np.array([[3, 17, 42, 5, 99, 7, 250]], dtype=np.int64)
TOL = {"float32": 1e-3, "float16": 0.125}
PRESENT_TOL = {"float32": 1e-4, "float16": 1e-2}


def _cfg(dtype: str, **kw: Any) -> Any:
    return M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256,
                           dtype=dtype, max_positions=128, **kw)


def _generate(model: onnx.ModelProto, feed_back: bool = True, prompt: np.ndarray = PROMPT) -> Any:
    return M.greedy_generate(oc.ort(model), model, prompt, STEPS, feed_present_back=feed_back)


def _assert_same_run(a: Any, b: Any, dtype: str) -> None:
    np.testing.assert_array_equal(a.tokens, b.tokens)
    oc.assert_close("logits", a.logits, b.logits, rtol=0, atol=TOL[dtype], check_dtype=False)
    assert set(a.presents) == set(b.presents)
    for name in a.presents:
        oc.assert_close(name, a.presents[name], b.presents[name], rtol=PRESENT_TOL[dtype],
                        atol=PRESENT_TOL[dtype], check_dtype=False)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_standard_attention_matches_gqa_contrib(dtype: str) -> None:
    """Same weights through Attention-23 and com.microsoft.GroupQueryAttention agree for 33 runs."""
    cfg = _cfg(dtype)
    std, gqa = M.llama_decoder(cfg), M.llama_decoder_gqa_ort(cfg)
    onnx.checker.check_model(std, full_check=True)
    onnx.checker.check_model(gqa)
    a, b = _generate(std), _generate(gqa)
    assert a.tokens.shape == (1, STEPS + 1)
    assert len(set(a.tokens[0].tolist())) > 4, "degenerate model: greedy output barely varies"
    _assert_same_run(a, b, dtype)
    total = PROMPT.shape[1] + STEPS
    assert a.presents["present.0.key"].shape == (1, cfg.kv_heads, total, cfg.head_dim)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cached_decode_equals_full_recompute(kind: str, dtype: str) -> None:
    """Feeding present back as past gives the logits of recomputing the whole sequence."""
    model = M.build(kind, _cfg(dtype))
    onnx.checker.check_model(model, full_check=True)
    cached, full = _generate(model), _generate(model, feed_back=False)
    assert np.isfinite(cached.logits.astype(np.float32)).all()
    _assert_same_run(cached, full, dtype)
    assert cached.logits.dtype == np.dtype(dtype)


LLAMA_VARIANTS = [dict(norm="decomposed"), dict(norm="simplified"), dict(position_ids_input=False),
                  dict(attention_mask_input=True), dict(opset=24)]
GPT2_VARIANTS = [dict(fused_qkv=False), dict(mask="additive"), dict(mask="additive", dtype="float16"), dict(layernorm="decomposed"),
                 dict(gelu="erf"), dict(gelu="op_tanh", base_gelu="tanh"), dict(position_ids_input=False)]


@pytest.mark.parametrize("kind,variant", [("llama", v) for v in LLAMA_VARIANTS] + [("gpt2", v) for v in GPT2_VARIANTS],
                         ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}={v}" for k, v in x.items()))
def test_graph_variants_compute_the_same_model(kind: str, variant: Dict[str, Any]) -> None:
    """Alternative graph spellings (decomposed norms, derived positions, masks...) keep the math."""
    variant = dict(variant)
    dtype = variant.pop("dtype", "float32")
    cfg = _cfg(dtype)
    opset = variant.pop("opset", 23)
    # The tanh-approximated Gelu op is compared with the decomposed tanh formula, not exact GELU.
    base = M.build(kind, cfg, **({"gelu": variant.pop("base_gelu")} if "base_gelu" in variant else {}))
    model = M.build(kind, cfg.replace(opset=opset), **variant)
    if variant.get("norm") != "simplified":
        onnx.checker.check_model(model, full_check=True)
    a = M.greedy_generate(oc.ort(base), base, PROMPT, 8)
    b = M.greedy_generate(oc.ort(model), model, PROMPT, 8)
    assert np.isfinite(b.logits.astype(np.float32)).all()
    _assert_same_run(a, b, dtype)


def test_batched_prompts_match_single_rows() -> None:
    """Rows of a batch decode independently (no cross-batch leakage)."""
    model = M.llama_decoder(_cfg("float32"))
    prompts = np.array([[1, 2, 3, 4], [9, 8, 7, 6], [5, 5, 5, 5]], dtype=np.int64)
    both = M.greedy_generate(oc.ort(model), model, prompts, 8)
    for row in range(3):
        one = M.greedy_generate(oc.ort(model), model, prompts[row:row + 1], 8)
        np.testing.assert_array_equal(both.tokens[row], one.tokens[0])
        np.testing.assert_allclose(both.logits[:, row], one.logits[:, 0], atol=1e-4)


def test_weights_are_seeded_and_shared_between_llama_kinds() -> None:
    cfg = _cfg("float32")
    a, b = M.llama_decoder(cfg), M.llama_decoder(cfg)
    assert a.SerializeToString() == b.SerializeToString()
    c = M.llama_decoder(cfg.replace(seed=1))
    wa = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    wc = {t.name: onnx.numpy_helper.to_array(t) for t in c.graph.initializer}
    wg = {t.name: onnx.numpy_helper.to_array(t) for t in M.llama_decoder_gqa_ort(cfg).graph.initializer}
    assert not np.array_equal(wa["lm_head.weight"], wc["lm_head.weight"])
    for name, arr in wa.items():
        if not name.startswith("const_"):
            np.testing.assert_array_equal(arr, wg[name], err_msg=name)
    assert M.config_of(a) == cfg and M.kind_of(a) == "llama"


def test_geometry_is_respected(tmp_path: Any) -> None:
    cfg = M.DecoderConfig(layers=3, hidden=48, q_heads=6, kv_heads=1, head_dim=8, vocab=100,
                          intermediate=40, max_positions=64)
    model = M.llama_decoder(cfg)
    assert [i.name for i in model.graph.input] == ["input_ids", "position_ids"] + M.past_names(3)
    assert [o.name for o in model.graph.output] == ["logits"] + M.present_names(3)
    path = M.save_model(model, tmp_path / "m.onnx")
    sess = oc.ort(path)
    out = sess.run(None, {"input_ids": np.array([[1, 2]]), "position_ids": np.array([[0, 1]]),
                          **{n: np.zeros((1, 1, 0, 8), np.float32) for n in M.past_names(3)}})
    assert out[0].shape == (1, 2, 100)
    assert out[1].shape == (1, 1, 2, 8)
    gpt = M.gpt2_decoder(cfg)
    assert [i.name for i in gpt.graph.input][-1] == "past_key_values.2.value"


@pytest.mark.parametrize("bad", [dict(dtype="float64"), dict(q_heads=6, kv_heads=4), dict(head_dim=7), dict(opset=22),
                                 dict(layers=0)])
def test_bad_config_is_rejected(bad: Dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        M.DecoderConfig(**bad)


def test_generate_rejects_bad_prompts() -> None:
    model = M.llama_decoder(_cfg("float32"))
    sess = oc.ort(model)
    with pytest.raises(ValueError, match="vocab|lie in"):
        M.greedy_generate(sess, model, [1, 2, 999], 1)
    with pytest.raises(ValueError, match="max_positions"):
        M.greedy_generate(sess, model, [1, 2, 3], 200)


def test_gqa_model_runs_on_a_shared_past_present_buffer() -> None:
    """onnxruntime's shared-buffer contract: past and present bound (IOBinding) to one buffer
    per layer, decoded token by token, gives the standard model's logits."""
    import onnxruntime

    cfg = _cfg("float32")
    std, gqa = M.llama_decoder(cfg), M.llama_decoder_gqa_ort(cfg)
    want = _generate(std)
    sess = oc.ort(gqa)
    cap = PROMPT.shape[1] + STEPS + 1
    bufs = {n: onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros((1, cfg.kv_heads, cap, cfg.head_dim), np.float32))
            for n in M.past_names(cfg.layers)}
    seq = PROMPT.copy()
    step_in = PROMPT
    for step in range(STEPS + 1):
        binding = sess.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(step_in))
        binding.bind_cpu_input("attention_mask", np.ones((1, seq.shape[1]), np.int64))
        binding.bind_output("logits")
        for past, present in zip(M.past_names(cfg.layers), M.present_names(cfg.layers)):
            binding.bind_ortvalue_input(past, bufs[past])
            binding.bind_ortvalue_output(present, bufs[past])
        sess.run_with_iobinding(binding)
        logits = binding.copy_outputs_to_cpu()[0][:, -1, :]
        oc.assert_close(f"logits of step {step}", logits, want.step_logits[step], 0, TOL["float32"])
        token = np.argmax(logits, axis=-1)
        assert token[0] == want.tokens[0, step]
        seq = np.concatenate([seq, token[:, None]], axis=1)
        step_in = token[:, None]
    key0 = bufs["past_key_values.0.key"].numpy()[:, :, :PROMPT.shape[1] + STEPS]
    oc.assert_close("shared key buffer", key0, want.presents["present.0.key"], PRESENT_TOL["float32"], PRESENT_TOL["float32"])


@pytest.mark.parametrize("kw,exc", [
    ({"layers": 2.5}, TypeError), ({"layers": True}, TypeError), ({"hidden": "64"}, TypeError),
    ({"opset": "23"}, TypeError), ({"intermediate": -5}, ValueError), ({"seed": -1}, ValueError),
    ({"rope_theta": float("nan")}, ValueError), ({"rope_theta": 0.0}, ValueError), ({"norm_eps": -1.0}, ValueError),
    ({"kv_heads": 3}, ValueError), ({"max_positions": 10 ** 12}, ValueError),
])
def test_decoder_config_refuses_bad_fields_up_front(kw: dict, exc: type) -> None:
    """Every DecoderConfig field is checked when the config is made (types, ranges, and a
    geometry whose weights and position tables would not fit the memory), not when a build
    fails later or fills the memory."""
    from onnx_light_kv import models as Mod

    with pytest.raises(exc):
        Mod.DecoderConfig(**kw)
