"""The cache path: a built-in decoder run on a GenerationState against the tensor path.

Tolerances (logits of magnitude ~10-40): float32 1e-5 relative to the largest |logit| (the two
paths sum the softmax in different orders: the streaming kernel over cache blocks, the tensor
op over the whole past); float16 0.125 absolute (a few fp16 ulps at |logit| ~ 30). Greedy tokens
must be identical.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

import numpy as np
import onnx
import pytest
from onnx import helper

import onnx_light_kv as olkv
from onnx_light_kv import models as M
from _races import fast_thread_switches, race_pair, race_readers  # noqa: F401 - a fixture

STEPS = 64
PROMPT = np.array([[3, 17, 42, 5, 99, 7, 250, 31, 8, 64, 120, 77, 1, 200, 13, 90, 45, 6, 150, 22]], dtype=np.int64)


def _cfg(dtype: str = "float32", **kw: Any) -> M.DecoderConfig:
    base = dict(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, dtype=dtype, max_positions=256)
    base.update(kw)
    return M.DecoderConfig(**base)


def _close(name: str, got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    tol = 1e-5 * max(1.0, float(np.abs(want).max())) if dtype == "float32" else 0.125
    err = float(np.abs(got - want).max()) if got.size else 0.0
    assert err <= tol, f"{name}: max |diff| {err:.3g} > {tol:.3g}"


def _positions(start: int, n: int, batch: int = 1) -> np.ndarray:
    return np.broadcast_to(np.arange(start, start + n, dtype=np.int64), (batch, n)).copy()


def _state_generate(sess: olkv.InferenceSession, state: olkv.GenerationState, prompt: np.ndarray,
                    steps: int) -> Tuple[np.ndarray, List[np.ndarray], np.ndarray]:
    """Greedy decoding on a state: prefill, then single-token runs (logits only)."""
    names = {i.name for i in sess.get_inputs()}
    b, s = prompt.shape

    def feeds(ids: np.ndarray, start: int) -> Dict[str, np.ndarray]:
        f = {"input_ids": ids}
        if "position_ids" in names:
            f["position_ids"] = _positions(start, ids.shape[1], b)
        if "attention_mask" in names:
            f["attention_mask"] = np.ones((b, start + ids.shape[1]), np.int64)
        return f

    logits = sess.run(["logits"], feeds(prompt, 0), state=state)[0]
    prefill = logits
    toks = [np.argmax(logits[:, -1].astype(np.float32), -1)]
    step_logits = [logits[:, -1]]
    for i in range(steps):
        logits = sess.run(["logits"], feeds(toks[-1][:, None].astype(np.int64), s + i), state=state)[0]
        toks.append(np.argmax(logits[:, -1].astype(np.float32), -1))
        step_logits.append(logits[:, -1])
    return np.stack(toks, 1), step_logits, prefill


def _session(model: onnx.ModelProto) -> olkv.InferenceSession:
    return olkv.InferenceSession(M.model_bytes(model), threads=2)


def _row_bytes(cfg: M.DecoderConfig, itemsize: int) -> int:
    return cfg.kv_heads * 2 * cfg.head_dim * itemsize


BUILDS = {
    "llama": lambda cfg: M.llama_decoder(cfg),
    "llama-derived-positions": lambda cfg: M.llama_decoder(cfg, position_ids_input=False),
    "llama-opset24-mask": lambda cfg: M.llama_decoder(cfg.replace(opset=24), attention_mask_input=True),
    "gpt2": lambda cfg: M.gpt2_decoder(cfg),
    "gpt2-additive-split-qkv": lambda cfg: M.gpt2_decoder(cfg, mask="additive", fused_qkv=False),
    "gpt2-derived-positions": lambda cfg: M.gpt2_decoder(cfg, position_ids_input=False),
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("build", sorted(BUILDS))
def test_state_equals_tensor_path(build: str, dtype: str) -> None:
    """Prefill of 20 tokens (two query tiles) + 64 greedy steps: same tokens and logits."""
    cfg = _cfg(dtype)
    model = BUILDS[build](cfg)
    sess = _session(model)
    plan = sess.cache_plan()
    rule = "concat-past-present" if build.startswith("gpt2") else "attention-past-present"
    assert [p["layer"] for p in plan] == [0, 1]
    assert all(p["rewritten"] and p["reason"] == "" and p["rule"] == rule for p in plan), plan
    assert plan[0]["past_key"] == "past_key_values.0.key" and plan[0]["present_value"] == "present.0.value"
    ref = M.greedy_generate(sess, model, PROMPT, STEPS)
    with sess.create_state(max_length=PROMPT.shape[1] + STEPS + 1) as st:
        toks, step_logits, prefill = _state_generate(sess, st, PROMPT, STEPS)
        np.testing.assert_array_equal(toks, ref.tokens)
        assert len(set(toks[0].tolist())) > 4
        _close("prefill logits", prefill, ref.prefill_logits, dtype)
        _close("step logits", np.stack(step_logits), ref.logits, dtype)
        assert st.length == PROMPT.shape[1] + STEPS
        np.testing.assert_array_equal(st.lengths, [PROMPT.shape[1] + STEPS])
        row = cfg.heads_kv("gpt2" if build.startswith("gpt2") else "llama") * 2 * cfg.head_dim * cfg.np_dtype().itemsize
        for layer in st.info()["layers"]:
            assert layer["counters"]["append_bytes"] == st.length * row
            assert layer["counters"]["export_bytes"] == 0
        # presents only when asked for, then equal to the tensor path's
        exported = st.export()
        for name, want in ref.presents.items():
            _close(name, exported[name][:, :, :-1], want[:, :, :PROMPT.shape[1] + STEPS - 1], dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gqa_shared_buffer_state_equals_onnxruntime(dtype: str) -> None:
    """com.microsoft GroupQueryAttention with a shared past/present buffer (the onnxruntime-genai
    contract, in-op rotary, seqlens_k from attention_mask): on a state, prefill + 64 steps give
    onnxruntime's tokens and the standard Llama's (same weights) on the tensor path."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    cfg = _cfg(dtype)
    model = M.llama_decoder_gqa_ort(cfg)
    sess = _session(model)
    plan = sess.cache_plan()
    assert all(p["rewritten"] and p["rule"] == "group-query-attention-shared-buffer" for p in plan), plan
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = M.greedy_generate(ort.InferenceSession(M.model_bytes(model), so, providers=["CPUExecutionProvider"]),
                            model, PROMPT, STEPS)
    std = M.greedy_generate(_session(M.llama_decoder(cfg)), M.llama_decoder(cfg), PROMPT, STEPS)
    with sess.create_state(max_length=PROMPT.shape[1] + STEPS + 1) as st:
        toks, step_logits, prefill = _state_generate(sess, st, PROMPT, STEPS)
        for layer in st.info()["layers"]:
            assert layer["counters"]["append_bytes"] == st.length * _row_bytes(cfg, cfg.np_dtype().itemsize)
    np.testing.assert_array_equal(toks, ref.tokens)
    np.testing.assert_array_equal(toks, std.tokens)
    tol = "float32" if dtype == "float32" else "float16"
    _close("GQA prefill vs standard", prefill, std.prefill_logits, tol)
    _close("GQA steps vs standard", np.stack(step_logits), std.logits, tol)
    if dtype == "float32":
        atol = 1e-4 * max(1.0, float(np.abs(ref.logits).max()))
        assert float(np.abs(np.stack(step_logits) - ref.logits).max()) <= atol


