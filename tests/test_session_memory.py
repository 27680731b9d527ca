"""A session holds a model's weights about once: the packed ones are released once packed and model
files are mapped (see the README's memory table; ``benchmarks/bench_memory.py`` measures it against
onnxruntime). Measured in a fresh child process, Linux only."""

from __future__ import annotations

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
