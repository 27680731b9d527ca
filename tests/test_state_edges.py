"""Generation states of models that do not declare their K/V geometry, prefix registration
with a mask input of another name, and small API edges (found by adversarial runs)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv import models


def _undeclared_model() -> Any:
    """A built-in decoder whose past/present K/V shapes are not declared."""
    m = models.build("llama", models.DecoderConfig(layers=1, hidden=64, q_heads=4, kv_heads=2, head_dim=16))
    for v in list(m.graph.input) + list(m.graph.output):
        if "past" in v.name or "present" in v.name:
            v.type.tensor_type.ClearField("shape")
    return olkv.InferenceSession(m.SerializeToString(), threads=1)


_FEEDS = {"input_ids": np.arange(1, 5)[None], "position_ids": np.arange(4)[None]}


def _rows(sess: Any, heads: int, dim: int, n: int) -> dict:
    return {name: np.ones((1, heads, n, dim), np.float32)
            for p in sess.cache_plan() for name in (p["present_key"], p["present_value"])}


def test_failed_load_leaves_state_and_session_working() -> None:
    sess = _undeclared_model()
    st = sess.create_state(batch=1, max_length=32)
    with pytest.raises(olkv.CapacityError):
        st.load(_rows(sess, 3, 8, 40))  # wrong geometry and longer than the state
    ref = _undeclared_model()
    want = ref.run(["logits"], _FEEDS, state=ref.create_state(batch=1, max_length=32))[0]
    for s in (st, sess.create_state(batch=1, max_length=32)):
        got = sess.run(["logits"], _FEEDS, state=s)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_load_of_wrong_geometry_stays_on_its_state() -> None:
    sess = _undeclared_model()
    st = sess.create_state(batch=1, max_length=32)
    st.load(_rows(sess, 3, 8, 4))  # no run has shown the geometry: taken as given
    with pytest.raises(ValueError, match="heads"):
        sess.run(["logits"], {"input_ids": np.array([[5]]), "position_ids": np.array([[4]])}, state=st)
    other = sess.create_state(batch=1, max_length=32)
    sess.run(["logits"], _FEEDS, state=other)  # the session did not learn 3 heads of 8
    with pytest.raises(ValueError, match="heads"):
        sess.create_state(batch=1, max_length=32).load(_rows(sess, 3, 8, 4))  # now the run showed 2 of 16


def test_fresh_state_of_undeclared_model_exports_and_prints() -> None:
    sess = _undeclared_model()
    st = sess.create_state(batch=1, max_length=32)
    assert st.info()["layers"] == []
    assert st.export() == {}
    assert "GenerationState" in repr(st) or repr(st)
    assert isinstance(st._repr_html_(), str)


def test_state_export_takes_bf16_name() -> None:
    sess = olkv.InferenceSession(models.model_bytes(models.build(
        "llama", models.DecoderConfig(layers=1, hidden=64, q_heads=4, kv_heads=2, head_dim=16))), threads=1)
    st = sess.create_state(batch=1, max_length=16)
    sess.run(["logits"], _FEEDS, state=st)
    out = st.export("bf16")
    assert out and all(a.dtype == olkv.bfloat16 for a in out.values())


def test_prefix_not_registered_when_rows_miss_positions() -> None:
    # a padding mask input not named attention_mask: the run stores fewer rows than positions,
    # which must not be registered under the ids (a later request would reuse shifted K/V)
    m = models.build("llama", models.DecoderConfig(layers=1, hidden=64, q_heads=4, kv_heads=2, head_dim=16),
                     attention_mask_input=True)
    for v in m.graph.input:
        if v.name == "attention_mask":
            v.name = "mask"
    for node in m.graph.node:
        node.input[:] = ["mask" if x == "attention_mask" else x for x in node.input]
    sess = olkv.InferenceSession(m.SerializeToString(), threads=1)
    ids = np.concatenate([[0, 0], np.random.default_rng(0).integers(1, 256, 40)])[None]
    pos = np.arange(42)[None]

    def new(**kw: Any) -> Any:
        return sess.create_state(batch=1, max_length=128, layout="paged", block_size=16, **kw)

    s1 = new(prefix_cache=True)
    sess.run(["logits"], {"input_ids": ids, "mask": np.r_[[0, 0], np.ones(40, int)][None], "position_ids": pos},
             state=s1)
    full = {"input_ids": ids, "mask": np.ones((1, 42), int), "position_ids": pos}
    want = sess.run(["logits"], full, state=new())[0][0, -1]
    s2 = new(prefix_cache=True)
    n = s2.reuse_prefix(ids[0])
    got = sess.run(["logits"], {"input_ids": ids[:, n:], "mask": full["mask"], "position_ids": pos[:, n:]},
                   state=s2)[0][0, -1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_session_submodule_by_attribute() -> None:
    # a fresh interpreter: nothing has imported the submodule yet
    code = "import onnx_light_kv as o; print(any('Attention' in s for s in o.session.supported_ops()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_big_endian_half_keeps_its_width() -> None:
    c = olkv.KVCache(batch=1, kv_heads=1, head_dim=4, capacity=8, dtype="float16")
    k = np.ones((1, 1, 2, 4), ">f2")
    v = np.ones((1, 1, 2, 4), "<f2")
    c.append(k, v)
    np.testing.assert_array_equal(c.export()[0], np.ones((1, 1, 2, 4), np.float16))


def test_non_contiguous_memoryview_model_is_value_error() -> None:
    data = models.model_bytes(models.build("llama", models.DecoderConfig(layers=1, hidden=64, q_heads=4,
                                                                          kv_heads=2, head_dim=16)))
    view = memoryview(np.frombuffer(data + data[-1:] * (len(data) % 2), np.uint8))[::2]
    with pytest.raises(ValueError, match="contiguous"):
        olkv.InferenceSession(view)


def _genai(name: str) -> Any:
    import _fixtures as fx

    return olkv.InferenceSession(fx.model_path(name), threads=1)


def _ids_feeds(n: int = 20) -> dict:
    ids = np.arange(3, 3 + n)[None]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_checkpoint_before_the_first_run_of_an_undeclared_geometry() -> None:
    """On an export whose graph does not declare its K/V head size, the session's first state
    has no caches until it runs: a checkpoint taken before stays valid after the run (it was
    always stale), as on any later state."""
    sess = _genai("qwen2-genai")
    for attempt in ("first state of the session", "second state"):
        st = sess.create_state(max_length=64)
        ck = st.checkpoint()
        sess.run(["logits"], _ids_feeds(), state=st)
        st.rollback(ck)
        assert st.length == 0, attempt
        sess.run(["logits"], _ids_feeds(), state=st)  # runs again from empty
        assert st.length == 20


def test_reuse_prefix_on_a_state_made_before_the_first_run() -> None:
    """A prefix-cache state created before the session's first run reuses a prompt another
    state registered since (it returned 0: its caches did not exist yet)."""
    sess = _genai("qwen2-genai")
    opts = dict(max_length=64, layout="paged", block_size=16, prefix_cache=True)
    early = sess.create_state(**opts)
    first = sess.create_state(**opts)
    feeds = _ids_feeds(40)
    want = sess.run(["logits"], feeds, state=first)[0][:, -1]
    n = early.reuse_prefix(feeds["input_ids"][0])
    assert n == 32
    got = sess.run(["logits"], {"input_ids": feeds["input_ids"][:, n:], "attention_mask": feeds["attention_mask"]},
                   state=early)[0][:, -1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_load_checks_a_partly_declared_geometry_and_reset_recovers() -> None:
    """qwen2-genai declares its KV heads (2) but not their size: a load of 4 heads is refused on
    a fresh session (it was accepted and the state could never run again, reset or not)."""
    bad = {f"present.{layer}.{kv}": np.zeros((1, 4, 10, 8), np.float32) for layer in range(2)
           for kv in ("key", "value")}
    sess = _genai("qwen2-genai")
    st = sess.create_state(max_length=64)
    with pytest.raises(ValueError, match="KV heads"):
        st.load(bad)
    sess.run(["logits"], _ids_feeds(), state=st)


def test_load_into_undeclared_geometry_then_reset_runs() -> None:
    """A load whose geometry no run has confirmed (the model declares none) stays on its state;
    reset() drops those caches, so the state runs again."""
    sess = _undeclared_model()
    st = sess.create_state(batch=1, max_length=32)
    st.load(_rows(sess, 3, 8, 4))
    with pytest.raises(ValueError, match="heads"):
        sess.run(["logits"], _FEEDS, state=st)
    st.reset()
    sess.run(["logits"], _FEEDS, state=st)
    assert st.length == 4


def test_load_of_window_sized_presents_is_not_implemented() -> None:
    """gemma2-genai keeps window-sized presents in its sliding layers: load(export()) raises
    NotImplementedError at every length (it raised a ValueError about position counts unless the
    length equalled the window)."""
    sess = _genai("gemma2-genai")
    assert any(p["window_buffer"] for p in sess.cache_plan())
    for n in (3, 8, 12):
        ids = (np.arange(n) % 40 + 1)[None]
        st = sess.create_state(max_length=64)
        sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)}, state=st)
        with pytest.raises(NotImplementedError, match="window"):
            sess.create_state(max_length=64).load(st.export())


def test_rollback_before_a_wrong_load_restores_a_runnable_state() -> None:
    """A checkpoint from before a load whose geometry no run confirmed: rolling back drops the
    load's caches as reset() does (they kept the wrong head size: the state could not run)."""
    sess = _genai("qwen2-genai")  # declares 2 KV heads, not their size (16)
    st = sess.create_state(max_length=64)
    ck = st.checkpoint()
    st.load({f"present.{layer}.{kv}": np.zeros((1, 2, 5, 8), np.float32) for layer in range(2)
             for kv in ("key", "value")})
    st.rollback(ck)
    assert st.length == 0
    ref = _genai("qwen2-genai")
    want = ref.run(["logits"], _ids_feeds(), state=ref.create_state(max_length=64))[0]
    np.testing.assert_allclose(sess.run(["logits"], _ids_feeds(), state=st)[0], want, rtol=1e-5, atol=1e-5)