def test_counters_prove_append_only_new_tokens() -> None:
    cfg = _cfg()
    sess = _session(M.llama_decoder(cfg))
    st = sess.create_state(max_length=64)
    row = _row_bytes(cfg, 4)
    sess.run(["logits"], {"input_ids": PROMPT, "position_ids": _positions(0, PROMPT.shape[1])}, state=st)
    info = st.info()
    for layer in info["layers"]:
        c = layer["counters"]
        assert c["append_bytes"] == PROMPT.shape[1] * row
        assert c["export_bytes"] == 0
    st.reset_counters()
    for i in range(5):
        sess.run(["logits"], {"input_ids": np.array([[i + 1]]), "position_ids": _positions(PROMPT.shape[1] + i, 1)},
                 state=st)
        for layer in st.info()["layers"]:
            c = layer["counters"]
            assert c["append_bytes"] == (i + 1) * row, "append copies only the new token's rows"
            assert c["export_bytes"] == 0, "no present was requested"
    # attention reads every stored K/V byte once per step
    L = PROMPT.shape[1] + 5
    for layer in st.info()["layers"]:
        reads = sum((PROMPT.shape[1] + i + 1) * row for i in range(5))
        assert layer["counters"]["attention_bytes"] == reads
    # asking for a present exports that layer only
    out = sess.run(["logits", "present.1.key"], {"input_ids": np.array([[9]]), "position_ids": _positions(L, 1)},
                   state=st)
    assert out[1].shape == (1, cfg.kv_heads, L + 1, cfg.head_dim)
    layers = st.info()["layers"]
    assert layers[0]["counters"]["export_bytes"] == 0
    assert layers[1]["counters"]["export_bytes"] == (L + 1) * row
    totals = st.info()["totals"]
    assert totals["committed_bytes"] == 2 * 64 * row


