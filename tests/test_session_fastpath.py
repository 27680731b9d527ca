"""The prepared-signature run path of ``InferenceSession.run``: the feed and output names of a
run are resolved once (``SessionPrepare``) and later runs with the same names pass only the
arrays. Its results must equal a fresh session's first run (which prepares), errors must still be
raised on every run, and signatures must stay bounded and be freed with the session."""

from __future__ import annotations

import gc
from typing import Any, Dict, List

import numpy as np
import pytest
from onnx import TensorProto, helper

session = pytest.importorskip("onnx_light_kv.session")
from onnx_light_kv import _lib, models  # noqa: E402

InferenceSession = session.InferenceSession
CFG = models.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=128, max_positions=256)


@pytest.fixture(scope="module")
def decoder() -> bytes:
    return models.model_bytes(models.build("llama", CFG))


def _feeds(past: Dict[str, np.ndarray], tok: int, pos: int) -> Dict[str, np.ndarray]:
    return {"input_ids": np.array([[tok]], np.int64), "position_ids": np.array([[pos]], np.int64), **past}


def _decode(sess: Any, steps: int, outputs: Any = None, fresh: bool = False, data: bytes = b"") -> List[List[np.ndarray]]:
    """A greedy decode on the tensor path; ``fresh``: every step on a new session (each run is
    its session's first, so it prepares its signature)."""
    names = [o.name for o in sess.get_outputs()]
    past = {p: np.zeros((1, CFG.kv_heads, 0, CFG.head_dim), np.float32) for p in models.past_names(CFG.layers)}
    tok, res = 3, []
    for pos in range(steps):
        s = InferenceSession(data, threads=1) if fresh else sess
        outs = s.run(outputs, _feeds(past, tok, pos))
        got = dict(zip(names if outputs is None else outputs, outs))
        res.append([np.array(o) for o in outs])
        for p, q in zip(models.past_names(CFG.layers), models.present_names(CFG.layers)):
            past[p] = got[q]
        tok = int(got["logits"][0, -1].argmax())
    return res


@pytest.mark.parametrize("outputs", [None, "logits-first", "presents-reversed"])
def test_prepared_runs_equal_first_runs(decoder: bytes, outputs: str) -> None:
    sess = InferenceSession(decoder, threads=1)
    names = [o.name for o in sess.get_outputs()]
    sel = {None: None, "logits-first": ["logits"] + names[1:], "presents-reversed": ["logits"] + names[:0:-1]}[outputs]
    cached = _decode(sess, 6, sel)
    fresh = _decode(sess, 6, sel, fresh=True, data=decoder)
    assert len(sess._signatures) == 1
    for a, b in zip(cached, fresh):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def test_feed_order_and_output_selection_get_their_own_signatures(decoder: bytes) -> None:
    sess = InferenceSession(decoder, threads=1)
    past = {p: np.zeros((1, CFG.kv_heads, 2, CFG.head_dim), np.float32) for p in models.past_names(CFG.layers)}
    f = _feeds(past, 5, 2)
    (a,) = sess.run(["logits"], f)
    (b,) = sess.run(["logits"], dict(reversed(list(f.items()))))
    full = sess.run(None, f)
    assert len(sess._signatures) == 3
    assert np.array_equal(a, b) and np.array_equal(a, full[0])


def test_errors_raised_on_every_run_of_a_prepared_signature(decoder: bytes) -> None:
    sess = InferenceSession(decoder, threads=1)
    past = {p: np.zeros((1, CFG.kv_heads, 1, CFG.head_dim), np.float32) for p in models.past_names(CFG.layers)}
    good = _feeds(past, 1, 1)
    sess.run(None, good)
    bad_type = dict(good, input_ids=good["input_ids"].astype(np.int32))
    bad_rank = dict(good, input_ids=good["input_ids"][0])
    bad_dtype = dict(good, input_ids=good["input_ids"].astype(np.complex64))
    for _ in range(3):  # the signature is cached: the checks are not
        with pytest.raises(TypeError, match="input_ids"):
            sess.run(None, bad_type)
        with pytest.raises(ValueError, match="rank"):
            sess.run(None, bad_rank)
        with pytest.raises(TypeError, match="unsupported dtype"):
            sess.run(None, bad_dtype)
        missing = dict(good)
        del missing["position_ids"]
        with pytest.raises(ValueError, match="position_ids"):
            sess.run(None, missing)
        with pytest.raises(ValueError, match="unknown input"):
            sess.run(None, dict(good, extra=np.zeros(1, np.float32)))
        misspelt = dict(missing, position_id=good["position_ids"])
        with pytest.raises(ValueError, match=r'"position_ids" is required.*unknown input name\(s\) position_id\b'):
            sess.run(None, misspelt)
        with pytest.raises(ValueError, match="nope"):
            sess.run(["nope"], good)
        assert len(sess.run(None, good)) == 1 + 2 * CFG.layers  # still usable


