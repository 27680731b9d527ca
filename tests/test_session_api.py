"""The onnxruntime-like surface of ``onnx_light_kv.InferenceSession`` itself:
NodeArg metadata, output selection, dtypes in and out, run statistics,
lifetime. (Differential correctness lives in test_ops_vs_ort.py and the
model suites; error classes in test_session_errors.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

session = pytest.importorskip("onnx_light_kv.session")
InferenceSession = session.InferenceSession


def _model(nodes: Any, inputs: Any, outputs: Any, inits: Any = ()) -> bytes:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10).SerializeToString()


def _cast_model() -> bytes:
    return _model([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                   helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
                   helper.make_node("Equal", ["i", "j"], ["eq"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
                   helper.make_tensor_value_info("i", TensorProto.INT64, [None]),
                   helper.make_tensor_value_info("j", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("h", TensorProto.FLOAT16, ["batch", 3]),
                   helper.make_tensor_value_info("b", TensorProto.BFLOAT16, ["batch", 3]),
                   helper.make_tensor_value_info("eq", TensorProto.BOOL, [None])])


def test_node_args_like_onnxruntime() -> None:
    sess = InferenceSession(_cast_model(), threads=1)
    ins = {a.name: a for a in sess.get_inputs()}
    assert list(ins) == ["x", "i", "j"]
    assert ins["x"].type == "tensor(float)" and ins["x"].shape == ["batch", 3]
    assert ins["i"].type == "tensor(int64)" and ins["i"].shape == [None]
    outs = sess.get_outputs()
    assert [(o.name, o.type) for o in outs] == [("h", "tensor(float16)"), ("b", "tensor(bfloat16)"), ("eq", "tensor(bool)")]


def test_dtypes_out_and_output_selection() -> None:
    sess = InferenceSession(_cast_model(), threads=1)
    x = np.array([[1.5, -2.0, 3.25]], np.float32)
    feeds = {"x": x, "i": np.array([1, 2, 3]), "j": np.array([2])}
    h, b, eq = sess.run(None, feeds)
    assert h.dtype == np.float16 and np.array_equal(h, x.astype(np.float16))
    assert str(b.dtype) == "bfloat16" and np.array_equal(b.astype(np.float32), x)
    assert eq.dtype == np.bool_ and eq.tolist() == [False, True, False]
    (only,) = sess.run(["eq"], feeds)
    assert only.tolist() == [False, True, False]


def test_outputs_are_fresh_arrays_not_views_of_feeds() -> None:
    sess = InferenceSession(_model([helper.make_node("Identity", ["x"], ["y"])],
                                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    x = np.array([1, 2], np.float32)
    (y,) = sess.run(None, {"x": x})
    x[0] = 99
    assert y.tolist() == [1, 2]


def test_run_stats_and_profiling() -> None:
    w = numpy_helper.from_array(np.ones((4,), np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "a"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    sess = InferenceSession(m, threads=1, profile=True)
    (y,) = sess.run(None, {"x": np.arange(4, dtype=np.float32)})
    assert y.tolist() == [1, 4, 9, 16]
    st = sess.last_run_stats
    assert st["peak_bytes"] >= 16 and st["allocated_bytes"] == 32
    assert [e["op"] for e in st["events"]] == ["Add", "Mul"]


def test_path_and_context_manager(tmp_path: Any) -> None:
    p = tmp_path / "m.onnx"
    p.write_bytes(_cast_model())
    with InferenceSession(str(p)) as sess:
        assert len(sess.get_outputs()) == 3
    with pytest.raises(ValueError):
        sess.run(None, {})
    sess.close()  # closing twice is fine


def test_unsupported_feed_dtype_is_type_error() -> None:
    sess = InferenceSession(_cast_model())
    with pytest.raises(TypeError, match="x"):
        sess.run(None, {"x": np.ones((1, 3), np.complex64), "i": np.array([1]), "j": np.array([1])})


def test_session_refuses_pickling_and_copies() -> None:
    """A session owns its model through a handle valid in one process: a copy used to share the
    handle (collecting the copy closed the original) and a pickle carried the bare number."""
    import copy
    import gc
    import pickle

    sess = InferenceSession(_cast_model(), threads=1)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError, match="InferenceSession cannot be pickled: it holds native memory"):
            pickle.dumps(sess, protocol=protocol)
    for fn in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="InferenceSession cannot be copied"):
            fn(sess)
    gc.collect()
    h, b, eq = sess.run(None, {"x": np.ones((1, 3), np.float32), "i": np.array([2]), "j": np.array([2])})
    assert not sess.closed and eq.tolist() == [True]