def test_past_feeds_with_state_raise() -> None:
    cfg = _cfg()
    sess = _session(M.llama_decoder(cfg))
    st = sess.create_state()
    past = np.zeros((1, cfg.kv_heads, 0, cfg.head_dim), np.float32)
    with pytest.raises(ValueError, match="past_key_values.0.key"):
        sess.run(["logits"], {"input_ids": PROMPT, "position_ids": _positions(0, PROMPT.shape[1]),
                              "past_key_values.0.key": past}, state=st)
    assert st.length == 0
    with pytest.raises(TypeError):
        sess.run(["logits"], {"input_ids": PROMPT}, state=object())  # type: ignore[arg-type]


def _with_extra_output(model: onnx.ModelProto, node: onnx.NodeProto, out: str) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.node.append(node)
    m.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    return m


@pytest.mark.parametrize("case", ["present_read", "past_read"])
def test_fallback_keeps_tensor_path(case: str) -> None:
    """A present read by another node, or a past read by a non-shape node, keeps the model on
    the tensor path with the reason; its outputs are unchanged."""
    cfg = _cfg()
    base = M.llama_decoder(cfg)
    if case == "present_read":
        model = _with_extra_output(base, helper.make_node("Identity", ["present.0.key"], ["observed"]), "observed")
        needle = "present \"present.0.key\" is also read by Identity"
    else:
        model = _with_extra_output(base, helper.make_node("Neg", ["past_key_values.1.value"], ["observed"]), "observed")
        needle = "past \"past_key_values.1.value\" is read by"
    sess = _session(model)
    plan = sess.cache_plan()
    assert not any(p["rewritten"] for p in plan)
    bad = 0 if case == "present_read" else 1
    assert needle in plan[bad]["reason"], plan[bad]["reason"]
    assert "stay on the tensor path" in plan[1 - bad]["reason"]
    with pytest.raises(NotImplementedError, match="tensor path"):
        sess.create_state()
    a = M.greedy_generate(sess, model, PROMPT, 4)
    b = M.greedy_generate(_session(base), base, PROMPT, 4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logits, b.logits)


