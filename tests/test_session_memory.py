"""A session holds a model's weights about once: the packed ones are released once packed and model
files are mapped (see the README's memory table; ``benchmarks/bench_memory.py`` measures it against
onnxruntime). Measured in a fresh child process, Linux only."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv import models

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

_CHILD = r"""
import json, sys
import numpy as np
import onnx_light_kv as olkv

def rss():
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f if ":" in line)
    return int(d["VmRSS"].split()[0]) * 1024

before = rss()
s = olkv.InferenceSession(sys.argv[1], threads=1)
after = rss()
feeds = {"input_ids": np.array([[3, 5]], np.int64), "position_ids": np.array([[0, 1]], np.int64)}
for i in s.get_inputs():
    if i.name.startswith("past"):
        feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
logits = s.run(None, feeds)[0]
print(json.dumps({"growth": after - before, "logits": logits[0, -1, :8].tolist()}))
"""


@pytest.mark.parametrize("external", [False, True], ids=["one-file", "external-data"])
def test_session_holds_weights_about_once(tmp_path: Any, external: bool) -> None:
    cfg = models.DecoderConfig(layers=2, hidden=512, q_heads=8, kv_heads=2, head_dim=64, vocab=8192)
    model = models.build("llama", cfg)
    path = str(tmp_path / "m.onnx")
    models.save_model(model, path, external_data=external)
    size = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    assert size > 40e6
    out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # Before weights were released once packed, the session grew by 2.2-2.6x the file (the
    # initializers, their packs and the file's bytes); now by about 1x (packs, the embedding).
    assert r["growth"] < 1.5 * size, (r["growth"], size)
    # The step reads the packs and the mapped weights right: its logits equal those of a session
    # over the same weights loaded from bytes (nothing mapped).

    ref = olkv.InferenceSession(models.model_bytes(models.build("llama", cfg)), threads=1)  # same weights
    feeds = {"input_ids": np.array([[3, 5]], np.int64), "position_ids": np.array([[0, 1]], np.int64)}
    for i in ref.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    np.testing.assert_array_equal(np.array(r["logits"], np.float32), ref.run(None, feeds)[0][0, -1, :8])


@pytest.mark.parametrize("external", [False, True], ids=["one-file", "external-data"])
def test_unmapped_files_may_be_rewritten_under_a_live_session(tmp_path: Any, external: bool) -> None:
    """With ``olkv.map_model_files`` = "0" the files are read, not mapped: truncating them while the
    session lives (which would fault a mapping) leaves its runs unchanged."""
    cfg = models.DecoderConfig(layers=1, hidden=512, q_heads=8, kv_heads=2, head_dim=64, vocab=16384)
    path = str(tmp_path / "m.onnx")
    models.save_model(models.build("llama", cfg), path, external_data=external)
    assert sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path)) > 32 << 20
    so = olkv.SessionOptions()
    so.add_session_config_entry("olkv.map_model_files", "0")
    sess = olkv.InferenceSession(path, so, threads=1)
    feeds = {"input_ids": np.array([[3, 5]], np.int64), "position_ids": np.array([[0, 1]], np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    before = sess.run(None, feeds)[0]
    for f in os.listdir(tmp_path):
        with open(tmp_path / f, "r+b") as fh:
            fh.truncate(0)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], before)


def test_map_model_files_entry_is_checked() -> None:
    so = olkv.SessionOptions()
    with pytest.raises(ValueError, match="map_model_files"):
        so.add_session_config_entry("olkv.map_model_files", "yes")
    so.add_session_config_entry("olkv.map_model_files", "1")
    assert so._map_model_files()
    so.add_session_config_entry("olkv.map_model_files", "0")
    assert not so._map_model_files()


def _mappings(files: Any) -> int:
    """Mappings of any of ``files`` in this process (deleted or not)."""
    names = {os.fspath(f) for f in files}
    n = 0
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.rstrip("\n").removesuffix(" (deleted)").split(maxsplit=5)[-1]
            n += path in names
    return n


@pytest.mark.parametrize("external", [False, True], ids=["one-file", "external-data"])
def test_sessions_give_back_their_files(tmp_path: Any, external: bool) -> None:
    """Closing or collecting a session unmaps its model's files: sessions made and dropped in a loop
    hold no mappings (each one's stayed until the process exited before), and a file deleted under a
    live session leaves no mapping once the session is closed."""
    cfg = models.DecoderConfig(layers=1, hidden=512, q_heads=8, kv_heads=2, head_dim=64, vocab=16384)
    path = tmp_path / "m.onnx"
    models.save_model(models.build("llama", cfg), str(path), external_data=external)
    files = [tmp_path / f for f in os.listdir(tmp_path)]
    assert sum(os.path.getsize(f) for f in files) > 32 << 20  # above the mapping threshold
    feeds = {"input_ids": np.array([[3, 5]], np.int64), "position_ids": np.array([[0, 1]], np.int64)}
    want = None
    for i in range(4):
        sess = olkv.InferenceSession(str(path), threads=1)
        assert _mappings(files) >= 1, "the model's file is not mapped"
        f = dict(feeds)
        for inp in sess.get_inputs():
            if inp.name.startswith("past"):
                f[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
        got = sess.run(None, f)[0]
        if want is None:
            want = got
        np.testing.assert_array_equal(got, want)
        if i % 2:
            sess.close()
        else:
            del sess  # collected: __del__ closes it
            gc.collect()
        assert _mappings(files) == 0, f"session {i}: its mappings outlive it"
    sess = olkv.InferenceSession(str(path), threads=1)
    for f in files:
        os.remove(f)
    assert _mappings(files) >= 1
    sess.close()
    assert _mappings(files) == 0, "a deleted model file stays mapped after close"


_OOM_CHILD = r"""
import re, resource
import numpy as np
from onnx import TensorProto, helper
import onnx_light_kv as olkv

size = int(re.search(r"VmSize:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
# 4 GiB of address space left: a stand-in for a container's limit or a busy machine
resource.setrlimit(resource.RLIMIT_AS, (size + (4 << 30), resource.RLIM_INFINITY))
value = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
g = helper.make_graph([helper.make_node("ConstantOfShape", ["s"], ["y"], value=value)], "g",
                      [helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
sess = olkv.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
try:
    sess.run(None, {"s": np.array([3 << 30], np.int64)})  # 12 GiB: under the per-tensor limit of RAM size
    print("no error")
except MemoryError as e:
    print("MemoryError", "not enough memory" in str(e))
print(sess.run(None, {"s": np.array([4], np.int64)})[0].tolist())
"""


def test_tensor_beyond_available_memory_raises_memory_error() -> None:
    """A tensor under the per-tensor limit (the machine's RAM) but beyond what the process can still
    get (here an address-space limit) raises ``MemoryError`` instead of ending the process (the Go
    heap's out-of-memory is fatal), and the session keeps working."""
    out = subprocess.run([sys.executable, "-c", _OOM_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["MemoryError True", "[1.0, 1.0, 1.0, 1.0]"], out.stdout


def test_tensor_beyond_the_per_tensor_limit_raises_memory_error() -> None:
    """A tensor over the per-tensor limit (by default the machine's physical memory) is a memory
    error too, as the README says: MemoryError, not ValueError; the session keeps working."""
    from onnx import TensorProto, helper

    value = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    g = helper.make_graph([helper.make_node("ConstantOfShape", ["s"], ["y"], value=value)], "g",
                          [helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    sess = olkv.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(MemoryError, match="over the per-tensor limit"):
        sess.run(None, {"s": np.array([1 << 40], np.int64)})  # 4 TiB
    assert sess.run(None, {"s": np.array([3], np.int64)})[0].tolist() == [1.0, 1.0, 1.0]
