"""Ctrl-C (KeyboardInterrupt) around native calls: Python raises a pending interrupt as soon as a
native call returns, before its result reaches the caller. Nothing the call made may be lost
(a session, a state, a fork, a run's outputs) and a Generator interrupted mid-run stays in step
with its state. The interrupt is simulated where it lands: a signal sent to this process inside
the call's window, or an exception raised right after the native call returned."""

from __future__ import annotations

import gc
import os
import signal
import threading
from typing import Any

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv import _lib
from onnx_light_kv import models as M
from onnx_light_kv import session as session_mod

CFG = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, max_positions=256)
PROMPT = np.array([3, 17, 42, 5, 99, 7, 250, 31], np.int64)


def _session() -> olkv.InferenceSession:
    return olkv.InferenceSession(M.model_bytes(M.build("llama", CFG, attention_mask_input=True)))


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_deferred_interrupts_deliver_after_the_block() -> None:
    """A SIGINT inside the block is held until its end, then raised; the handler is restored."""
    before = signal.getsignal(signal.SIGINT)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with _lib.deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # bytecode boundaries where Python would raise it
                pass
            reached.append(True)
    assert reached == [True] and signal.getsignal(signal.SIGINT) is before
    with _lib.deferred_interrupts():  # no signal: nothing raised
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored: the block leaves it alone
    try:
        with _lib.deferred_interrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)


def test_creation_under_ctrl_c_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT that is pending as a session, a state, a fork or a cache is created arrives after
    the new object owns its handle: the live counts go back to where they were once it is dropped
    (each interrupted creation kept its memory: 10 x 79 MB sessions, 5 x 512 MiB forks)."""
    sess = _session()
    st = sess.create_state(max_length=64)
    gc.collect()  # (objects earlier tests left for the collector)
    counts0 = (_lib.ext.kvgo_LiveSessions(), _lib.ext.kvgo_LiveStates(), _lib.ext.kvgo_LiveCaches())
    makers = {"StateNew": lambda: sess.create_state(max_length=64), "StateFork": st.fork,
              "CacheNew": lambda: olkv.KVCache(1, 2, 16, capacity=32),
              "SessionNewBytes": lambda: olkv.InferenceSession(M.model_bytes(M.build("llama", CFG)))}
    for name, make in makers.items():
        real = getattr(_lib.ext, "kvgo_" + name)

        def interrupted(*args: Any, _real: Any = real) -> Any:
            out = _real(*args)
            os.kill(os.getpid(), signal.SIGINT)  # pending as the native call returns
            return out

        monkeypatch.setattr(_lib.ext, "kvgo_" + name, interrupted)
        with pytest.raises(KeyboardInterrupt):
            make()
        monkeypatch.undo()
    gc.collect()
    assert (_lib.ext.kvgo_LiveSessions(), _lib.ext.kvgo_LiveStates(), _lib.ext.kvgo_LiveCaches()) == counts0
    st.close()


def test_run_outputs_are_freed_when_the_result_never_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt between the run's return and the wrapping of its outputs: the lent outputs
    and the result are freed from the description array (each such run kept its outputs, 33 MB
    of logits apiece in one report, until the process ended)."""
    sess = _session()
    feeds = {"input_ids": PROMPT[None, :], "attention_mask": np.ones((1, PROMPT.size), np.int64),
             "position_ids": np.arange(PROMPT.size)[None, :]}
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
    pasts = {i.name: np.zeros((1, CFG.kv_heads, 0, CFG.head_dim), np.float32) for i in sess.get_inputs()
             if i.name not in feeds}
    want = sess.run(None, {**feeds, **pasts})
    lent0 = _lib.ext.kvgo_LentOutputs()

    def interrupted(rh: int, m: Any, taken: Any) -> Any:
        raise KeyboardInterrupt  # before it takes the result

    monkeypatch.setattr(session_mod, "_outputs", interrupted)
    for _ in range(5):
        with pytest.raises(KeyboardInterrupt):
            sess.run(None, {**feeds, **pasts})
    monkeypatch.undo()
    assert _lib.ext.kvgo_LentOutputs() == lent0
    got = sess.run(None, {**feeds, **pasts})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_generator_interrupted_mid_run_stays_in_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state took the tokens but the interrupt came before the Generator noted them: the
    call changes nothing (the state gives the tokens back), and the same prompt gives the same
    tokens after (it continued from a state 3000 positions ahead, with other tokens)."""
    sess = _session()
    want = olkv.generate(sess, PROMPT, max_new_tokens=5).new_tokens[0]
    g = olkv.Generator(sess, max_length=64)
    real = type(sess).run

    def run_then_interrupt(self: Any, *args: Any, **kw: Any) -> Any:
        real(self, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(type(sess), "run", run_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        g.append_tokens(PROMPT)
    monkeypatch.undo()
    assert g.length == 0 and g._runner.state.length == 0
    g.append_tokens(PROMPT)
    for _ in range(5):
        g.generate_next_token()
    np.testing.assert_array_equal(g.get_sequence(0)[PROMPT.size:], want)