def _cast_before_present(model: onnx.ModelProto, present: str, to: int) -> onnx.ModelProto:
    """The model with the Concat that produces ``present`` writing a temporary, and a Cast of it to
    ``to`` producing the present (as GPT-J's TorchScript export casts its keys)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = list(m.graph.node)
    i = next(k for k, n in enumerate(nodes) if present in n.output)
    nodes[i].output[0] = present + "_concat"
    nodes.insert(i + 1, helper.make_node("Cast", [present + "_concat"], [present], to=to))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_concat_rule_looks_through_a_cast_to_the_past_type(dtype: str) -> None:
    """Concat(past, new) -> Cast(to = the past's own type) -> present is rewritten (both nodes
    dropped) and runs like the tensor path; a Concat output also read elsewhere is not."""
    cfg = _cfg(dtype)
    to = onnx.TensorProto.FLOAT if dtype == "float32" else onnx.TensorProto.FLOAT16
    model = _cast_before_present(_cast_before_present(M.gpt2_decoder(cfg), "present.0.key", to), "present.1.value", to)
    sess = _session(model)
    assert all(p["rewritten"] and p["rule"] == "concat-past-present" for p in sess.cache_plan()), sess.cache_plan()
    ref = M.greedy_generate(sess, model, PROMPT, 8)
    with sess.create_state() as st:
        toks, step_logits, prefill = _state_generate(sess, st, PROMPT, 8)
    np.testing.assert_array_equal(toks, ref.tokens)
    _close("prefill logits", prefill, ref.prefill_logits, dtype)
    _close("step logits", np.stack(step_logits), ref.logits, dtype)
    observed = _with_extra_output(model, helper.make_node("Identity", ["present.0.key_concat"], ["observed"]), "observed")
    plan = _session(observed).cache_plan()
    assert not plan[0]["rewritten"] and "nor a Cast of it to the past's type" in plan[0]["reason"], plan[0]


def test_gpt2_batch_of_two() -> None:
    """A GPT-2 state of batch 2 (its in-graph mask is causal only) runs like the tensor path."""
    cfg = _cfg()
    model = M.gpt2_decoder(cfg)
    sess = _session(model)
    prompt = np.stack([PROMPT[0], PROMPT[0, ::-1]])
    ref = M.greedy_generate(sess, model, prompt, 6)
    with sess.create_state(batch=2) as st:
        toks, step_logits, prefill = _state_generate(sess, st, prompt, 6)
    np.testing.assert_array_equal(toks, ref.tokens)
    _close("batch-2 prefill", prefill, ref.prefill_logits, "float32")


def test_attention_mask_all_ones_and_left_padding() -> None:
    """Batch 1 with an all-ones attention_mask is exact; a left-padded batch equals the
    per-sequence runs on every real position, prefill and decode."""
    cfg = _cfg()
    model = M.llama_decoder(cfg, attention_mask_input=True)
    sess = _session(model)
    assert all(p["rewritten"] for p in sess.cache_plan())
    ref = M.greedy_generate(sess, model, PROMPT, 8)
    st = sess.create_state()
    s = PROMPT.shape[1]
    logits = sess.run(["logits"], {"input_ids": PROMPT, "position_ids": _positions(0, s),
                                   "attention_mask": np.ones((1, s), np.int64)}, state=st)[0]
    _close("prefill", logits, ref.prefill_logits, "float32")
    tok = np.argmax(logits[:, -1], -1)
    for i in range(8):
        logits = sess.run(["logits"], {"input_ids": tok[:, None], "position_ids": _positions(s + i, 1),
                                       "attention_mask": np.ones((1, s + i + 1), np.int64)}, state=st)[0]
        _close(f"step {i}", logits[:, -1], ref.step_logits[i + 1], "float32")
        tok = np.argmax(logits[:, -1], -1)

    prompts = [PROMPT[0, :13], PROMPT[0, :20], PROMPT[0, 5:9]]
    S = max(len(p) for p in prompts)
    ids = np.zeros((3, S), np.int64)
    mask = np.zeros((3, S), np.int64)
    pos = np.zeros((3, S), np.int64)
    for b, p in enumerate(prompts):
        ids[b, S - len(p):] = p
        mask[b, S - len(p):] = 1
        pos[b, S - len(p):] = np.arange(len(p))
    st = sess.create_state(batch=3)
    logits = sess.run(["logits"], {"input_ids": ids, "position_ids": pos, "attention_mask": mask}, state=st)[0]
    np.testing.assert_array_equal(st.lengths, [len(p) for p in prompts])
    assert st.length == S
    singles = [M.greedy_generate(sess, model, p[None], 6) for p in prompts]
    for b, p in enumerate(prompts):
        _close(f"padded prefill {b}", logits[b, S - len(p):], singles[b].prefill_logits[0], "float32")
    tok = np.argmax(logits[:, -1], -1)
    for i in range(6):
        mask = np.concatenate([mask, np.ones((3, 1), np.int64)], 1)
        step_pos = np.array([[len(p) + i] for p in prompts], np.int64)
        logits = sess.run(["logits"], {"input_ids": tok[:, None], "position_ids": step_pos, "attention_mask": mask},
                          state=st)[0]
        for b in range(3):
            _close(f"padded step {i} seq {b}", logits[b, -1], singles[b].step_logits[i + 1][0], "float32")
        tok = np.argmax(logits[:, -1], -1)
    # a mask that is not left padding is refused, and the state is unchanged
    before = st.lengths.copy()
    bad = mask.copy()
    bad[0, 1] = 1
    bad = np.concatenate([bad, np.ones((3, 1), np.int64)], 1)
    with pytest.raises(NotImplementedError, match="left padding"):
        sess.run(["logits"], {"input_ids": tok[:, None], "position_ids": step_pos + 1, "attention_mask": bad}, state=st)
    np.testing.assert_array_equal(st.lengths, before)


def test_two_states_two_threads() -> None:
    cfg = _cfg()
    sess = _session(M.llama_decoder(cfg))
    prompts = [PROMPT, PROMPT[:, ::-1].copy()]
    want = []
    for p in prompts:
        with sess.create_state() as st:
            want.append(_state_generate(sess, st, p, 24)[0])
    got: Dict[int, np.ndarray] = {}
    errors: List[BaseException] = []

    def work(i: int) -> None:
        try:
            with sess.create_state() as st:
                got[i] = _state_generate(sess, st, prompts[i], 24)[0]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        np.testing.assert_array_equal(got[i], want[i])


def _tensor_step(sess: olkv.InferenceSession, cfg: M.DecoderConfig, ids: np.ndarray, start: int,
                 past: Dict[str, np.ndarray]) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    feeds: Dict[str, Any] = {"input_ids": ids, "position_ids": _positions(start, ids.shape[1], ids.shape[0])}
    feeds.update(dict(zip(M.past_names(cfg.layers), (past[n] for n in M.present_names(cfg.layers)))))
    names = ["logits"] + M.present_names(cfg.layers)
    outs = sess.run(names, feeds)
    return outs[0], {n: np.array(a) for n, a in zip(names[1:], outs[1:])}


def test_state_operations_equal_tensor_path_presents() -> None:
    """fork / reorder / truncate / checkpoint + rollback on a state give the same next-step
    logits as the same operations applied to the tensor path's presents."""
    cfg = _cfg()
    sess = _session(M.llama_decoder(cfg))
    B, s = 2, 12
    prompt = np.stack([PROMPT[0, :s], PROMPT[0, 8:8 + s]])
    empty = {n: np.zeros((B, cfg.kv_heads, 0, cfg.head_dim), np.float32) for n in M.present_names(cfg.layers)}
    _, pres = _tensor_step(sess, cfg, prompt, 0, empty)
    st = sess.create_state(batch=B, max_length=64)
    sess.run(["logits"], {"input_ids": prompt, "position_ids": _positions(0, s, B)}, state=st)
    tok = np.array([[5], [6]], np.int64)

    def check(state: olkv.GenerationState, presents: Dict[str, np.ndarray], start: int, what: str) -> None:
        want, _ = _tensor_step(sess, cfg, tok, start, presents)
        got = sess.run(["logits"], {"input_ids": tok, "position_ids": _positions(start, 1, B)}, state=state)[0]
        _close(what, got, want, "float32")

    # fork: the copy and the original evolve independently
    f = st.fork()
    check(f, pres, s, "fork")
    assert f.length == s + 1 and st.length == s
    # reorder (beam search), then a step
    r = st.fork()
    r.reorder([1, 1])
    check(r, {n: a[[1, 1]] for n, a in pres.items()}, s, "reorder")
    with pytest.raises(IndexError):
        r.reorder([0, 2])
    # truncate to 7 positions, then a step
    t = st.fork()
    t.truncate(7)
    assert t.length == 7
    check(t, {n: a[:, :, :7] for n, a in pres.items()}, 7, "truncate")
    with pytest.raises(ValueError):
        t.truncate(100)
    # checkpoint, three drafted steps, rollback, then a step
    ck = st.checkpoint()
    for i in range(3):
        sess.run(["logits"], {"input_ids": tok + i, "position_ids": _positions(s + i, 1, B)}, state=st)
    assert st.length == s + 3
    st.rollback(ck)
    assert st.length == s
    check(st, pres, s, "rollback")
    # a reset state starts over
    st.reset()
    assert st.length == 0 and st.lengths.tolist() == [0, 0]
    for x in (f, r, t, st):
        x.close()
    with pytest.raises(ValueError, match="closed"):
        st.info()
    assert "closed" in repr(st)


