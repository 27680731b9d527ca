"""Bad models and bad feeds raise clear Python exceptions from our InferenceSession.

Contract checked here (the onnxruntime-like API of ``onnx_light_kv.InferenceSession``):

=================================  =========================================  ===================
situation                          exception                                  message names
=================================  =========================================  ===================
feed missing a required input      ValueError                                 the input
feed of the wrong element type     TypeError or ValueError                    the input
feed of the wrong rank / fixed dim ValueError                                 the input
unknown feed or output name        ValueError                                 the name
feed or output name not a str      TypeError                                  the name
op without a kernel                NotImplementedError at session creation    op, domain, version
cyclic graph                       ValueError at session creation             --
node input never produced          ValueError at session creation             the value
truncated / garbage model bytes    ValueError                                 --
model path that does not exist     FileNotFoundError (like open/onnx.load)    --
=================================  =========================================  ===================

A session stays usable after a failed run, and results do not depend on ``threads``.
"""

from __future__ import annotations

from typing import Any, Sequence, Type, Union

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import _ort_compare as oc

if oc.os.environ.get("ONNX_LIGHT_KV_SELFTEST_ORT", "") not in ("", "0"):
    pytest.skip("harness self-check: onnxruntime raises its own exception classes", allow_module_level=True)


def _add_model(shape: Sequence[Any] = ("n", 4)) -> onnx.ModelProto:
    """y = x + w with x float32 [n, 4]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def _raises(exc: Union[Type[BaseException], tuple], fn: Any, *names: str) -> BaseException:
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for n in names:
        assert n in msg, f"error message {msg!r} does not name {n!r}"
    return info.value


X = np.ones((2, 4), np.float32)


def test_missing_input_is_value_error() -> None:
    sess = oc.ours(_add_model())
    _raises(ValueError, lambda: sess.run(None, {}), "x")


def test_wrong_dtype_is_type_or_value_error() -> None:
    sess = oc.ours(_add_model())
    _raises((TypeError, ValueError), lambda: sess.run(None, {"x": X.astype(np.float64)}), "x")
    _raises((TypeError, ValueError), lambda: sess.run(None, {"x": X.astype(np.int64)}), "x")


def test_wrong_rank_and_fixed_dim_are_value_errors() -> None:
    sess = oc.ours(_add_model())
    _raises(ValueError, lambda: sess.run(None, {"x": np.ones((2, 4, 1), np.float32)}), "x")
    _raises(ValueError, lambda: sess.run(None, {"x": np.ones((2, 5), np.float32)}), "x")


def test_unknown_feed_and_output_names_are_value_errors() -> None:
    sess = oc.ours(_add_model())
    _raises(ValueError, lambda: sess.run(["nope"], {"x": X}), "nope")
    _raises(ValueError, lambda: sess.run(None, {"x": X, "extra": X}), "extra")


def test_feed_and_output_names_of_another_type_are_type_errors() -> None:
    sess = oc.ours(_add_model())
    _raises(TypeError, lambda: sess.run([0], {"x": X}), "output_names", "0")
    _raises(TypeError, lambda: sess.run(None, {b"x": X}), "input_feed", "b'x'")
    assert sess.run(None, {"x": X})[0].shape == (2, 4)


def test_session_survives_a_failed_run_and_accepts_views() -> None:
    sess = oc.ours(_add_model())
    with pytest.raises(ValueError):
        sess.run(None, {})
    (y,) = sess.run(None, {"x": X})
    np.testing.assert_array_equal(y, X + np.arange(4, dtype=np.float32))
    strided = np.arange(32, dtype=np.float32).reshape(4, 8)[:, ::2]  # non-contiguous view
    (y,) = sess.run(["y"], {"x": strided})
    np.testing.assert_array_equal(y, strided + np.arange(4, dtype=np.float32))


def test_unknown_op_fails_at_session_creation_naming_it() -> None:
    graph = helper.make_graph([helper.make_node("FrobnicateTensor", ["x"], ["y"], domain="com.example")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.example", 3)],
                              ir_version=10)
    _raises(NotImplementedError, lambda: oc.ours(model), "FrobnicateTensor", "com.example", "3")
    std = helper.make_model(helper.make_graph([helper.make_node("DFT", ["x"], ["y"])], "g",
                                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1])],
                                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
                            opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    _raises(NotImplementedError, lambda: oc.ours(std), "DFT")


def test_cyclic_graph_is_value_error() -> None:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    graph = helper.make_graph(nodes, "cycle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    _raises(ValueError, lambda: oc.ours(model))


def test_dangling_node_input_is_value_error() -> None:
    graph = helper.make_graph([helper.make_node("Add", ["x", "ghost"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    _raises(ValueError, lambda: oc.ours(model), "ghost")


def _one_node(node: Any, outputs: Sequence[str] = ("y",), opset: int = 23) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                            for n in node.input if n],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_malformed_nodes_are_value_errors() -> None:
    """Node-level mistakes of a model are ValueErrors naming the problem: a missing required
    attribute, an attribute value outside its enumeration, a node with no outputs and a node
    declaring more outputs than its op has."""
    _raises(ValueError, lambda: oc.ours(_one_node(helper.make_node("Cast", ["x"], ["y"]))), "'to'")
    _raises(ValueError, lambda: oc.ours(_one_node(helper.make_node("Constant", [], ["y"]))), "value attribute")
    for causal in (2, -1):
        node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=causal)
        _raises(ValueError, lambda: oc.ours(_one_node(node)), "is_causal")
    _raises(ValueError, lambda: oc.ours(_one_node(helper.make_node("Relu", ["x"], []), outputs=["x"])),
            "no outputs")
    sess = oc.ours(_one_node(helper.make_node("Relu", ["x"], ["y", "z"]), outputs=["y", "z"]))
    _raises(ValueError, lambda: sess.run(None, {"x": X}), "output 1", "Relu")


def test_truncated_and_garbage_models_are_value_errors(tmp_path: Any) -> None:
    data = oc.models().llama_decoder(oc.models().DecoderConfig(layers=1)).SerializeToString()
    for cut in (len(data) // 2, len(data) - 3, 7):
        _raises(ValueError, lambda c=cut: oc.ours(data[:c]))
    _raises(ValueError, lambda: oc.ours(b"\xff" * 64))
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 3])
    _raises(ValueError, lambda: oc.ours(str(path)))


def test_missing_path_is_file_not_found(tmp_path: Any) -> None:
    _raises(FileNotFoundError, lambda: oc.ours(str(tmp_path / "absent.onnx")))


def test_results_do_not_depend_on_threads() -> None:
    m = oc.models()
    model = m.llama_decoder(m.DecoderConfig(layers=1, hidden=128, q_heads=4, kv_heads=2, head_dim=32))
    feeds = {"input_ids": np.array([[1, 2, 3, 4, 5]]), "position_ids": np.arange(5)[None, :],
             "past_key_values.0.key": np.zeros((1, 2, 0, 32), np.float32),
             "past_key_values.0.value": np.zeros((1, 2, 0, 32), np.float32)}
    one = oc.ours(model, threads=1).run(None, feeds)
    two = oc.ours(model, threads=2).run(None, feeds)
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _dyn_model(op: str, inputs: Sequence[Any], **attrs: Any) -> onnx.ModelProto:
    """One node whose inputs have only symbolic dims, so shape errors surface inside kernels."""
    vis = [helper.make_tensor_value_info(n, t, [f"{n}_{i}" for i in range(rank)]) for n, t, rank in inputs]
    graph = helper.make_graph([helper.make_node(op, [n for n, _, _ in inputs], ["y"], **attrs)], "g", vis,
                              [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


F, I = TensorProto.FLOAT, TensorProto.INT64
KERNEL_ERRORS = {
    "gather-index-out-of-range": (_dyn_model("Gather", [("d", F, 2), ("i", I, 1)]),
                                  {"d": np.zeros((5, 3), np.float32), "i": np.array([7])},
                                  {"d": np.zeros((5, 3), np.float32), "i": np.array([4])}),
    "reshape-impossible": (_dyn_model("Reshape", [("x", F, 2), ("s", I, 1)]),
                           {"x": np.zeros((2, 3), np.float32), "s": np.array([4, 4])},
                           {"x": np.zeros((2, 3), np.float32), "s": np.array([3, -1])}),
    "matmul-inner-dim": (_dyn_model("MatMul", [("a", F, 2), ("b", F, 2)]),
                         {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 5), np.float32)},
                         {"a": np.zeros((2, 3), np.float32), "b": np.zeros((3, 5), np.float32)}),
    "add-not-broadcastable": (_dyn_model("Add", [("a", F, 2), ("b", F, 2)]),
                              {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 3), np.float32)},
                              {"a": np.zeros((2, 3), np.float32), "b": np.zeros((1, 3), np.float32)}),
    "constantofshape-negative": (_dyn_model("ConstantOfShape", [("s", I, 1)]), {"s": np.array([-1, 3])}, {"s": np.array([2, 3])}),
}


@pytest.mark.parametrize("name", sorted(KERNEL_ERRORS))
def test_kernel_errors_are_value_errors_and_session_survives(name: str) -> None:
    model, bad, good = KERNEL_ERRORS[name]
    sess = oc.ours(model)
    _raises(ValueError, lambda: sess.run(None, bad))
    want = oc.ort(model).run(None, good)
    got = sess.run(None, good)
    np.testing.assert_array_equal(got[0], want[0])


def test_hostile_allocation_fails_cleanly() -> None:
    """A feed asking for a petabyte tensor raises (MemoryError or ValueError), it does not crash."""
    sess = oc.ours(_dyn_model("ConstantOfShape", [("s", I, 1)]))
    _raises((MemoryError, ValueError), lambda: sess.run(None, {"s": np.array([1_000_000, 1_000_000, 1_000])}))
    (y,) = sess.run(None, {"s": np.array([2, 2])})
    assert y.shape == (2, 2)


def test_external_data_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Any) -> None:
    """External data naming a FIFO (or a folder) in the model's folder is a ValueError at load:
    opening a FIFO would wait for a writer forever."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    t = TensorProto()
    t.name, t.data_type, t.data_location = "w", TensorProto.FLOAT, TensorProto.EXTERNAL
    t.dims.append(4)
    e = t.external_data.add()
    e.key, e.value = "location", "weights.bin"
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[t])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                     .SerializeToString())
    os.mkfifo(tmp_path / "weights.bin")
    code = (f"import onnx_light_kv as o\ntry:\n    o.InferenceSession({str(path)!r})\n"
            f"except ValueError as e:\n    print('ValueError', e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "ValueError" in r.stdout and "not a regular file" in r.stdout, r.stdout + r.stderr


def test_a_model_path_the_os_refuses_is_an_os_error(tmp_path: Any) -> None:
    """A symlink loop or a file used as a folder raises OSError, as open() would (it was a
    RuntimeError)."""
    import os

    loop = tmp_path / "loopA"
    os.symlink(tmp_path / "loopB", loop)
    os.symlink(loop, tmp_path / "loopB")
    (tmp_path / "file").write_bytes(b"x")
    for p in (loop, tmp_path / "file" / "model.onnx"):
        with pytest.raises(OSError):
            oc.ours(str(p))


def _mutate_one_input_reshape(m: onnx.ModelProto) -> None:
    for n in m.graph.node:
        if n.name == "node_transpose_1":  # Transpose of the keys -> a Reshape without its shape
            n.op_type = "Reshape"


def _mutate_one_input_matmul(m: onnx.ModelProto) -> None:
    for n in m.graph.node:
        if n.name == "node_MatMul_209":  # the Q.K^T product loses an operand
            del n.input[0]


@pytest.mark.parametrize("fixture,mutate", [("gptj-dynamo", _mutate_one_input_reshape),
                                            ("opt-dynamo", _mutate_one_input_matmul)])
def test_malformed_nodes_in_an_attention_chain_are_no_internal_error(fixture: str, mutate: Any) -> None:
    """A node of the attention chain with too few inputs is not a match for the cache-path
    rewrite (it indexed past the inputs: RuntimeError 'internal error'); the session loads or
    refuses it with ValueError, and its plan reads as usual."""
    import _fixtures as fx

    if fixture not in fx.names():
        pytest.skip(f"fixture {fixture} absent")
    m = onnx.load_from_string(fx.model_bytes(fixture))
    mutate(m)
    try:
        s = oc.ours(m.SerializeToString())
    except (ValueError, NotImplementedError):
        return
    assert isinstance(s.cache_plan(), list)


def test_a_constant_saved_as_external_data_loads_from_its_path(tmp_path: Any) -> None:
    """onnx.save_model(..., save_as_external_data=True, convert_attribute=True) stores a Constant's
    value in the data file too: loaded from the model's path, it reads like an initializer."""
    g = helper.make_graph([helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(
                               np.arange(1024, dtype=np.float32), "cv")),
                           helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                    size_threshold=0, convert_attribute=True)
    got = oc.ours(str(path)).run(None, {"x": np.ones(1024, np.float32)})[0]
    np.testing.assert_array_equal(got, np.arange(1024, dtype=np.float32) + 1)


def test_a_model_path_that_is_not_utf8_is_a_value_error(tmp_path: Any) -> None:
    """A file name with bytes that are not UTF-8 (str with surrogate escapes) gives ValueError
    naming the path (it was a UnicodeEncodeError from the binding)."""
    with pytest.raises(ValueError, match="not valid UTF-8"):
        oc.ours(str(tmp_path) + "/m\udcff.onnx")


def test_value_names_that_are_not_utf8_are_refused_at_load() -> None:
    """Names are text to every caller: bytes that are not UTF-8 would show as U+FFFD (two inputs
    then read alike and neither could be fed)."""
    g = helper.make_graph([helper.make_node("Sub", ["aa", "bb"], ["y"])], "g",
                      [helper.make_tensor_value_info("aa", TensorProto.FLOAT, None), helper.make_tensor_value_info("bb", TensorProto.FLOAT, None)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    with pytest.raises(ValueError, match="not valid UTF-8"):
        oc.ours(raw.replace(b"aa", b"\xff\xff").replace(b"bb", b"\xfe\xfe"))


def test_an_output_of_another_type_than_declared_is_a_type_error() -> None:
    def model(out_type: int) -> bytes:
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", out_type, [7])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()

    sess = oc.ours(model(TensorProto.INT64))
    with pytest.raises(TypeError, match='output "y" is float32, the model declares int64'):
        sess.run(None, {"x": np.ones(2, np.float32)})
    # a declared shape the output does not have is not checked (onnxruntime warns only)
    y = oc.ours(model(TensorProto.FLOAT)).run(None, {"x": -np.ones(2, np.float32)})[0]
    assert y.dtype == np.float32 and y.tolist() == [0.0, 0.0]


def test_a_batch_of_another_size_than_the_state_is_named() -> None:
    import _gen_common as gc
    import onnx_light_kv as olkv

    sess = gc.ours("llama-mask")
    st = sess.create_state(batch=1)
    ids = np.array([[3, 4], [5, 6]])
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.array([[0, 1], [0, 1]])}
    with pytest.raises(ValueError, match=r"input_ids has 2 sequences \(shape \(2, 2\)\); the state holds 1"):
        sess.run(["logits"], feeds, state=st)
    assert st.length == 0
    feeds = {k: v[:1] for k, v in feeds.items()}
    assert np.isfinite(sess.run(["logits"], feeds, state=st)[0]).all() and st.length == 2
    assert isinstance(st, olkv.GenerationState)
