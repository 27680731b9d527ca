"""The package across process boundaries: a forked child gets a clear error instead of a hang
(the Go runtime does not survive fork), and the interpreter exits while daemon threads still run
requests (native handles are not freed at exit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("onnx_light_kv")

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _run(code: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=_ENV)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_gets_a_clear_error() -> None:
    """In a child forked after the import, creating a session or cache, running attention and
    appending raise RuntimeError naming the spawn start method; closing or dropping the
    parent's objects does nothing (freeing them could hang); the parent goes on unharmed."""
    r = _run("""
        import os, numpy as np, onnx_light_kv as olkv
        from onnx_light_kv import models as M
        cfg = M.DecoderConfig(layers=1, hidden=32, q_heads=2, kv_heads=1, head_dim=16, vocab=64)
        mb = M.model_bytes(M.build("llama", cfg))
        s = olkv.InferenceSession(mb, threads=2)
        c = olkv.KVCache(1, 1, 16, capacity=8)
        c.append(np.ones((1, 1, 2, 16), np.float32), np.ones((1, 1, 2, 16), np.float32))
        pid = os.fork()
        if pid == 0:
            errors = 0
            for f in (lambda: olkv.InferenceSession(mb), lambda: olkv.KVCache(1, 1, 16, capacity=8),
                      lambda: olkv.attention(np.ones((1, 1, 1, 16), np.float32), c),
                      lambda: c.append(np.ones((1, 1, 1, 16), np.float32), np.ones((1, 1, 1, 16), np.float32)),
                      lambda: s.run(None, {"input_ids": np.array([[1]]), "position_ids": np.array([[0]])}),
                      olkv.get_threads, olkv.get_quant_int_loops):
                try:
                    f()
                except RuntimeError as e:
                    errors += "spawn" in str(e)
            c.close(); s.close(); del c, s
            os._exit(0 if errors == 7 else 3)
        _, status = os.waitpid(pid, 0)
        out = olkv.attention(np.ones((1, 1, 1, 16), np.float32), c)
        print(os.waitstatus_to_exitcode(status), float(out.sum()))
    """, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "16.0"], r.stdout + r.stderr


def test_exit_with_daemon_threads_running_requests() -> None:
    """The main thread ends while two daemon threads loop create_state + run: the process exits
    (native frees at exit waited for the call in flight while the other thread made the next
    state, so exit never finished)."""
    r = _run("""
        import threading, time, numpy as np, onnx_light_kv as olkv
        from onnx_light_kv import models as M
        cfg = M.DecoderConfig(layers=2, hidden=128, q_heads=4, kv_heads=2, head_dim=32, vocab=256, max_positions=2048)
        s = olkv.InferenceSession(M.model_bytes(M.build("llama", cfg)), threads=2)
        feeds = {"input_ids": (np.arange(800)[None] * 3) % 256, "position_ids": np.arange(800)[None]}
        def serve():
            while True:
                st = s.create_state(max_length=1024)
                s.run(["logits"], feeds, state=st)
        for _ in range(2):
            threading.Thread(target=serve, daemon=True).start()
        time.sleep(0.5)
        print("done", flush=True)
    """, timeout=60)
    assert "done" in r.stdout