def test_budget_exhaustion_mid_step_leaves_state_unchanged() -> None:
    """A growing state whose budget holds the first reservation and the growth of layer 0 but
    not of layer 1: the run raises BudgetError after layer 0 appended, and the state is as
    before (lengths, length, and the next runs' results)."""
    cfg = _cfg(max_positions=512)
    model = M.llama_decoder(cfg)
    sess = _session(model)
    row = _row_bytes(cfg, 4)
    budget = (2 * 256 + 512) * row + row // 2  # two caches of 256 tokens, one grown to 512
    st = sess.create_state(budget=budget)
    short = PROMPT[:, :10]
    sess.run(["logits"], {"input_ids": short, "position_ids": _positions(0, 10)}, state=st)
    long_ids = np.resize(PROMPT, (1, 250))
    with pytest.raises(olkv.BudgetError):
        sess.run(["logits"], {"input_ids": long_ids, "position_ids": _positions(10, 250)}, state=st)
    assert st.length == 10
    np.testing.assert_array_equal(st.lengths, [10])
    caps = [layer["capacity"] for layer in st.info()["layers"]]
    assert caps == [512, 256], f"layer 0 grew and appended before layer 1 failed: {caps}"
    assert [layer["lengths"] for layer in st.info()["layers"]] == [[10], [10]]
    assert isinstance(olkv.BudgetError("x"), MemoryError)
    got = sess.run(["logits"], {"input_ids": np.array([[4]]), "position_ids": _positions(10, 1)}, state=st)[0]
    empty = {n: np.zeros((1, cfg.kv_heads, 0, cfg.head_dim), np.float32) for n in M.present_names(cfg.layers)}
    _, pres = _tensor_step(sess, cfg, short, 0, empty)
    want, _ = _tensor_step(sess, cfg, np.array([[4]]), 10, pres)
    _close("after the failed step", got, want, "float32")


