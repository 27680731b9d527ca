"""Output buffers of ``InferenceSession.run``: lent outputs (large ones wrap the Go buffer
instead of being copied) keep their values while Python holds them, whatever later runs
do, and go back to the session's buffer pool once the array and all its views are gone.
"""

from __future__ import annotations

import gc

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_light_kv
from onnx_light_kv import _lib
from onnx_light_kv.session import LEND_MIN_BYTES

ROWS = LEND_MIN_BYTES // (4 * 64) * 2  # y is twice the lending threshold


def _model(dtype: int = TensorProto.FLOAT) -> bytes:
    """y = (x + 1) * 2 (large), s = ReduceSum(x) (small, always copied)."""
    np_dt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["a"]), helper.make_node("Mul", ["a", "two"], ["y"]),
         helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
        "pool",
        [helper.make_tensor_value_info("x", dtype, ["n", 64])],
        [helper.make_tensor_value_info("y", dtype, ["n", 64]), helper.make_tensor_value_info("s", dtype, [])],
        [numpy_helper.from_array(np.array([1], np_dt), "one"), numpy_helper.from_array(np.array([2], np_dt), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _lent() -> int:
    return int(_lib.call(_lib.fn("LentOutputs")))


def test_held_outputs_keep_their_values() -> None:
    sess = onnx_light_kv.InferenceSession(_model(), threads=1)
    base = _lent()
    x = np.arange(ROWS * 64, dtype=np.float32).reshape(ROWS, 64) % 97
    y0, s0 = sess.run(None, {"x": x})
    assert y0.nbytes >= LEND_MIN_BYTES and _lent() == base + 1  # y lent, s copied
    np.testing.assert_array_equal(y0, (x + 1) * 2)
    assert float(s0) == float(x.sum(dtype=np.float32))
    keep = y0[3:7]  # a view keeps the buffer alive too
    expected = keep.copy()
    del y0
    gc.collect()
    for k in range(5):
        y, _ = sess.run(None, {"x": x + k})
        np.testing.assert_array_equal(y, (x + k + 1) * 2)
        np.testing.assert_array_equal(keep, expected)
    del y, keep
    gc.collect()
    assert _lent() == base
    sess.close()


def test_outputs_fed_back_as_inputs() -> None:
    sess = onnx_light_kv.InferenceSession(_model(), threads=2)
    x = np.zeros((ROWS, 64), np.float32)
    want = np.zeros_like(x)
    for _ in range(6):  # each output is the next run's feed, like present -> past
        x, _ = sess.run(["y", "s"], {"x": x})
        want = (want + 1) * 2
        np.testing.assert_array_equal(x, want)
    assert x.flags.writeable and x.flags.c_contiguous


def test_lent_output_outlives_session() -> None:
    sess = onnx_light_kv.InferenceSession(_model(), threads=1)
    x = np.ones((ROWS, 64), np.float32)
    (y,) = sess.run(["y"], {"x": x})
    sess.close()
    gc.collect()
    np.testing.assert_array_equal(y, np.full_like(x, 4))


def test_small_and_16_bit_outputs() -> None:
    sess = onnx_light_kv.InferenceSession(_model(TensorProto.FLOAT16), threads=1)
    x = np.ones((ROWS, 64), np.float16)
    y, s = sess.run(None, {"x": x})
    assert y.dtype == np.float16 and s.dtype == np.float16
    np.testing.assert_array_equal(y, np.full_like(x, 4))
    small = np.ones((2, 64), np.float16)
    y2, _ = sess.run(None, {"x": small})
    np.testing.assert_array_equal(y2, np.full_like(small, 4))
    np.testing.assert_array_equal(y, np.full_like(x, 4))
