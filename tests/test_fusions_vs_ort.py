"""Session-creation fusions (golib/runtime/fuse_*.go) against onnxruntime: graphs in the forms
the exporters write (the SwiGLU gate, a biased projection, rotate_half rotary embeddings) run
fused here (the profile names the fused ops) and give onnxruntime's outputs; a variant whose
match cannot be proven stays unfused and still matches."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")
session = pytest.importorskip("onnx_light_kv.session")
InferenceSession = session.InferenceSession

D, F = 16, 24


def _model(nodes: list, inputs: list, outputs: List[str], inits: Dict[str, np.ndarray]) -> bytes:
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


def _mlp(bias: bool, gate_from_feed: bool = False) -> bytes:
    rng = np.random.default_rng(1)
    inits = {"wg": rng.standard_normal((D, F), np.float32), "wu": rng.standard_normal((D, F), np.float32),
             "wo": rng.standard_normal((D, F), np.float32), "bo": rng.standard_normal(F).astype(np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("MatMul", ["h", "wg"], ["g"]),
             helper.make_node("MatMul", ["x" if gate_from_feed else "h", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["g", "s"], ["m"]),
             helper.make_node("Mul", ["m", "u"], ["y"])]
    outs = ["y"]
    if bias:
        nodes += [helper.make_node("MatMul", ["h", "wo"], ["p"]), helper.make_node("Add", ["p", "bo"], ["o"])]
        outs.append("o")
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", D])], outs, inits)


def _rotary(canonical: bool) -> bytes:
    """q_embed = q * cos + rotate_half(q) * sin with the split point read from q's shape, as the
    TorchScript exporter writes it (canonical: the halves; else a split at a quarter)."""
    div = 2 if canonical else 4
    inits = {"axis": np.array([3], np.int64), "zero": np.array([0], np.int64), "big": np.array([2 ** 63 - 1], np.int64),
             "one": np.array([1], np.int64), "idx": np.array(3, np.int64), "div": np.array(div, np.int64),
             "uaxes": np.array([0], np.int64), "cax": np.array([1], np.int64)}
    nodes = [helper.make_node("Shape", ["q"], ["qs"]),
             helper.make_node("Gather", ["qs", "idx"], ["d"], axis=0),
             helper.make_node("Div", ["d", "div"], ["h"]),
             helper.make_node("Unsqueeze", ["h", "uaxes"], ["h1"]),
             helper.make_node("Slice", ["q", "zero", "h1", "axis", "one"], ["x1"]),
             helper.make_node("Slice", ["q", "h1", "big", "axis", "one"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["nx2"]),
             helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
             helper.make_node("Unsqueeze", ["cos", "cax"], ["c4"]),
             helper.make_node("Unsqueeze", ["sin", "cax"], ["s4"]),
             helper.make_node("Mul", ["q", "c4"], ["qc"]),
             helper.make_node("Mul", ["rot", "s4"], ["rs"]),
             helper.make_node("Add", ["qc", "rs"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", 4, "s", D]),
              helper.make_tensor_value_info("cos", TensorProto.FLOAT, ["b", "s", D]),
              helper.make_tensor_value_info("sin", TensorProto.FLOAT, ["b", "s", D])]
    return _model(nodes, inputs, ["y"], inits)


def _ops_run(sess, feeds) -> set:
    sess.run(None, feeds)
    return {e["op"] for e in sess.last_run_stats["events"]}


def _ort(data: bytes):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (1, 40), (3, 0)])
@pytest.mark.parametrize("variant", ["gated", "gated+bias", "gate-from-another-input"])
def test_mlp_fusions_match_onnxruntime(shape, variant) -> None:
    data = _mlp(bias="bias" in variant, gate_from_feed=variant == "gate-from-another-input")
    x = np.random.default_rng(sum(shape)).standard_normal((*shape, D)).astype(np.float32) * 3
    ours = InferenceSession(data, threads=1, profile=True)
    ops = _ops_run(ours, {"x": x})
    assert "SiLU" in ops and "Sigmoid" not in ops
    assert ("MatMulBias" in ops) == ("bias" in variant)
    if variant == "gate-from-another-input":
        assert "Mul" in ops  # the gate multiply is not proven to share the SiLU's shape: kept
    got = ours.run(None, {"x": x})
    want = _ort(data).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if w.size:  # float32 sigmoids and GEMM summation orders differ by a few ulps
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * float(np.abs(w).max()))


@pytest.mark.parametrize("seq", [1, 7])
@pytest.mark.parametrize("canonical", [True, False])
def test_rotary_fusion_matches_onnxruntime(seq: int, canonical: bool) -> None:
    data = _rotary(canonical)
    rng = np.random.default_rng(seq)
    q = rng.standard_normal((2, 4, seq, D)).astype(np.float32)
    ang = rng.standard_normal((2, seq, D // 2)).astype(np.float32)
    ang = np.concatenate([ang, ang], axis=-1)
    feeds = {"q": q, "cos": np.cos(ang), "sin": np.sin(ang)}
    ours = InferenceSession(data, threads=1, profile=True)
    ops = _ops_run(ours, feeds)
    assert "RotaryHalf" in ops and "Neg" not in ops and "Concat" not in ops
    got = ours.run(None, feeds)[0]
    want = _ort(data).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if canonical:  # the rotate_half definition itself
        half = D // 2
        ref = q * feeds["cos"][:, None] + np.concatenate([-q[..., half:], q[..., :half]], -1) * feeds["sin"][:, None]
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def _repeat_kv() -> bytes:
    """Attention (opset 23) over K/V expanded to the query heads by repeat_kv (Unsqueeze at
    axis 2, Expand, Reshape, the shapes computed from Shape(k)), as torch.onnx dynamo writes
    it for grouped-query models."""
    inits = {"ax": np.array([2], np.int64), "rep": np.array([3], np.int64), "s0": np.array([0], np.int64),
             "s1": np.array([1], np.int64), "s2": np.array([2], np.int64), "s4": np.array([4], np.int64)}
    nodes = []
    for x in ("k", "v"):
        nodes += [helper.make_node("Shape", [x], [x + "_s"]),
                  helper.make_node("Slice", [x + "_s", "s0", "s2"], [x + "_bh"]),
                  helper.make_node("Slice", [x + "_s", "s2", "s4"], [x + "_td"]),
                  helper.make_node("Slice", [x + "_s", "s0", "s1"], [x + "_b"]),
                  helper.make_node("Slice", [x + "_s", "s1", "s2"], [x + "_h"]),
                  helper.make_node("Mul", [x + "_h", "rep"], [x + "_hr"]),
                  helper.make_node("Concat", [x + "_bh", "rep", x + "_td"], [x + "_exp"], axis=0),
                  helper.make_node("Concat", [x + "_b", x + "_hr", x + "_td"], [x + "_res"], axis=0),
                  helper.make_node("Unsqueeze", [x, "ax"], [x + "_u"]),
                  helper.make_node("Expand", [x + "_u", x + "_exp"], [x + "_e"]),
                  helper.make_node("Reshape", [x + "_e", x + "_res"], [x + "_r"])]
    nodes.append(helper.make_node("Attention", ["q", "k_r", "v_r", "mask"], ["y"]))
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", "hq", "s", D]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, ["b", 2, "t", D]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, ["b", 2, "t", D]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["s", "t"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10).SerializeToString()


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 1, 33), (2, 5, 12)])
@pytest.mark.parametrize("q_mul", [1, 2])
def test_attention_repeat_kv_fusion_matches_onnxruntime(shape, q_mul: int) -> None:
    """q_mul 2 feeds q twice the expanded heads (not repeat_kv's grouping): the fused node
    runs the chain and still matches."""
    data = _repeat_kv()
    b, s, t = shape
    rng = np.random.default_rng(t + q_mul)
    feeds = {"q": rng.standard_normal((b, 6 * q_mul, s, D)).astype(np.float32),
             "k": rng.standard_normal((b, 2, t, D)).astype(np.float32),
             "v": rng.standard_normal((b, 2, t, D)).astype(np.float32),
             "mask": np.triu(np.full((s, t), -np.inf, np.float32), k=t - s + 1)}
    ours = InferenceSession(data, threads=1, profile=True)
    ops = _ops_run(ours, feeds)
    assert "AttentionRepeatKV" in ops and "Expand" not in ops and "Unsqueeze" not in ops
    got = ours.run(None, feeds)[0]
    want = _ort(data).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _gelu_tanh() -> bytes:
    """GPT-2's gelu_new as torch.onnx and optimum write it: 0.5*x*(1 + tanh(sqrt(2/pi)*(x +
    0.044715*x**3))) as Pow, Mul, Add, Mul, Tanh, Add, Mul, Mul."""
    inits = {"e": np.array(3, np.float32), "c1": np.array(0.044715, np.float32),
             "c2": np.array(np.sqrt(2 / np.pi), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"]),
             helper.make_node("Mul", ["p", "c1"], ["m1"]),
             helper.make_node("Add", ["x", "m1"], ["a"]),
             helper.make_node("Mul", ["a", "c2"], ["m2"]),
             helper.make_node("Tanh", ["m2"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["a2"]),
             helper.make_node("Mul", ["x", "half"], ["h"]),
             helper.make_node("Mul", ["h", "a2"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", F])], ["y"], inits)


@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (3, 0)])
def test_gelu_tanh_fusion_matches_onnxruntime(shape) -> None:
    data = _gelu_tanh()
    x = np.random.default_rng(sum(shape)).standard_normal((*shape, F)).astype(np.float32) * 4
    ours = InferenceSession(data, threads=1, profile=True)
    ops = _ops_run(ours, {"x": x})
    assert "GeluTanhChain" in ops and "Tanh" not in ops and "Pow" not in ops
    got = ours.run(None, {"x": x})[0]
    want = _ort(data).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if x.size:  # the definition, in float64
        xd = x.astype(np.float64)
        ref = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shapes", [((1, 4, 1, D), (1, 4, 37, D)), ((2, 4, 5, D), (1, 4, 9, D)), ((3, D), (5, D))])
def test_matmul_transb_fusion_matches_onnxruntime(shapes) -> None:
    """MatMul(a, Transpose(b)) over b's last two axes (decomposed attention's q x k^T) runs as one
    product reading b transposed in place."""
    (sa, sb) = shapes
    perm = list(range(len(sb) - 2)) + [len(sb) - 1, len(sb) - 2]
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=perm), helper.make_node("MatMul", ["a", "bt"], ["y"])]
    data = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                          helper.make_tensor_value_info("b", TensorProto.FLOAT, None)], ["y"], {})
    rng = np.random.default_rng(len(sb))
    feeds = {"a": rng.standard_normal(sa).astype(np.float32), "b": rng.standard_normal(sb).astype(np.float32)}
    ours = InferenceSession(data, threads=1, profile=True)
    ops = _ops_run(ours, feeds)
    assert "MatMulTransB" in ops and "Transpose" not in ops
    got = ours.run(None, feeds)[0]
    want = _ort(data).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