def test_growth_and_long_prefill() -> None:
    """A state without max_length grows past its first reservation; a 300-token prefill runs
    on the cache path (tiles of 16 queries) and matches the tensor path."""
    cfg = _cfg(max_positions=512)
    model = M.llama_decoder(cfg)
    sess = _session(model)
    prompt = np.resize(PROMPT, (1, 300))
    st = sess.create_state(dtype="float32")
    toks, step_logits, prefill = _state_generate(sess, st, prompt, 4)
    ref = M.greedy_generate(sess, model, prompt, 4)
    np.testing.assert_array_equal(toks, ref.tokens)
    _close("long prefill", prefill, ref.prefill_logits, "float32")
    assert st.info()["layers"][0]["capacity"] >= 305


def test_fp16_cache_for_fp32_model_and_repr() -> None:
    cfg = _cfg()
    model = M.llama_decoder(cfg)
    sess = _session(model)
    st = sess.create_state(dtype="float16", max_length=48)
    assert st.dtype == np.float16
    toks, _, _ = _state_generate(sess, st, PROMPT, 8)
    ref = M.greedy_generate(sess, model, PROMPT, 8)
    np.testing.assert_array_equal(toks, ref.tokens)
    assert st.info()["layers"][0]["counters"]["append_bytes"] == (PROMPT.shape[1] + 8) * _row_bytes(cfg, 2)
    assert "GenerationState(batch=1" in repr(st)
    assert "<table" in st._repr_html_() and "KiB" in st._repr_html_()
    with pytest.raises(TypeError):
        sess.create_state(dtype="int8")
    with pytest.raises(ValueError):
        sess.create_state(batch=0)


def test_load_presents_continues_on_the_cache_path() -> None:
    """``state.load(presents)`` (the inverse of export): a state loaded with the tensor path's
    presents (ours, and onnxruntime's on the same model) continues exactly like the state that
    ran the prompt; errors change nothing."""
    import onnxruntime as ort

    cfg = _cfg()
    model = M.llama_decoder(cfg)
    sess = _session(model)
    P = PROMPT.shape[1]
    ran = sess.create_state(max_length=P + 8)
    sess.run(["logits"], {"input_ids": PROMPT, "position_ids": _positions(0, P)}, state=ran)
    empty = {n: np.zeros((1, cfg.kv_heads, 0, cfg.head_dim), np.float32) for n in M.past_names(cfg.layers)}
    o = ort.InferenceSession(M.model_bytes(model), providers=["CPUExecutionProvider"])
    names = [x.name for x in o.get_outputs()]
    res = dict(zip(names, o.run(None, {"input_ids": PROMPT, "position_ids": _positions(0, P), **empty})))
    step = {"input_ids": np.array([[9]]), "position_ids": _positions(P, 1)}
    want = sess.run(["logits"], step, state=ran.fork())[0]
    for source in (ran.export(), {n: res[n] for n in M.present_names(cfg.layers)}):
        st = sess.create_state(max_length=P + 8)
        st.load(source)
        assert st.length == P
        _close("loaded state's step", sess.run(["logits"], step, state=st)[0], want, "float32")
        for layer in st.info()["layers"]:
            assert layer["counters"]["append_bytes"] == (P + 1) * _row_bytes(cfg, 4)
    st = sess.create_state(max_length=P + 8)
    st.load(ran.export())
    presents = ran.export()
    with pytest.raises(olkv.CapacityError):
        st.load(presents)  # 2P > P + 8
    with pytest.raises(KeyError):
        st.load({k: v for k, v in presents.items() if k != "present.1.value"})
    with pytest.raises(ValueError):
        st.load({k: v[:, :, :3 if k.endswith("key") else 2] for k, v in presents.items()})
    with pytest.raises(TypeError):
        st.load({k: v.astype(np.int32) for k, v in presents.items()})
    assert st.length == P
    np.testing.assert_array_equal(st.export()["present.0.key"], presents["present.0.key"])


