"""Hostile inputs at the boundary: bounded model reading, refused opsets."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_light_kv as olkv

_MIB = 1 << 20


def _identity_model(opsets: list[tuple[str, int]]) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10)
    return model.SerializeToString()


# -- bounded model reading -----------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_device_fails_fast_with_bounded_memory(device: str) -> None:
    """Reading a device never trusts its Stat() size (0): the read stops on the
    first bytes that cannot start a ModelProto, or at the size limit. Run in a
    child interpreter so the peak RSS it reports is this load's alone."""
    if not os.path.exists(device):
        pytest.skip(f"{device} is missing")
    child = textwrap.dedent(f"""
        import resource, sys, time
        import onnx_light_kv as olkv
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        try:
            olkv.InferenceSession({device!r})
        except ValueError as e:
            kind = "ValueError: " + str(e)
        except BaseException as e:
            kind = type(e).__name__ + ": " + str(e)
        else:
            kind = "loaded"
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(kind.splitlines()[0])
        print(grew * 1024)
        print(time.perf_counter() - t)
    """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    kind, grew, took = r.stdout.strip().splitlines()[-3:]
    assert kind.startswith("ValueError: "), kind
    assert device in kind
    assert int(grew) < 64 * _MIB, f"peak RSS grew by {int(grew) / _MIB:.0f} MiB"
    assert float(took) < 30


def test_model_through_a_pipe_loads(tmp_path) -> None:
    """Non-regular files are read up to EOF: a model streamed through a named pipe loads."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes")
    data = _identity_model([("", 17)])
    fifo = tmp_path / "model.pipe"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "wb") as f:
            for i in range(0, len(data), 5):
                f.write(data[i:i + 5])
                f.flush()

    t = threading.Thread(target=writer)
    t.start()
    try:
        sess = olkv.InferenceSession(str(fifo))
    finally:
        t.join(timeout=30)
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)


@pytest.mark.parametrize("domain,version,newest", [("", 99, 25), ("ai.onnx", 26, 25),
                                                   ("com.microsoft", 2, 1), ("ai.onnx.ml", 6, 5)])
def test_newer_opset_is_refused_naming_both_versions(domain: str, version: int, newest: int) -> None:
    opsets = [("", 17), (domain, version)] if domain not in ("", "ai.onnx") else [(domain, version)]
    with pytest.raises(NotImplementedError) as ei:
        olkv.InferenceSession(_identity_model(opsets))
    msg = str(ei.value)
    assert f"opset {version}" in msg and f"up to {newest}" in msg, msg


@pytest.mark.parametrize("opsets", [[("", 25)], [("", 13), ("com.microsoft", 1)], [("", 17), ("ai.onnx.ml", 5)]])
def test_known_opsets_load(opsets: list[tuple[str, int]]) -> None:
    olkv.InferenceSession(_identity_model(opsets))
