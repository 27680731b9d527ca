"""onnxruntime fidelity of the session surface: SessionOptions, providers,
get_modelmeta, and the parts onnxruntime has that are not provided here."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_light_kv as olkv
from onnx_light_kv import _session_options

ort = pytest.importorskip("onnxruntime")


def _model(with_meta: bool = True) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny_relu", [x], [y],
                          doc_string="graph doc")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], producer_name="meta-test",
                          producer_version="7.1")
    m.ir_version = 10
    if with_meta:
        m.domain = "org.example"
        m.doc_string = "a one-node model"
        m.model_version = 42
        helper.set_model_props(m, {"author": "nobody", "license": "Apache-2.0", "empty": ""})
    return m.SerializeToString()


# -- SessionOptions ------------------------------------------------------------------------

def test_session_options_names_and_defaults_match_onnxruntime() -> None:
    ours, theirs = olkv.SessionOptions(), ort.SessionOptions()
    for name in _session_options._OPTIONS:
        assert hasattr(theirs, name), f"{name} is not an onnxruntime SessionOptions attribute"
        want = getattr(theirs, name)
        got = getattr(ours, name)
        assert int(got) == int(want) if not isinstance(want, str) else got == want, name
    # every plain (non-method) attribute of onnxruntime's SessionOptions is known here
    ort_attrs = {n for n in dir(theirs) if not n.startswith("_") and not callable(getattr(theirs, n))}
    assert ort_attrs <= set(_session_options._OPTIONS), sorted(ort_attrs - set(_session_options._OPTIONS))


@pytest.mark.parametrize("name", ["graph_optimisation_level", "num_threads", "foo", "extra"])
def test_unknown_option_raises_attribute_error(name: str) -> None:
    so = olkv.SessionOptions()
    with pytest.raises(AttributeError, match=name):
        setattr(so, name, 1)


@pytest.mark.parametrize("name,value,exc", [
    ("intra_op_num_threads", -1, ValueError),
    ("intra_op_num_threads", 1.5, TypeError),
    ("intra_op_num_threads", "2", TypeError),
    ("intra_op_num_threads", True, TypeError),
    ("enable_profiling", 2, TypeError),
    ("graph_optimization_level", 7, ValueError),
    ("execution_mode", 5, ValueError),
    ("logid", 3, TypeError),
])
def test_bad_option_values(name: str, value: object, exc: type) -> None:
    so = olkv.SessionOptions()
    with pytest.raises(exc):
        setattr(so, name, value)


def test_known_unsupported_options_are_accepted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    so = olkv.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # onnxruntime's enum is accepted
    so.execution_mode = olkv.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 4
    so.enable_mem_pattern = False
    so.add_session_config_entry("session.disable_prepacking", "1")
    assert so.get_session_config_entry("session.disable_prepacking") == "1"
    with pytest.raises(KeyError):
        so.get_session_config_entry("missing")
    assert so.graph_optimization_level is olkv.GraphOptimizationLevel.ORT_DISABLE_ALL
    r = repr(so)
    assert "ORT_DISABLE_ALL" in r and "inter_op_num_threads=4" in r and len(r) < 300
    with caplog.at_level(logging.INFO, logger="onnx_light_kv"):
        sess = olkv.InferenceSession(_model(), so)
    text = caplog.text
    for name in ("graph_optimization_level", "execution_mode", "inter_op_num_threads", "enable_mem_pattern",
                 "session.disable_prepacking"):
        assert name in text
    assert sess.get_session_options() is so
    x = np.array([[-1.0, 0.5, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_applied_options() -> None:
    so = olkv.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    sess = olkv.InferenceSession(_model(), so)
    sess.run(None, {"x": np.ones((2, 3), np.float32)})
    assert "events" in sess.last_run_stats and sess.last_run_stats["events"]
    assert "threads=1" in repr(sess)


@pytest.mark.parametrize("method,args", [("register_custom_ops_library", ("lib.so",)),
                                         ("add_initializer", ("w", None)),
                                         ("add_external_initializers", (["w"], [None])),
                                         ("add_free_dimension_override_by_name", ("n", 4)),
                                         ("add_free_dimension_override_by_denotation", ("DATA_BATCH", 4))])
def test_unsupported_methods_raise_not_implemented(method: str, args: tuple) -> None:
    with pytest.raises(NotImplementedError, match=method):
        getattr(olkv.SessionOptions(), method)(*args)


def test_sess_options_must_be_ours() -> None:
    with pytest.raises(TypeError, match="SessionOptions"):
        olkv.InferenceSession(_model(), ort.SessionOptions())


# -- providers -----------------------------------------------------------------------------

def test_cpu_provider_is_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = olkv.InferenceSession(_model(), providers=["CPUExecutionProvider"])
        sess2 = olkv.InferenceSession(_model(), providers=[("CPUExecutionProvider", {})], provider_options=None)
    assert sess.get_providers() == sess2.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}


def test_other_provider_warns_once_and_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    _session_options._warned.discard("CUDAExecutionProvider")
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider.*CPU"):
        with caplog.at_level(logging.WARNING, logger="onnx_light_kv"):
            sess = olkv.InferenceSession(_model(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert "CUDAExecutionProvider" in caplog.text
    assert sess.get_providers() == ["CPUExecutionProvider"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no warning
        olkv.InferenceSession(_model(), providers=[("CUDAExecutionProvider", {"device_id": 0})])


@pytest.mark.parametrize("providers,options,exc", [
    ("CPUExecutionProvider", None, TypeError),
    ([3], None, TypeError),
    ([("CPUExecutionProvider", "x")], None, TypeError),
    (["CPUExecutionProvider"], [{}, {}], ValueError),
])
def test_bad_providers(providers: object, options: object, exc: type) -> None:
    with pytest.raises(exc):
        olkv.InferenceSession(_model(), providers=providers, provider_options=options)


# -- metadata ------------------------------------------------------------------------------

@pytest.mark.parametrize("with_meta", [True, False])
def test_modelmeta_matches_onnxruntime(with_meta: bool) -> None:
    data = _model(with_meta)
    ours = olkv.InferenceSession(data).get_modelmeta()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).get_modelmeta()
    for name in ("producer_name", "graph_name", "graph_description", "domain", "description",
                 "custom_metadata_map"):
        assert getattr(ours, name) == getattr(theirs, name), name
    # an unset model_version: 0 here, onnxruntime's sentinel 2**63 - 1 there
    assert ours.version == (theirs.version if with_meta else 0)
    assert ours.producer_version == "7.1" and ours.ir_version == 10 and ours.opsets == {"ai.onnx": 21}
    r = repr(ours)
    assert "meta-test" in r and "tiny_relu" in r and len(r) < 200
    if with_meta:
        assert ours.custom_metadata_map == {"author": "nobody", "license": "Apache-2.0", "empty": ""}
        assert "<3 keys>" in r


def test_io_binding_names_the_alternative() -> None:
    with pytest.raises(NotImplementedError, match="without a copy"):
        olkv.InferenceSession(_model()).io_binding()


def test_modelmeta_from_a_file(tmp_path) -> None:
    p = tmp_path / "m.onnx"
    p.write_bytes(_model())
    meta = olkv.InferenceSession(str(p)).get_modelmeta()
    assert meta.custom_metadata_map["author"] == "nobody" and meta.version == 42
    assert onnx.load(str(p)).model_version == 42


@pytest.mark.parametrize("clone", ["pickle", "copy", "deepcopy"])
def test_session_options_pickle_and_copy(clone: str) -> None:
    """SessionOptions are plain values: pickling and copies keep every option and config entry,
    and a copy's entries are its own."""
    import copy
    import pickle

    so = olkv.SessionOptions()
    so.intra_op_num_threads = 2
    so.graph_optimization_level = olkv.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    c = {"pickle": lambda x: pickle.loads(pickle.dumps(x)), "copy": copy.copy, "deepcopy": copy.deepcopy}[clone](so)
    assert c.intra_op_num_threads == 2
    assert c.graph_optimization_level == olkv.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert c.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    c.add_session_config_entry("other", "1")
    with pytest.raises(KeyError):
        so.get_session_config_entry("other")