# -- select and adopt under concurrency; copies ----------------------------------------------


def _labelled_state(sess: olkv.InferenceSession, batch: int, length: int = 8) -> olkv.GenerationState:
    """A state whose sequence b holds only the value b + 1 (keys) and -(b + 1) (values) in every
    layer (loaded, not run: no model call)."""
    st = sess.create_state(batch=batch, max_length=16)
    ids = np.arange(1, batch + 1, dtype=np.float32).reshape(batch, 1, 1, 1)
    plan = sess.cache_plan()
    k = np.ascontiguousarray(np.broadcast_to(ids, (batch, 2, length, 16)))  # _cfg(): 2 KV heads of 16
    st.load({name: (k if key == "present_key" else -k) for p in plan for key, name in
             (("present_key", p["present_key"]), ("present_value", p["present_value"]))})
    return st


def _state_of(presents: Dict[str, np.ndarray], states: List[List[int]]) -> bool:
    """Whether an export of a :func:`_labelled_state` is exactly one of ``states`` (lists of the
    kept sequences' labels) in every layer."""
    for ids in states:
        want = np.asarray(ids, np.float32).reshape(-1, 1, 1, 1)
        if all(a.shape[0] == len(ids) and np.array_equal(a, np.broadcast_to(want if name.endswith("key") else -want,
                                                                             (len(ids),) + a.shape[1:]))
               for name, a in presents.items()):
            return True
    return False


@pytest.fixture(scope="module")
def small_session() -> olkv.InferenceSession:
    return _session(M.llama_decoder(_cfg()))


def test_state_select_is_atomic_for_export_lengths_checkpoint_and_fork(fast_thread_switches, small_session) -> None:
    """Threads exporting, reading lengths, checkpointing and forking while another selects always
    see the batch before or after a select, never a mix (export used to size its buffers from a
    stale batch and return uninitialized rows; lengths raised; a fork kept the wrong batch)."""
    sess = small_session
    chain = [list(range(1, 17)), [2, 4, 6, 8, 10, 12, 14, 16], [4, 8, 12, 16], [16, 4], [4]]
    picks = [[1, 3, 5, 7, 9, 11, 13, 15], [1, 3, 5, 7], [3, 0], [1]]  # indices into the previous state
    sizes = {len(s) for s in chain}
    for _ in range(20):
        st = _labelled_state(sess, 16)

        def check() -> list:
            problems: list = []
            ex = st.export()
            if not _state_of(ex, chain):
                problems.append(("export", ex["present.0.key"][:, 0, 0, 0].tolist()))
            n = len(st.lengths)
            ck = st.checkpoint()
            f = st.fork()
            if f.batch != f.info()["batch"] or not _state_of(f.export(), chain):
                problems.append(("fork", f.batch, f.info()["batch"]))
            f.close()
            if n not in sizes or len(ck.lengths) not in sizes:
                problems.append(("lengths", n, len(ck.lengths)))
            return problems

        problems = race_readers(check, lambda: [st.select(p) for p in picks])
        assert not problems, problems[:5]
        assert st.batch == st.info()["batch"] == 1 and _state_of(st.export(), [[4]])
        st.close()


def test_concurrent_selects_and_adopts_keep_python_and_go_batch_equal(fast_thread_switches, small_session) -> None:
    """Of two racing selects (or a select racing an adopt), the one that runs second either fails
    (its indices no longer fit) or applies to what the first left; the wrapper's batch always
    ends equal to the Go state's (it used to keep the size of whichever call updated it last)."""
    sess = small_session
    for i in range(150):
        st = _labelled_state(sess, 4)
        other = _labelled_state(sess, 2) if i % 2 else None
        first = (lambda: st.select([0])) if other is not None else (lambda: st.select([0, 1, 2]))
        second = (lambda: st.adopt(other)) if other is not None else (lambda: st.select([0]))
        race_pair(first, second)
        assert st.batch == st.info()["batch"] == len(st.lengths)
        if other is None:  # [0, 1, 2] then [0], or [0] alone
            assert st.batch == 1 and _state_of(st.export(), [[1]])
        else:  # adopt then select [0], or select [0] then adopt
            assert other.closed and _state_of(st.export(), [[1], [1, 1, 2]])
        st.close()


