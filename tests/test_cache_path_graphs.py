"""The cache path's rewrite rules on small hand-built attention graphs, against onnxruntime: what
they rewrite must compute what the graph computes, and what they cannot must be refused (the
layer left on the tensor path, or the run refused with NotImplementedError), never run wrong.

Each graph is one attention layer over q, k, v inputs ``[1, 2, s, 4]`` with its past/present pair.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnx_light_kv as olkv

ort = pytest.importorskip("onnxruntime")

B, H, D = 1, 2, 4
PK, PV, YK, YV = "past_key_values.0.key", "past_key_values.0.value", "present.0.key", "present.0.value"


def _f(name: str, shape: Optional[List]) -> object:
    return helper.make_tensor_value_info(name, TP.FLOAT, shape)


def _model(nodes: List, extra_inputs: List = (), inits: List = ()) -> bytes:
    inputs = [_f("q", [B, H, "s", D]), _f("k", [B, H, "s", D]), _f("v", [B, H, "s", D]),
              _f(PK, [B, H, "p", D]), _f(PV, [B, H, "p", D]), *extra_inputs]
    g = helper.make_graph(nodes, "layer", inputs, [_f("y", None), _f(YK, None), _f(YV, None)], initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10).SerializeToString()


def _run_both(mb: bytes, steps: List[int], mask=None) -> List[float]:
    """Runs of ``steps`` new tokens on a state and on onnxruntime (fed its own presents); the
    largest |difference| of each run. ``mask(P, s)`` gives an extra ``attn_mask`` feed."""
    rng = np.random.default_rng(0)
    sess = olkv.InferenceSession(mb)
    ref = ort.InferenceSession(mb, providers=["CPUExecutionProvider"])
    st = sess.create_state()
    pk = pv = np.zeros((B, H, 0, D), np.float32)
    errs = []
    for s in steps:
        feed: Dict[str, np.ndarray] = {n: rng.standard_normal((B, H, s, D)).astype(np.float32) for n in "qkv"}
        if mask is not None:
            feed["attn_mask"] = mask(pk.shape[2], s)
        y, pk, pv = ref.run(None, {**feed, PK: pk, PV: pv})
        got = sess.run(["y"], feed, state=st)[0]
        errs.append(float(np.abs(got - y).max()))
    return errs


def _windowed(P: int, s: int, keep) -> np.ndarray:
    """A bool ``[s, P + s]`` mask: query i (position P + i) attends key t where keep(P + i, t)."""
    return np.array([[keep(P + i, t) for t in range(P + s)] for i in range(s)], bool)


def test_concat_pasts_into_causal_attention_are_refused() -> None:
    """Attention(q, Concat(past, k), Concat(past, v), is_causal=1) without past inputs aligns the
    triangle to the first key (ONNX; onnxruntime agrees), so after a past a query sees only the
    first keys. The cache path ran it aligned to the end of the past: wrong by 1.5 from the first
    decode step on. It now stays on the tensor path, which matches onnxruntime."""
    nodes = [helper.make_node("Concat", [PK, "k"], [YK], axis=2), helper.make_node("Concat", [PV, "v"], [YV], axis=2),
             helper.make_node("Attention", ["q", YK, YV], ["y"], is_causal=1)]
    mb = _model(nodes)
    sess = olkv.InferenceSession(mb)
    plan = sess.cache_plan()
    assert not plan[0]["rewritten"] and "aligns that triangle to the first key" in plan[0]["reason"]
    with pytest.raises(NotImplementedError, match="tensor path only"):
        sess.create_state()
    rng = np.random.default_rng(1)
    ref = ort.InferenceSession(mb, providers=["CPUExecutionProvider"])
    feed = {n: rng.standard_normal((B, H, 1, D)).astype(np.float32) for n in "qkv"}
    feed[PK], feed[PV] = (rng.standard_normal((B, H, 3, D)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(sess.run(["y"], feed)[0], ref.run(["y"], feed)[0], atol=1e-6)


def _masked_attention() -> bytes:
    node = helper.make_node("Attention", ["q", "k", "v", "attn_mask", PK, PV], ["y", YK, YV])
    return _model([node], extra_inputs=[helper.make_tensor_value_info("attn_mask", TP.BOOL, ["s", "t"])])


@pytest.mark.parametrize("window", [1, 3])
def test_sliding_window_without_an_attention_mask_input(window: int) -> None:
    """A sliding window and no attention_mask input: the first real position was guessed from the
    last row, so the rows before its window were taken for left padding (window 1: zeros for
    them, silently; window 3: refused). Now every run matches onnxruntime."""
    errs = _run_both(_masked_attention(), [9, 1, 1, 2],
                     lambda P, s: _windowed(P, s, lambda p, t: p - window < t <= p))
    assert max(errs) < 1e-5, errs


def test_chunked_mask_is_refused_not_run_wrong() -> None:
    """A chunked local-attention mask (chunks of 4, as Llama 4's) is neither causal plus left
    padding nor a sliding window: refused with NotImplementedError (its earlier chunks were taken
    for left padding and their rows zeroed)."""
    mb = _masked_attention()
    sess = olkv.InferenceSession(mb)
    st = sess.create_state()
    rng = np.random.default_rng(2)
    feed = {n: rng.standard_normal((B, H, 10, D)).astype(np.float32) for n in "qkv"}
    feed["attn_mask"] = _windowed(0, 10, lambda p, t: t // 4 == p // 4 and t <= p)
    with pytest.raises(NotImplementedError, match="not causal plus left padding"):
        sess.run(["y"], feed, state=st)
    assert st.lengths.tolist() == [0]  # nothing stored


@pytest.mark.parametrize("scale_first", [False, True])
def test_query_scale_on_either_side_of_mul(scale_first: bool) -> None:
    """Decomposed attention scaling q by Mul(scale, q) as well as Mul(q, scale): the rule took the
    scale for the query in the first form (every state run failed)."""
    scale = helper.make_tensor("scale", TP.FLOAT, [], [0.5])
    tril = helper.make_tensor("tril_fill", TP.FLOAT, [], [-1e9])
    nodes = [helper.make_node("Concat", [PK, "k"], [YK], axis=2), helper.make_node("Concat", [PV, "v"], [YV], axis=2),
             helper.make_node("Mul", ["scale", "q"] if scale_first else ["q", "scale"], ["qs"]),
             helper.make_node("Transpose", [YK], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
             helper.make_node("Where", ["attn_mask", "scores", "tril_fill"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", YV], ["y"])]
    mb = _model(nodes, extra_inputs=[helper.make_tensor_value_info("attn_mask", TP.BOOL, ["s", "t"])],
                inits=[scale, tril])
    plan = olkv.InferenceSession(mb).cache_plan()
    assert plan[0]["rewritten"] and plan[0]["rule"] == "concat-past-present", plan
    errs = _run_both(mb, [5, 1, 2], lambda P, s: _windowed(P, s, lambda p, t: t <= p))
    assert max(errs) < 1e-5, errs


def _typed_attention(elem: int) -> bytes:
    node = helper.make_node("Attention", ["q", "k", "v", "", PK, PV], ["y", YK, YV], is_causal=1)

    def vi(name: str, shape: List) -> object:
        return helper.make_tensor_value_info(name, elem, shape)

    g = helper.make_graph([node], "layer", [vi("q", [B, H, "s", D]), vi("k", [B, H, "s", D]), vi("v", [B, H, "s", D]),
                                            vi(PK, [B, H, "p", D]), vi(PV, [B, H, "p", D])],
                          [vi("y", None), vi(YK, None), vi(YV, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10).SerializeToString()


@pytest.mark.parametrize("want", ["float32", "float16", "bfloat16", None])
def test_state_dtype_of_a_float16_model(want: Optional[str]) -> None:
    """create_state(dtype="float32") on a float16 model stores float32 (the request was read as
    "the model's type", as float32 is the storage type's zero value); None keeps float16."""
    sess = olkv.InferenceSession(_typed_attention(TP.FLOAT16))
    st = sess.create_state(dtype=want)
    assert str(st.dtype) == (want or "float16")
    rng = np.random.default_rng(3)
    feed = {n: rng.standard_normal((B, H, 3, D)).astype(np.float16) for n in "qkv"}
    y = sess.run(["y"], feed, state=st)[0]
    ref = ort.InferenceSession(_typed_attention(TP.FLOAT16), providers=["CPUExecutionProvider"])
    zero = np.zeros((B, H, 0, D), np.float16)
    np.testing.assert_allclose(y.astype(np.float32), ref.run(["y"], {**feed, PK: zero, PV: zero})[0].astype(np.float32),
                               atol=3e-2 if want == "bfloat16" else 2e-3)  # (bf16 K/V: 8 bits of mantissa)


def test_float64_pasts_stay_on_the_tensor_path() -> None:
    """The cache kernel reads float32/float16/bfloat16: a float64 model's layers are reported as not
    rewritten, with the reason, and create_state refuses (it was reported rewritten, then every
    state run failed with a TypeError)."""
    sess = olkv.InferenceSession(_typed_attention(TP.DOUBLE))
    plan = sess.cache_plan()
    assert not plan[0]["rewritten"] and "the pasts are float64" in plan[0]["reason"], plan
    for dtype in (None, "float32", "float16"):
        with pytest.raises(NotImplementedError, match="the pasts are float64"):
            sess.create_state(dtype=dtype)
