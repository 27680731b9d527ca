"""The fixture exports (tests/fixtures) on the cache path: a GenerationState against onnxruntime's
tensor path and ours.

Per fixture (every entry of the manifest): ``cache_plan()`` rewrites every layer; prefill of a
6-token prompt and 64 greedy steps on a state (no pasts fed; ``attention_mask``/``position_ids`` as
the generic driver builds them) give onnxruntime's greedy tokens, logits within 1e-4 of
onnxruntime's (the bound of test_fixture_models.py) and within 1e-5 x max|logit| of our tensor path,
past every sliding window (Gemma 2/3, Mistral) and past the window-sized buffers of the genai
Gemma 2 export (``sliding_window_cache=1``, whose exported presents equal the tensor path's).
Counters at each step: append bytes = new tokens x row bytes, no export bytes (no present asked
for), attention bytes = every visible K/V row once (the stored context, or a constant window), and
no node's Go allocation grows with the context by a K or V row per position (the profiled
per-node bytes; the graphs' mask arithmetic grows by a few bytes). A left-padded batch of two prompts
equals the per-prompt runs on every real position (exports fed an ``attention_mask``; the genai
export's GroupQueryAttention takes right padding, which its prompt test does not use).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import _fixtures as fx
import _ort_compare as oc
import onnx_light_kv as olkv
import onnxruntime as ort

STEPS = 64
PROMPT = np.array([[5, 17, 42, 99, 7, 130]], dtype=np.int64)
LOGIT_ATOL = 1e-4
# the genai exports' shared buffers: the manifest's max_length (64) is shorter than the prompt plus
# STEPS, so both paths run with buffers of this many positions (window-sized ones keep theirs)
SHARED_CAPACITY = 128


def _params() -> List[Any]:
    return [pytest.param(name, id=name) for name in fx.names()]


def _entry(name: str) -> Dict[str, Any]:
    """The manifest entry, with shared buffers long enough for the prompt and STEPS."""
    e = dict(fx.entry(name))
    if e["drive"].get("shared_buffer"):
        e["drive"] = dict(e["drive"], max_length=SHARED_CAPACITY)
    return e


def _state_feeds(dec: fx.Decoder, tokens: np.ndarray) -> Dict[str, np.ndarray]:
    pasts = {p for p, _ in dec.pairs}
    mask = np.ones((tokens.shape[0], dec.past_len + tokens.shape[1]), dtype=np.int64)
    return {k: v for k, v in dec.feeds(tokens, mask).items() if k not in pasts}


def _check_step_counters(before: List[Dict[str, int]], st: olkv.GenerationState, new: int,
                         visible: List[List[int]]) -> None:
    """One decode step's counters per layer: append = new tokens x row bytes, no export; records
    the rows attention read (attention bytes / row bytes) in ``visible``."""
    for i, layer in enumerate(st.info()["layers"]):
        c, b = layer["counters"], before[i]
        row = 2 * layer["kv_heads"] * layer["head_dim_k"] * np.dtype(layer["dtype"]).itemsize
        assert c["append_bytes"] - b["append_bytes"] == new * layer["batch"] * row, layer["layer"]
        assert c["export_bytes"] == 0, "no present was requested"
        read = c["attention_bytes"] - b["attention_bytes"]
        assert read % row == 0, (layer["layer"], read, row)
        visible[i].append(read // row)


def _state_generate(name: str, sess: olkv.InferenceSession, prompt: np.ndarray, steps: int,
                    check: bool = False) -> Tuple[List[np.ndarray], Dict[str, np.ndarray]]:
    """Prefill + ``steps`` greedy steps on a state: the logits of each run and the state's
    exported presents at the end. ``check``: the counter and allocation checks of each step."""
    dec = fx.Decoder(_entry(name), sess)
    dec.start(prompt.shape[0])
    with sess.create_state(batch=prompt.shape[0]) as st:
        logits = [sess.run(["logits"], _state_feeds(dec, prompt), state=st)[0]]
        dec.past_len += prompt.shape[1]
        visible: List[List[int]] = [[] for _ in st.info()["layers"]]
        lengths, allocated, by_node = [], [], []
        for _ in range(steps):
            before = [layer["counters"] for layer in st.info()["layers"]] if check else []
            nxt = np.argmax(logits[-1][:, -1, :], axis=-1).astype(np.int64)[:, None]
            logits.append(sess.run(["logits"], _state_feeds(dec, nxt), state=st)[0])
            dec.past_len += 1
            if check:
                allocated.append(sess.last_run_stats["allocated_bytes"])
                by_node.append({e["node"]: e["bytes"] for e in sess.last_run_stats["events"]})
                lengths.append(dec.past_len)
                _check_step_counters(before, st, 1, visible)
        assert st.length == dec.past_len
        if check:
            layers = st.info()["layers"]
            row_all = sum(2 * la["kv_heads"] * la["head_dim_k"] * np.dtype(la["dtype"]).itemsize for la in layers)
            for i, rows in enumerate(visible):
                # K+V once per step: every stored row, or a sliding window's constant number of them
                window = rows[-1] if rows[-1] < lengths[-1] else max(lengths)
                assert rows == [min(L, window) for L in lengths], (name, layers[i]["layer"], rows, lengths)
            # no K/V-sized allocation per step: no node's allocation grows by one layer's K (or V)
            # row per position (a present, or a copy of the past, would), and what a step allocates in
            # all grows by less than the K/V rows of all layers (a tensor-path step allocates every
            # present); the graph's own mask arithmetic allocates a few bytes per position per node
            span = lengths[-1] - lengths[0]
            growth = (allocated[-1] - allocated[0]) / span
            assert growth < row_all, (name, allocated[0], allocated[-1], row_all)
            assert by_node[0], "profiling is on: per-node events"
            one_k = min(la["kv_heads"] * la["head_dim_k"] * np.dtype(la["dtype"]).itemsize * la["batch"]
                        for la in layers)
            node_growth = {n: (by_node[-1].get(n, 0) - by_node[0].get(n, 0)) / span for n in by_node[-1]}
            worst = max(node_growth, key=node_growth.get)
            assert node_growth[worst] < one_k, (name, worst, node_growth[worst], one_k)
        exported = st.export()
    return logits, exported


@pytest.mark.parametrize("name", _params())
def test_fixture_on_state_matches(name: str) -> None:
    sess = olkv.InferenceSession(fx.model_path(name), threads=2, profile=True)
    plan = sess.cache_plan()
    assert plan and all(p["rewritten"] for p in plan), [p["reason"] for p in plan]
    # onnxruntime on the int4 exports with MatMulNBits accuracy_level 0 (see fx.reference_model_path)
    want = fx.Decoder(_entry(name), oc.ort(fx.reference_model_path(name), 1)).generate(PROMPT, STEPS)
    tensor_dec = fx.Decoder(_entry(name), sess)
    ours_tensor = tensor_dec.generate(PROMPT, STEPS)
    got, exported = _state_generate(name, sess, PROMPT, STEPS, check=True)
    fp16 = got[0].dtype == np.float16
    for i, (g, w, t) in enumerate(zip(got, want, ours_tensor)):
        oc.assert_close(f"{name} run {i} vs onnxruntime", g, w.outputs["logits"], rtol=0, atol=fx.atol(name))
        tol = 1e-5 * max(1.0, float(np.abs(t.outputs["logits"]).max()))
        if fp16:
            tol = fx.atol(name)  # the two paths round fp16 in different places
        oc.assert_close(f"{name} run {i} vs tensor path", g, t.outputs["logits"], rtol=0, atol=tol)
        assert np.array_equal(np.argmax(g[:, -1], -1), np.argmax(w.outputs["logits"][:, -1], -1))
    # the state's presents hold what the tensor path's last presents hold (window-sized buffers:
    # the last positions of the window from row 0)
    for past, present in tensor_dec.pairs:
        want_rows = tensor_dec.written(past, ours_tensor[-1].outputs[present])
        got_rows = tensor_dec.written(past, exported[present])
        for b, (g, w) in enumerate(zip(got_rows, want_rows)):
            tol = fx.atol(name) if fp16 else 1e-5 * max(1.0, float(np.abs(w).max()))
            oc.assert_close(f"{name} {present} row {b}", g, w, rtol=0, atol=tol)


@pytest.mark.parametrize("name", [p for p in _params() if "attention_mask" in
                                  {i["name"] for i in fx.entry(p.values[0])["inputs"]}
                                  and not fx.entry(p.values[0])["exporter"].startswith("genai")])
def test_fixture_left_padded_batch(name: str) -> None:
    """Two prompts of 6 and 3 tokens, the second left-padded, then 4 steps: every real position's
    logits equal the per-prompt runs on the state."""
    sess = olkv.InferenceSession(fx.model_path(name), threads=2)
    prompts = [PROMPT[0], PROMPT[0, 3:]]
    singles = [_state_generate(name, sess, p[None], 4)[0] for p in prompts]
    S = len(prompts[0])
    ids = np.zeros((2, S), np.int64)
    mask = np.zeros((2, S), np.int64)
    pos = np.zeros((2, S), np.int64)
    for b, p in enumerate(prompts):
        ids[b, S - len(p):], mask[b, S - len(p):], pos[b, S - len(p):] = p, 1, np.arange(len(p))
    inputs = {i.name for i in sess.get_inputs()}
    with sess.create_state(batch=2) as st:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "position_ids" in inputs:
            feeds["position_ids"] = pos
        logits = sess.run(["logits"], feeds, state=st)[0]
        np.testing.assert_array_equal(st.lengths, [len(p) for p in prompts])
        for b, p in enumerate(prompts):
            oc.assert_close(f"{name} padded prefill {b}", logits[b, S - len(p):], singles[b][0][0], rtol=0, atol=fx.atol(name))
        tok = np.argmax(logits[:, -1], -1)
        for i in range(4):
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
            feeds = {"input_ids": tok[:, None].astype(np.int64), "attention_mask": mask}
            if "position_ids" in inputs:
                feeds["position_ids"] = np.array([[len(p) + i] for p in prompts], np.int64)
            logits = sess.run(["logits"], feeds, state=st)[0]
            for b in range(2):
                oc.assert_close(f"{name} padded step {i} seq {b}", logits[b, -1], singles[b][i + 1][0, -1], rtol=0,
                                atol=fx.atol(name))
            tok = np.argmax(logits[:, -1], -1)


def test_window_buffer_presents_on_request() -> None:
    """gemma2-genai's local layer (GroupQueryAttention sliding_window_cache=1, window 8): presents
    named in output_names are the window-sized buffer the tensor path returns (the last 8
    positions from row 0), exporting that buffer's bytes only; the full layer's present holds
    every position."""
    name = "gemma2-genai"
    sess = olkv.InferenceSession(fx.model_path(name), threads=1)
    dec = fx.Decoder(_entry(name), sess)
    steps = dec.generate(PROMPT, 12)
    presents = [p for _, p in dec.pairs]
    st_dec = fx.Decoder(_entry(name), sess)
    st_dec.start(1)
    with sess.create_state() as st:
        sess.run(["logits"], _state_feeds(st_dec, PROMPT), state=st)
        st_dec.past_len += PROMPT.shape[1]
        for s in steps[1:-1]:
            sess.run(["logits"], _state_feeds(st_dec, s.tokens), state=st)
            st_dec.past_len += 1
        st.reset_counters()
        out = sess.run(["logits", *presents], _state_feeds(st_dec, steps[-1].tokens), state=st)
        got = dict(zip(["logits", *presents], out))
        counters = {la["present_key"]: la["counters"]["export_bytes"] for la in st.info()["layers"]}
        with pytest.raises(NotImplementedError, match="window-sized"):  # they hold only the window
            st.load({p: np.zeros((1, 2, 4, 16), np.float32) for p in presents})
        assert st.length == PROMPT.shape[1] + 12
    for past, present in dec.pairs:
        want = steps[-1].outputs[present]
        if dec.capacity(past) == 8:  # the window-sized buffer, exactly as the tensor path's
            assert got[present].shape == want.shape
        for g, w in zip(dec.written(past, got[present]), dec.written(past, want)):
            oc.assert_close(f"{present}", g, w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    row = 2 * 2 * 16 * 4  # K and V rows of 2 heads of 16 float32
    assert counters["present.0.key"] == 8 * row
    assert counters["present.1.key"] == (PROMPT.shape[1] + 12) * row


@pytest.mark.parametrize("where", ["key", "value", "query"])
def test_nan_guard_after_softmax_kept_on_the_state(where: str) -> None:
    """The dynamo export sets the softmax's NaNs to 0 (Where(IsNaN(p), 0, p)): a row whose scores
    hold +Inf or NaN attends nothing, so its output is 0 (NaN again where a V element of its head
    is not finite: 0 * Inf). The cache path gives what onnxruntime gives (it gave NaN logits)."""
    name = "llama-dynamo"
    sess = olkv.InferenceSession(fx.model_bytes(name), threads=1)
    ref = ort.InferenceSession(fx.reference_model_path(name), providers=["CPUExecutionProvider"])
    plan = sess.cache_plan()
    assert {p["rule"] for p in plan} == {"concat-past-present"}
    rng = np.random.default_rng(0)
    presents = {}
    for p in plan:
        presents[p["present_key"]] = rng.standard_normal((1, 2, 3, 16)).astype(np.float32)
        presents[p["present_value"]] = rng.standard_normal((1, 2, 3, 16)).astype(np.float32)
    if where == "key":
        presents[plan[0]["present_key"]][0, 0, 1, 3] = np.inf
    elif where == "value":
        presents[plan[0]["present_value"]][0, 1, 2, 5] = np.inf
    else:  # a NaN key component: every score of its head is NaN
        presents[plan[0]["present_key"]][0, 1, 0, 0] = np.nan
    feeds = {"input_ids": np.array([[9]]), "attention_mask": np.ones((1, 4), np.int64),
             "position_ids": np.array([[3]])}
    past = {p["past_key"]: presents[p["present_key"]] for p in plan}
    past.update({p["past_value"]: presents[p["present_value"]] for p in plan})
    want = ref.run(["logits"], {**feeds, **past})[0]
    st = sess.create_state(batch=1)
    st.load(presents)
    got = sess.run(["logits"], feeds, state=st)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (where == "value") == bool(np.isnan(want).all())  # the case tells the two outcomes apart
