"""Output for people: bounded one-line reprs, notebook tables with units,
human sizes in error messages, the formatting helpers, silent logging."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv import _format, models

MAX_REPR = 400


def _session() -> tuple:
    cfg = models.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=97, max_positions=64)
    model = models.build("llama", cfg)
    return model, olkv.InferenceSession(models.model_bytes(model), threads=1)


def test_reprs_are_short_summaries() -> None:
    arena = olkv.Arena(budget=64 << 20)
    c = olkv.KVCache(64, 8, 128, dtype="float16", capacity=32, arena=arena)
    c.append(np.ones((64, 8, 5, 128), np.float32), np.ones((64, 8, 5, 128), np.float32))
    ck = c.checkpoint()
    model, sess = _session()
    res = models.greedy_generate(sess, model, prompt_ids=np.arange(12), steps=6)
    so = olkv.SessionOptions()
    objs = [c, arena, ck, sess, res, so, sess.get_modelmeta(), sess.get_inputs()[0], olkv.default_arena()]
    for o in objs:
        r = repr(o)
        assert len(r) <= MAX_REPR and "\n" not in r, (type(o).__name__, len(r), r[:200])
        assert r.startswith(type(o).__name__), r
    assert "8.0 MiB" in repr(c) and "64 sequences" not in repr(c)  # 64*8*32*256*2 bytes, lengths shortened
    assert "... 64 items" in repr(c)
    assert "int64[1, 7]" in repr(res) and "steps=7" in repr(res)
    assert "budget=64.0 MiB" in repr(arena)


def test_generation_reprs_are_short_summaries() -> None:
    _, sess = _session()
    out = olkv.generate(sess, np.arange(1, 17)[None], max_new_tokens=8, return_scores=True)
    g = olkv.Generator(sess, max_length=32)
    g.append_tokens(np.arange(1, 9)[None])
    objs = [out, out.stats, g]
    if hasattr(sess, "create_state"):
        objs.append(sess.create_state(batch=2, max_length=64))
    for o in objs:
        r = repr(o)
        assert len(r) <= MAX_REPR and "\n" not in r and r.startswith(type(o).__name__), r
    assert "int64[1, 24]" in repr(out) and "<8 steps>" in repr(out) and "array(" not in repr(out)
    h = out._repr_html_()
    assert "stats" in h and "tokens/s" in h and "KiB" in h
    assert "length=8" in repr(g) and "max_length=32" in repr(g)
    if len(objs) == 4:
        assert "KiB" in repr(objs[3]) and "committed" in objs[3]._repr_html_()


def test_closed_objects_say_so() -> None:
    c = olkv.KVCache(1, 1, 8, capacity=4)
    c.close()
    assert repr(c) == "KVCache(closed)" and "closed" in c._repr_html_()
    _, sess = _session()
    assert "closed" not in repr(sess) and not sess.closed
    sess.close()
    assert repr(sess).startswith("InferenceSession(closed") and sess.closed
    assert "closed" in sess._repr_html_()
    ck = olkv.KVCache(1, 1, 8, capacity=4).checkpoint()
    ck.release()
    assert "released=True" in repr(ck)


def test_html_tables_have_units() -> None:
    c = olkv.KVCache(2, 4, 64, capacity=1024)
    c.append(np.ones((2, 4, 10, 64), np.float32), np.ones((2, 4, 10, 64), np.float32))
    h = c._repr_html_()
    for part in ("geometry", "memory", "counters", "4.0 MiB", "40.0 KiB in 1 calls", "1.02 k tokens"):
        assert part in h, part
    a = c.arena._repr_html_()
    assert "MiB" in a and "fragmentation" in a and "%" in a
    _, sess = _session()
    s = sess._repr_html_()
    for part in ("inputs", "outputs", "input_ids", "tensor(int64)", "[batch, seq]", "CPUExecutionProvider"):
        assert part in s, part


@pytest.mark.parametrize("n,want", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 << 20, "3.0 MiB"),
                                    (68719476736, "64.0 GiB"), (5 << 40, "5.0 TiB")])
def test_human_bytes(n: int, want: str) -> None:
    assert _format.human_bytes(n) == want


@pytest.mark.parametrize("n,want", [(0, "0"), (999, "999"), (1000, "1 k"), (12345, "12.3 k"),
                                    (1234567, "1.23 M"), (250_000_000, "250 M"), (4e9, "4 G")])
def test_human_count(n: float, want: str) -> None:
    assert _format.human_count(n) == want


def test_summary_and_html_helpers() -> None:
    assert _format.summary("X", "closed", a=1, b=None, c=np.zeros((3, 4), np.float32)) == "X(closed, a=1, c=float32[3, 4])"
    assert _format.summary("X", v=list(range(20))) == "X(v=[0, 1, 2, 3, 4, 5, ... 20 items])"
    h = _format.html_table("T<", {"s": [("a&", "<b>")]}, note="n")
    assert "T&lt;" in h and "a&amp;" in h and "&lt;b&gt;" in h and "<table" in h
    assert _format.bytes_with_exact(2048) == "2.0 KiB (2,048 bytes)"


def test_budget_error_names_human_and_exact_sizes() -> None:
    arena = olkv.Arena(budget=1 << 20)
    with pytest.raises(olkv.BudgetError) as e:
        olkv.KVCache(1, 8, 128, capacity=4096, arena=arena)  # K+V: 32 MiB
    msg = str(e.value)
    assert "32.0 MiB (33554432 bytes)" in msg and "1.0 MiB (1048576 bytes) budget" in msg


def test_logging_is_silent_by_default_and_available() -> None:
    code = ("import logging, onnx_light_kv as o; o.set_kernel('auto');"
            "import warnings; o.SessionOptions().graph_optimization_level = 1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
    code = ("import logging; logging.basicConfig(level=logging.INFO); import onnx_light_kv as o; o.set_kernel('auto')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "onnx_light_kv" in r.stderr and "attention kernel path" in r.stderr, r.stderr
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("onnx_light_kv").handlers)


def test_version_has_one_source() -> None:
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "golib", "kvgo", "VERSION")) as fh:
        v = fh.read().strip()
    assert olkv.__version__ == v == olkv.build_info()["version"]
    with open(os.path.join(root, "pyproject.toml")) as fh:
        text = fh.read()
    assert 'dynamic = ["version"]' in text and 'version = { file = "golib/kvgo/VERSION" }' in text
    assert text.count("version = ") == 1