def test_state_runs_prepare_once_and_refuse_pasts(decoder: bytes) -> None:
    sess = InferenceSession(decoder, threads=1)
    ref = InferenceSession(decoder, threads=1)
    st, st_ref = sess.create_state(max_length=32), ref.create_state(max_length=32)
    for pos, tok in enumerate([4, 9, 2, 7]):
        f = {"input_ids": np.array([[tok]], np.int64), "position_ids": np.array([[pos]], np.int64)}
        (a,) = sess.run(["logits"], f, state=st)
        (b,) = ref.run(["logits"], dict(reversed(list(f.items()))), state=st_ref)  # another signature
        assert np.array_equal(a, b)
    assert len(sess._signatures) == 1
    past = {models.past_names(1)[0]: np.zeros((1, CFG.kv_heads, 0, CFG.head_dim), np.float32)}
    for _ in range(2):
        with pytest.raises(ValueError, match="must not be fed"):
            sess.run(["logits"], {"input_ids": np.array([[1]], np.int64),
                                  "position_ids": np.array([[4]], np.int64), **past}, state=st)
    assert st.length == 4  # the failed runs changed nothing


def test_signatures_bounded_and_freed_with_the_session(decoder: bytes) -> None:
    live = _lib.fn("LiveSignatures")
    # The count is process-wide: other tests' sessions free theirs when the garbage collector
    # gets to them, so collect them first and keep the collector off while counting.
    gc.collect()
    gc.disable()
    try:
        before = live()
        sess = InferenceSession(decoder, threads=1)
        names = [o.name for o in sess.get_outputs()]
        past = {p: np.zeros((1, CFG.kv_heads, 1, CFG.head_dim), np.float32) for p in models.past_names(CFG.layers)}
        f = _feeds(past, 1, 1)
        for i in range(session._MAX_SIGNATURES + 6):  # as many distinct output selections
            sel = [names[(i + k) % len(names)] for k in range(1 + i % 3)] + ["logits"] * (i // len(names))
            sess.run(sel, f)
        assert len(sess._signatures) <= session._MAX_SIGNATURES
        assert live() - before == len(sess._signatures)
        sess.close()
        assert live() == before
    finally:
        gc.enable()


def test_high_rank_and_lent_outputs() -> None:
    """An output of a rank the description array has no room for takes the describe call; a
    large output is lent (wraps the session's buffer), a small one copied."""
    rank = session._META_RANK + 3
    shape = [1] * (rank - 1) + [4]
    data = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["hi"]), helper.make_node("Tile", ["x", "r"], ["big"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [rank]),
         helper.make_tensor_value_info("r", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("hi", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("big", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = InferenceSession(data, threads=1)
    x = np.arange(4, dtype=np.float32)
    reps = session.LEND_MIN_BYTES // 16 + 1
    lent_before = _lib.fn("LentOutputs")()
    for _ in range(3):
        hi, big = sess.run(None, {"x": x, "s": np.array(shape, np.int64), "r": np.array([reps], np.int64)})
        assert hi.shape == tuple(shape) and np.array_equal(hi.ravel(), x)
        assert big.shape == (4 * reps,) and np.array_equal(big[:8], np.tile(x, 2))
        assert hi.flags.owndata and not big.flags.owndata  # copied / lent
        assert _lib.fn("LentOutputs")() == lent_before + 1
        del hi, big
    assert _lib.fn("LentOutputs")() == lent_before


def test_concurrent_runs_while_signatures_cycle(decoder: bytes) -> None:
    """Threads running many distinct output selections at once (more than the session keeps,
    so signatures are dropped while others run) all get correct results."""
    import threading

    sess = InferenceSession(decoder, threads=1)
    names = [o.name for o in sess.get_outputs()]
    past = {p: np.zeros((1, CFG.kv_heads, 2, CFG.head_dim), np.float32) for p in models.past_names(CFG.layers)}
    f = _feeds(past, 7, 2)
    want = dict(zip(names, sess.run(None, f)))
    sels = [[names[(i + k) % len(names)] for k in range(1 + i % 3)] + ["logits"] * (i // len(names))
            for i in range(session._MAX_SIGNATURES + 20)]
    errors: List[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for j in range(120):
                sel = sels[(seed * 37 + j) % len(sels)]
                for name, got in zip(sel, sess.run(sel, f)):
                    assert np.array_equal(got, want[name])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    assert len(sess._signatures) <= session._MAX_SIGNATURES


@pytest.mark.parametrize("outputs", [None, ["y", "y"]], ids=["identity output", "name twice"])
def test_an_output_returned_twice_outlives_its_twin(outputs: Any) -> None:
    """Two returned arrays backed by one runtime tensor (an output that is an Identity of another,
    or one name asked for twice) are lent once and copied once: dropping one leaves the other's
    values alone through later runs (a second loan of the tensor gave its buffer back early)."""
    n = 64 * 1024  # 256 KiB: above the lending threshold
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Identity", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [n]) for name in ("y", "z")])
    s = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                           ir_version=10).SerializeToString())
    a, b = s.run(outputs, {"x": np.full(n, 1.0, np.float32)})
    del a
    gc.collect()
    for v in (100.0, 101.0):
        s.run(outputs, {"x": np.full(n, v, np.float32)})
    assert (b == 2).all()
    del b
    gc.collect()
    assert _lib.fn("LentOutputs")() == 0