def test_state_stale_batch_on_unlocked_paths_raises_and_changes_nothing(small_session) -> None:
    """reorder, load and run take no Python lock: while a select from another thread is under
    way they may still see the old batch. The Go side checks every size, so such a call raises
    ValueError and leaves the state as it was."""
    sess = small_session
    st = _labelled_state(sess, 4)
    st.select([1, 3])
    before = st.export()
    st._batch = 4  # what a thread sees between select's Go call and its update of the batch
    stale = {n: np.zeros((4,) + a.shape[1:2] + (1,) + a.shape[3:], np.float32) for n, a in before.items()}
    calls = [lambda: st.reorder([0, 1, 1, 0]), lambda: st.load(stale),
             lambda: sess.run(["logits"], {"input_ids": np.ones((4, 1), np.int64),
                                           "position_ids": np.full((4, 1), 8, np.int64)}, state=st)]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    st._batch = 2
    after = st.export()
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    assert st.lengths.tolist() == [8, 8] and st.length == 8


def test_failed_state_checkpoint_leaves_no_native_checkpoint(monkeypatch: pytest.MonkeyPatch,
                                                             small_session) -> None:
    """A checkpoint() that raises after Go took the snapshot releases it (no Python object would
    own it: every layer would keep it until 64 newer checkpoints push it out)."""
    sess = small_session
    st = _labelled_state(sess, 2)

    def fail(self: olkv.GenerationState) -> np.ndarray:
        raise ValueError("simulated failure")

    monkeypatch.setattr(olkv.GenerationState, "_lengths_locked", fail)
    with pytest.raises(ValueError, match="simulated"):
        st.checkpoint()
    monkeypatch.undo()
    assert [layer["checkpoints"] for layer in st.info()["layers"]] == [0, 0]
    ck = st.checkpoint()
    assert [layer["checkpoints"] for layer in st.info()["layers"]] == [1, 1] and ck.lengths.tolist() == [8, 8]


@pytest.mark.parametrize("how", ["copy", "deepcopy"])
def test_copy_and_deepcopy_of_a_state_fork_it(how: str, small_session) -> None:
    """copy.copy and copy.deepcopy return fork(): an independent state of the same session that
    outlives the original (they used to share its handle: closing either closed both)."""
    import copy
    import gc

    sess = small_session
    st = _labelled_state(sess, 2, length=3)
    before = st.export()
    d = getattr(copy, how)(st)
    assert isinstance(d, olkv.GenerationState) and d is not st and d._h != st._h
    assert d._session is sess and d.batch == 2 and not d.closed
    st.select([1])
    st.close()
    del st
    gc.collect()
    got = d.export()
    for name in before:
        np.testing.assert_array_equal(got[name], before[name])
    sess.run(["logits"], {"input_ids": np.ones((2, 1), np.int64), "position_ids": np.full((2, 1), 3, np.int64)},
             state=d)
    assert d.lengths.tolist() == [4, 4]
    holder = copy.deepcopy({"a": d, "b": d})  # the memo keeps one copy per state
    assert holder["a"] is holder["b"] and holder["a"] is not d
    d.close()
    with pytest.raises(ValueError, match="closed"):
        getattr(copy, how)(d)


def test_state_checkpoint_and_generator_refuse_pickling_and_generator_copies(small_session) -> None:
    """Handles are numbers valid in one process: pickling a state (or its checkpoint, or a
    Generator holding one) would alias whatever has that number elsewhere. A Generator has no
    copy of its KV state: copying it raises instead of sharing the state."""
    import copy
    import pickle

    sess = small_session
    st = _labelled_state(sess, 1)
    ck = st.checkpoint()
    g = olkv.Generator(sess, max_length=16)
    g.append_tokens(np.array([[1, 2, 3]]))
    assert g.runner_kind == "state"
    for obj, match in [(st, "GenerationState cannot be pickled: it holds native memory"),
                       (ck, "Checkpoint cannot be pickled"), (g, "Generator cannot be pickled")]:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            with pytest.raises(TypeError, match=match):
                pickle.dumps(obj, protocol=protocol)
    with pytest.raises(TypeError, match="load\\(\\) them"):
        pickle.dumps(st)
    assert copy.copy(ck) is ck and copy.deepcopy(ck) is ck
    for fn in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="Generator cannot be copied"):
            fn(g)
    g.generate_next_token()  # the generator is untouched
    assert g.length == 4
    g.close()
