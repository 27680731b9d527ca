"""Attention opset 25+ (sliding windows) and the masking conventions of each opset vs onnxruntime.

Opset 25 adds ``left_window_size`` / ``right_window_size``: query row i at absolute position
p = i + offset attends keys p - left .. p + right (-1 leaves a side unbounded). onnxruntime's
opset-25 kernel also changes two conventions that our runtime follows per opset:

* excluded positions (bool mask, causal, window, nonpad) score -inf in ``qk_matmul_output``
  mode 2 (opset 23/24: the lowest float32);
* only a row whose scores are all -inf is zeroed; a float mask of the lowest float32 on a
  whole row gives a uniform row (opset 23/24: zero row).

The grid crosses window shapes x causal x past x mask kind x qk output mode x 3D/4D layout
(GQA, 2 batches) at small sizes; tolerances as in test_attention_vs_ort.py for float32.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Dict, List, Tuple

import numpy as np
import pytest
from onnx import TensorProto, helper

import _ort_compare as oc

RTOL, ATOL = 1e-4, 1e-5
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.bool_): TensorProto.BOOL,
          np.dtype(np.int64): TensorProto.INT64}
_INPUTS = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]


def _model(attrs: Dict, feeds: Dict[str, np.ndarray], opset: int) -> Tuple[object, List[str]]:
    used = [n if n in feeds else "" for n in _INPUTS]
    while used[-1] == "":
        used.pop()
    outs = ["Y", "present_key", "present_value", "qk"] if "past_key" in feeds else ["Y", "", "", "qk"]
    node = helper.make_node("Attention", used, outs, **attrs)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, _TYPES[feeds[n].dtype], None) for n in used if n],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, [o for o in outs if o]


WINDOWS = [(-1, -1), (2, -1), (0, 1), (-1, 0), (3, 2)]
GRID = list(itertools.product(WINDOWS, (0, 1), (0, 3), (None, "bool", "float"), (0, 2, 3), ("4d", "3d")))


@pytest.mark.parametrize("window,causal,past,mask,mode,layout", GRID,
                         ids=["-".join(map(str, c)) for c in GRID])
def test_sliding_window_matches_onnxruntime(window, causal, past, mask, mode, layout) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((window, causal, past, mask, mode, layout)).encode()))
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    b, hq, hkv, s, l, d = 2, 4, 2, 5, 5, 8
    attrs = {"left_window_size": window[0], "right_window_size": window[1], "is_causal": causal,
             "qk_matmul_output_mode": mode}
    if layout == "4d":
        feeds = {"Q": f(b, hq, s, d), "K": f(b, hkv, l, d), "V": f(b, hkv, l, d)}
    else:
        feeds = {"Q": f(b, s, hq * d), "K": f(b, l, hkv * d), "V": f(b, l, hkv * d)}
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    total = l + past
    if mask == "bool":
        feeds["attn_mask"] = rng.random((b, 1, s, total)) > 0.3
    elif mask == "float":
        feeds["attn_mask"] = f(s, total)
    if past:
        feeds["past_key"], feeds["past_value"] = f(b, hkv, past, d), f(b, hkv, past, d)
    model, names = _model(attrs, feeds, 25)
    oc.compare_runs(model, feeds, RTOL, ATOL, output_names=names)


@pytest.mark.parametrize("opset", [23, 24, 25])
def test_fully_masked_rows_follow_each_opset(opset: int) -> None:
    rng = np.random.default_rng(opset)
    feeds = {n: rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for n in "QKV"}
    mask = np.zeros((3, 3), np.float32)
    mask[1, :] = np.finfo(np.float32).min  # opset 23/24: zero row; 25: uniform row
    mask[2, :] = -np.inf  # zero row in every opset
    feeds["attn_mask"] = mask
    model, names = _model({"qk_matmul_output_mode": 3}, feeds, opset)
    oc.compare_runs(model, feeds, RTOL, ATOL, output_names=names)


@pytest.mark.parametrize("opset", [24, 25])
def test_nonpad_with_window_and_causal(opset: int) -> None:
    rng = np.random.default_rng(7)
    feeds = {"Q": rng.standard_normal((2, 2, 2, 4)).astype(np.float32),
             "K": rng.standard_normal((2, 2, 6, 4)).astype(np.float32),
             "V": rng.standard_normal((2, 2, 6, 4)).astype(np.float32),
             "nonpad_kv_seqlen": np.array([3, 6], np.int64)}
    attrs = {"is_causal": 1, "qk_matmul_output_mode": 2}
    if opset >= 25:
        attrs["left_window_size"] = 1
    model, names = _model(attrs, feeds, opset)
    oc.compare_runs(model, feeds, RTOL, ATOL, output_names=names)