def test_checkpoint_from_before_a_cache_growth_is_stale() -> None:
    """A growable state replaces a cache that outgrows its capacity; the new cache numbers its
    checkpoints afresh, so a checkpoint from before is stale (it rolled back to, or released,
    whichever newer checkpoint had the same number)."""
    m = models.build("llama", models.DecoderConfig(layers=1, hidden=64, q_heads=4, kv_heads=2, head_dim=16,
                                                   max_positions=1024))
    sess = olkv.InferenceSession(m.SerializeToString(), threads=1)

    def run(st: Any, n: int) -> None:
        p = st.length
        sess.run(["logits"], {"input_ids": (np.arange(n)[None] % 200) + 3,
                              "position_ids": np.arange(p, p + n)[None]}, state=st)

    st = sess.create_state(batch=1)  # grows on demand
    run(st, 10)
    old = st.checkpoint()
    cap = st.info()["layers"][0]["capacity"]
    run(st, cap)  # past the capacity: the cache is replaced by a larger one
    assert st.info()["layers"][0]["capacity"] > cap
    new = st.checkpoint()
    run(st, 2)
    with pytest.raises(olkv.StaleCheckpointError):
        st.rollback(old)
    old.release()  # releases nothing of the new cache's
    st.rollback(new)
    assert st.length == 10 + cap


def test_load_of_an_empty_export_loads_nothing() -> None:
    sess = _undeclared_model()
    st = sess.create_state(batch=1, max_length=32)
    assert st.export() == {}
    st.load(st.export())
    assert st.length == 0
    sess.run(["logits"], _FEEDS, state=st)
