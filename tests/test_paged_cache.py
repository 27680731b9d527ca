"""The paged KV cache layout (``KVCache(..., layout="paged")``, ``create_state(layout="paged")``).

Paged and contiguous caches driven through the same random operations must both equal the
numpy model of test_cache_api exactly; attention over both layouts agrees within 1e-6; the copy
counters prove that fork copies nothing until a write and that a beam step copies at most one
block per beam; generation on a paged state gives the same tokens and logits as on a
contiguous one.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnx_light_kv as olkv
from onnx_light_kv import models as M
from test_cache_api import DTYPES, Model, check, drive_random_ops

BS = 16  # small blocks: the tests cross many block boundaries


def _pair(B: int, H: int, dk: int, dv: int, dtype: str, cap: int, **kw):
    return (olkv.KVCache(B, H, dk, head_dim_v=dv, dtype=dtype, capacity=cap, **kw),
            olkv.KVCache(B, H, dk, head_dim_v=dv, dtype=dtype, capacity=cap, layout="paged", block_size=BS, **kw))


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_operations_match_numpy_model(seed: int, dtype: str) -> None:
    rng = np.random.default_rng(1000 + seed)
    B, H = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    dk = int(rng.integers(1, 9))
    dv = dk if seed % 2 else int(rng.integers(1, 9))
    cap = int(rng.integers(40, 120))
    drive_random_ops(list(_pair(B, H, dk, dv, dtype, cap)), Model(B, H, dk, dv, cap, dtype), rng, 50, BS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])  # MHA, GQA, MQA
def test_attention_paged_equals_contiguous(dtype: str, hq: int, hkv: int) -> None:
    rng = np.random.default_rng(hq + hkv)
    lens = [BS - 1 + 16, BS + 16, 3 * BS + 5 + 16]  # ragged, around block boundaries
    B, dk, dv, n = len(lens), 16, 12, max(lens)
    caches = _pair(B, hkv, dk, dv, dtype, 4 * BS + 40)
    k = rng.standard_normal((B, hkv, n, dk)).astype(np.float32)
    v = rng.standard_normal((B, hkv, n, dv)).astype(np.float32)
    for c in caches:
        c.append(k, v, counts=lens)
    for keep in (None, 37):
        if keep:
            for c in caches:
                c.evict(keep)
        for lq in (1, 5, 16):
            q = rng.standard_normal((B, hq, lq, dk)).astype(np.float32)
            for kw in ({}, {"window": 21}, {"softcap": 2.0}):
                got = [olkv.attention(q, c, **kw) for c in caches]
                np.testing.assert_allclose(got[1], got[0], rtol=1e-6, atol=1e-6)
    reads = []
    for c in caches:
        c.reset_counters()
        olkv.attention(rng.standard_normal((B, hq, 1, dk)).astype(np.float32), c)
        reads.append(c.counters["attention_bytes"])
    assert reads[0] == reads[1]  # the kernel reads K+V once from both: no gather


def test_paged_commits_blocks_and_reports_info() -> None:
    arena = olkv.Arena()
    c = olkv.KVCache(1, 2, 8, capacity=1 << 16, layout="paged", block_size=32, arena=arena)
    i = c.info()
    assert (i["layout"], i["block_size"], i["committed_bytes"], i["blocks_used"]) == ("paged", 32, 0, 0)
    assert c.layout == "paged" and c.block_size == 32
    row = 2 * (8 + 8) * 4
    c.append(np.ones((1, 2, 100, 8), np.float32), np.ones((1, 2, 100, 8), np.float32))
    i = c.info()
    assert i["blocks_used"] == 4 and i["committed_bytes"] == 4 * 32 * row
    assert i["live_bytes"] == 100 * row
    assert i["fragmentation"] == pytest.approx(1 - 100 / 128)
    assert i["blocks_total"] == i["blocks_used"] + i["blocks_free"]
    f = c.fork()
    assert f.counters["copy_bytes"] == 0 and c.counters["copy_bytes"] == 0
    assert f.info()["blocks_shared"] == 4
    f.append(np.zeros((1, 2, 1, 8), np.float32), np.zeros((1, 2, 1, 8), np.float32))
    assert f.counters["copy_bytes"] == 4 * row  # the 4 valid rows of the shared last block
    assert f.info()["blocks_shared"] == 3
    k0, _ = c.export()
    assert (k0 == 1).all()
    f.close()
    c.evict(40)  # window 60..99: block 0 goes back
    assert c.info()["blocks_used"] == 3
    c.close()


def test_paged_beam_reorder_copies_at_most_one_block_per_beam() -> None:
    c = olkv.KVCache(4, 2, 8, capacity=5000, layout="paged", block_size=32)
    rng = np.random.default_rng(0)
    c.append(rng.standard_normal((4, 2, 4096 + 7, 8)).astype(np.float32),
             rng.standard_normal((4, 2, 4096 + 7, 8)).astype(np.float32))
    block = 32 * 2 * (8 + 8) * 4
    for idx in ([0, 0, 1, 1], [3, 3, 3, 3], [1, 0, 3, 2]):
        c.reset_counters()
        c.reorder(idx)
        assert c.counters["copy_bytes"] == 0
        c.append(np.zeros((4, 2, 1, 8), np.float32), np.zeros((4, 2, 1, 8), np.float32))
        assert c.counters["copy_bytes"] <= 4 * block


def test_paged_budget_exhaustion_leaves_caches_identical() -> None:
    arena = olkv.Arena(budget=1 << 20)
    c = olkv.KVCache(2, 2, 16, capacity=1 << 14, layout="paged", block_size=16, arena=arena)
    rng = np.random.default_rng(3)
    c.append(rng.standard_normal((2, 2, 40, 16)).astype(np.float32),
             rng.standard_normal((2, 2, 40, 16)).astype(np.float32))
    f = c.fork()
    f.reorder([1, 1])
    before = [x.export() for x in (c, f)]
    big = rng.standard_normal((2, 2, 8000, 16)).astype(np.float32)
    for x in (c, f):
        with pytest.raises(olkv.BudgetError):
            x.append(big, big)
    for x, (k, v) in zip((c, f), before):
        k2, v2 = x.export()
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)
    assert arena.stats()["live_bytes"] == 2 * 2 * 40 * 2 * (16 + 16) * 4


@pytest.mark.parametrize("kw,exc", [
    ({"layout": "blocked"}, ValueError),
    ({"layout": 3}, TypeError),
    ({"layout": "paged", "block_size": 48}, ValueError),
    ({"block_size": 32}, ValueError),
])
def test_layout_validation(kw: dict, exc: type) -> None:
    with pytest.raises(exc):
        olkv.KVCache(1, 1, 4, capacity=8, **kw)


def test_select_validation() -> None:
    for layout in ("contiguous", "paged"):
        c = olkv.KVCache(3, 1, 4, capacity=64, layout=layout)
        for bad, exc in (([], ValueError), ([0, 0], ValueError), ([3], IndexError), ([0, 1, 2, 0], ValueError)):
            with pytest.raises(exc):
                c.select(bad)
        assert c.batch == 3
        c.select([2])
        assert c.batch == 1 and c.lengths.tolist() == [0]


# -- generation states ------------------------------------------------------------------------

PROMPT = np.array([[3, 17, 42, 5, 99, 7, 250, 31, 8, 64, 120, 77, 1, 200, 13, 90, 45, 6, 150, 22]], dtype=np.int64)


def _llama() -> olkv.InferenceSession:
    cfg = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, dtype="float32",
                          max_positions=256)
    return olkv.InferenceSession(M.model_bytes(M.llama_decoder(cfg)), threads=2)


def _greedy(sess: olkv.InferenceSession, st: olkv.GenerationState, steps: int):
    logits = sess.run(["logits"], {"input_ids": PROMPT, "position_ids": np.arange(PROMPT.shape[1])[None]},
                      state=st)[0]
    out, toks = [logits[:, -1]], [int(np.argmax(logits[0, -1]))]
    for i in range(steps):
        pos = np.array([[PROMPT.shape[1] + i]], np.int64)
        logits = sess.run(["logits"], {"input_ids": np.array([[toks[-1]]], np.int64), "position_ids": pos},
                          state=st)[0]
        out.append(logits[:, -1])
        toks.append(int(np.argmax(logits[0, -1])))
    return toks, np.stack(out)


def test_paged_state_equals_contiguous_state() -> None:
    sess = _llama()
    with sess.create_state() as a, sess.create_state(layout="paged", block_size=16) as b:
        ta, la = _greedy(sess, a, 40)
        tb, lb = _greedy(sess, b, 40)
        assert ta == tb
        np.testing.assert_allclose(lb, la, rtol=1e-6, atol=1e-5)
        layers = b.info()["layers"]
        assert all(x["layout"] == "paged" and x["block_size"] == 16 for x in layers)
        assert all(x["blocks_used"] == -(-(PROMPT.shape[1] + 40) // 16) for x in layers)


def test_generate_beam_search_on_paged_state() -> None:
    sess = _llama()
    want = olkv.generate(sess, PROMPT, max_new_tokens=8, num_beams=4, num_return_sequences=2)
    got = olkv.generate(sess, PROMPT, max_new_tokens=8, num_beams=4, num_return_sequences=2,
                        state_options={"layout": "paged", "block_size": 16})
    np.testing.assert_array_equal(got.sequences, want.sequences)
    np.testing.assert_allclose(got.sequences_scores, want.sequences_scores, atol=1e-5)


def _long_llama() -> olkv.InferenceSession:
    cfg = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, dtype="float32",
                          max_positions=2304)
    return olkv.InferenceSession(M.model_bytes(M.llama_decoder(cfg)), threads=2)


def _masked_llama() -> olkv.InferenceSession:
    cfg = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, dtype="float32",
                          max_positions=512)
    return olkv.InferenceSession(M.model_bytes(M.llama_decoder(cfg, attention_mask_input=True,
                                                                position_ids_input=False)), threads=2)


def _run(sess: olkv.InferenceSession, st: olkv.GenerationState, ids: np.ndarray, start: int) -> np.ndarray:
    pos = np.arange(start, start + ids.shape[1], dtype=np.int64)[None]
    return sess.run(["logits"], {"input_ids": ids, "position_ids": pos}, state=st)[0]


def test_prefix_reuse_of_a_2k_prompt_equals_cold_prefill() -> None:
    sess = _long_llama()
    rng = np.random.default_rng(5)
    prompt = rng.integers(1, 256, size=(1, 2048 + 5), dtype=np.int64)
    with sess.create_state() as cold:
        want = _run(sess, cold, prompt, 0)[:, -1]
    with sess.create_state(layout="paged", prefix_cache=True) as first:
        _run(sess, first, prompt, 0)
        assert first.info()["prefix_cache"]["shared_blocks"] == 2048 // 64
    with sess.create_state(layout="paged", prefix_cache=True) as st:
        n = st.reuse_prefix(prompt[0])
        assert n == 2048 and st.length == 2048
        got = _run(sess, st, prompt[:, n:], n)[:, -1]
        tol = 1e-5 * max(1.0, float(np.abs(want).max()))
        assert float(np.abs(got - want).max()) <= tol
        info = st.info()
        assert info["prefix_cache"]["hits"] == 1 and info["prefix_cache"]["tokens_reused"] == 2048
        assert all(x["blocks_shared"] == 32 and x["counters"]["copy_bytes"] == 0 for x in info["layers"])
    other = prompt.copy()
    other[0, 100] += 1  # differs in block 1: only block 0 matches
    with sess.create_state(layout="paged", prefix_cache=True) as st:
        assert st.reuse_prefix(other[0]) == 64


def test_generate_reuses_prefixes() -> None:
    sess = _long_llama()
    prompt = np.random.default_rng(6).integers(1, 256, size=(1, 300), dtype=np.int64)
    want = olkv.generate(sess, prompt, max_new_tokens=6)
    opts = {"layout": "paged", "block_size": 32, "prefix_cache": True}
    a = olkv.generate(sess, prompt, max_new_tokens=6, state_options=opts)
    b = olkv.generate(sess, prompt, max_new_tokens=6, state_options=opts)
    np.testing.assert_array_equal(a.sequences, want.sequences)
    np.testing.assert_array_equal(b.sequences, want.sequences)
    with sess.create_state(layout="paged", block_size=32, prefix_cache=True) as st:
        stats = st.info()["prefix_cache"]
        assert stats["hits"] >= 1 and stats["tokens_reused"] >= 288


@pytest.mark.parametrize("how", ["select after adopt", "reset and load", "positions elsewhere", "left padding"])
def test_prefix_store_registers_only_blocks_whose_ids_it_knows(how: str) -> None:
    """A state registers blocks only under the ids that made them: after select/adopt (rows of
    another request) or reset + load (positions without ids) it registers nothing until a
    reset, and a run at positions other than the state's length registers nothing. A later
    prompt with those ids then gets the tokens of a cold start (these cases registered the
    wrong K/V under them before)."""
    sess, ref = _long_llama(), _long_llama()
    po = dict(layout="paged", block_size=16, prefix_cache=True, max_length=128)
    rng = np.random.default_rng(0)
    pa = rng.integers(0, 255, (1, 40))
    pb = rng.integers(0, 255, (1, 20))
    x = np.arange(11, 23)[None]  # the next 12 tokens complete block 1
    if how == "select after adopt":
        a = sess.create_state(**po)
        _run(sess, a, pa, 0)
        b = sess.create_state(**po)
        _run(sess, b, pb, 0)
        a.adopt(b)
        a.select([1])  # pb's row, 20 positions
        _run(sess, a, x, 20)
        a.close()
        probe = np.concatenate([pa[:, :20], x, [[5]]], axis=1)
    elif how == "reset and load":
        with ref.create_state(max_length=128) as other:
            _run(ref, other, pb, 0)
            presents = other.export()
        a = sess.create_state(**po)
        _run(sess, a, pa, 0)
        a.reset()
        a.load(presents)
        _run(sess, a, x, 20)
        a.close()
        probe = np.concatenate([pa[:, :20], x, [[5]]], axis=1)
    elif how == "positions elsewhere":
        with sess.create_state(**po) as a:
            _run(sess, a, pa, 100)
        probe = np.concatenate([pa, [[5]]], axis=1)
    else:  # a mask with zeros: the padding is not stored, so the blocks hold later tokens' K/V
        sess, ref = _masked_llama(), _masked_llama()
        mask = np.ones_like(pa)
        mask[0, :8] = 0
        with sess.create_state(**po) as a:
            sess.run(["logits"], {"input_ids": pa, "attention_mask": mask}, state=a)
        probe = np.concatenate([pa, [[5]]], axis=1)
    got = olkv.generate(sess, probe, max_new_tokens=8, state_options={k: po[k] for k in ("layout", "block_size",
                                                                                          "prefix_cache")})
    want = olkv.generate(ref, probe, max_new_tokens=8)
    np.testing.assert_array_equal(got.sequences, want.sequences)
    with sess.create_state(**po) as st:  # the probe did reuse what was rightly registered (pa's block 0)
        stats = st.info()["prefix_cache"]
    assert stats["tokens_reused"] == (16 if how in ("select after adopt", "reset and load") else 0)


def test_prefix_cache_is_capped() -> None:
    """Ever new prompts keep the registered blocks within prefix_cache_bytes (they grew with every
    distinct prompt: 12,000 blocks after 3,000 prompts, RSS +360 MB); the most recent prompt is
    still reused; an Engine with a budget caps them at it; a cap without prefix_cache is refused."""
    sess = _long_llama()
    with sess.create_state(layout="paged", block_size=32, prefix_cache=True) as st:
        per_block = st.info()["layers"][0]["kv_heads"] * 32 * 2 * 16 * 4 * len(st.info()["layers"])
    cap = 20 * per_block
    opts = {"layout": "paged", "block_size": 32, "prefix_cache": True, "prefix_cache_bytes": cap}
    rng = np.random.default_rng(7)
    for _ in range(15):  # 15 prompts of 3 full blocks each: 45 blocks registered in all
        olkv.generate(sess, rng.integers(1, 256, size=(1, 100), dtype=np.int64), max_new_tokens=1, state_options=opts)
    last = rng.integers(1, 256, size=(1, 100), dtype=np.int64)
    olkv.generate(sess, last, max_new_tokens=1, state_options=opts)
    with sess.create_state(layout="paged", block_size=32, prefix_cache=True) as st:
        stats = st.info()["prefix_cache"]
        assert stats["max_bytes"] == cap and 0 < stats["registered_bytes"] <= cap, stats
        assert stats["evicted"] > 0, stats
        assert st.reuse_prefix(last[0].tolist()) == 96  # the newest prompt's blocks stay
    with pytest.raises(ValueError, match="prefix_cache_bytes needs prefix_cache=True"):
        sess.create_state(layout="paged", prefix_cache_bytes=cap)
    cfg = M.DecoderConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, vocab=256, max_positions=512)
    masked = olkv.InferenceSession(M.model_bytes(M.build("llama", cfg, attention_mask_input=True)), threads=2)
    with olkv.Engine(masked, budget=1 << 24, block_size=32, prefix_cache=True) as eng:
        eng.add_request(last[0], max_new_tokens=2)
        eng.run_until_done()
    with masked.create_state(layout="paged", block_size=32, prefix_cache=True) as st:
        assert st.info()["prefix_cache"]["max_bytes"] == 1 << 24
    with olkv.Engine(masked, budget=1 << 24, block_size=32, prefix_cache=True,
                     state_options={"prefix_cache_bytes": 1 << 20}):  # overrides the budget's cap
        with masked.create_state(layout="paged", block_size=32, prefix_cache=True) as st:
            assert st.info()["prefix_cache"]["max_bytes"] == 1 << 20
    with pytest.raises(ValueError, match="prefix_cache_bytes needs prefix_cache=True"):
        olkv.Engine(masked, block_size=32, state_options={"prefix_cache_bytes": 1 << 20})


def test_prefix_reuse_on_an_export_without_declared_cache_geometry() -> None:
    """onnxruntime-genai exports leave the K/V head size symbolic, so a state's caches are created
    by its first run. The geometry that run finds serves every later state of the session, which
    then has its caches at creation: reuse_prefix attaches the shared blocks (it returned 0 before)
    and the continued prefill equals a cold one."""
    import _fixtures as fx

    sess = olkv.InferenceSession(fx.model_path("llama3-genai"), threads=1)
    ids = np.random.default_rng(8).integers(3, 256, size=(1, 40), dtype=np.int64)

    def run(st: olkv.GenerationState, part: np.ndarray, total: int) -> np.ndarray:
        return sess.run(["logits"], {"input_ids": part, "attention_mask": np.ones((1, total), np.int64)},
                        state=st)[0]

    opts = dict(batch=1, max_length=64, layout="paged", block_size=16, prefix_cache=True)
    with sess.create_state(**opts) as first:
        assert first.info()["layers"] == []  # nothing to size the caches by before the first run
        want = run(first, ids, 40)[:, -1]
    with sess.create_state(**opts) as st:
        assert st.info()["layers"]  # the first run showed the geometry: created at once
        n = st.reuse_prefix(ids[0])
        assert n == 32 and st.length == 32
        got = run(st, ids[:, n:], 40)[:, -1]
        assert float(np.abs(got - want).max()) <= 1e-5 * max(1.0, float(np.abs(want).max()))
        assert st.info()["prefix_cache"]["hits"] == 1


def test_prefix_cache_errors() -> None:
    sess = _llama()
    with pytest.raises(ValueError):
        sess.create_state(prefix_cache=True)  # contiguous
    with pytest.raises(ValueError):
        sess.create_state(layout="paged", prefix_cache=True, budget=1 << 24)
    with pytest.raises(TypeError):
        sess.create_state(layout="paged", prefix_cache=1)
    with sess.create_state(layout="paged") as st, pytest.raises(ValueError):
        st.reuse_prefix(PROMPT[0].tolist())
    with sess.create_state(layout="paged", prefix_cache=True) as st:
        assert st.reuse_prefix(PROMPT[0].tolist()) == 0  # nothing registered yet
        _greedy(sess, st, 1)
        with pytest.raises(ValueError):
            st.reuse_prefix(PROMPT[0].tolist())  # not empty
    with pytest.raises(ValueError):
        sess.create_state(layout="paged", block_size=20)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_state_select_keeps_sequences(layout: str) -> None:
    """select() on a state of 3 sequences keeps the chosen ones: the next steps' logits equal
    those of a state that ran only those sequences."""
    sess = _llama()
    ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], np.int64)
    pos = np.arange(4)[None].repeat(3, 0)
    with sess.create_state(batch=3, layout=layout) as st, sess.create_state(batch=2, layout=layout) as ref:
        sess.run(["logits"], {"input_ids": ids, "position_ids": pos}, state=st)
        sess.run(["logits"], {"input_ids": ids[[2, 0]], "position_ids": pos[:2]}, state=ref)
        st.select([2, 0])
        assert st.batch == 2 and st.lengths.tolist() == [4, 4]
        nxt = np.array([[1], [2]], np.int64)
        got = sess.run(["logits"], {"input_ids": nxt, "position_ids": np.full((2, 1), 4)}, state=st)[0]
        want = sess.run(["logits"], {"input_ids": nxt, "position_ids": np.full((2, 1), 4)}, state=ref)[0]
        np.testing.assert_array_equal(got, want)
        with pytest.raises(IndexError):
            st.select([5])
        with pytest.raises(ValueError):
            st.select([0, 0])
        assert st.batch == 2


def test_integer_arguments_of_several_dimensions_are_refused() -> None:
    """[batch, s] ids given to reuse_prefix (or index arrays of two dimensions) were ravelled into
    one sequence and attached a prefix no row has: ValueError, the state unchanged."""
    sess = _masked_llama()
    prompt = np.arange(1, 41, dtype=np.int64)[None]
    with sess.create_state(layout="paged", block_size=16, prefix_cache=True) as first:
        first_logits = sess.run(["logits"], {"input_ids": prompt, "attention_mask": np.ones_like(prompt)},
                                state=first)[0]
        assert np.isfinite(first_logits).all()
    with sess.create_state(batch=2, layout="paged", block_size=16, prefix_cache=True) as st:
        with pytest.raises(ValueError, match=r"token_ids must be one integer or a 1-D sequence of them, got shape"):
            st.reuse_prefix(prompt.reshape(2, 20))
        assert st.length == 0
        with pytest.raises(ValueError, match="1-D"):
            st.reorder(np.zeros((2, 1), np.int64))
    c = olkv.KVCache(2, 2, 16, capacity=8)
    with pytest.raises(ValueError, match="1-D"):
        c.select(np.array([[0], [1]]))


def test_a_small_paged_cache_under_a_budget_that_holds_it_takes_its_blocks() -> None:
    """A pool's slab (2048 tokens or a huge page of blocks) is at most half an arena's budget: a
    64-token paged cache under a budget of 20 times its capacity was refused its first token
    (a 16 MiB slab), and so was a paged state under 16 times its whole size."""
    k = np.ones((1, 8, 1, 128), np.float32)
    full = 64 * 8 * 128 * 4 * 2
    arena = olkv.Arena(budget=20 * full)
    c = olkv.KVCache(1, 8, 128, capacity=64, layout="paged", arena=arena)
    c.append(k, k)
    assert c.lengths.tolist() == [1] and arena.stats()["committed_bytes"] <= 10 * full
    sess = _masked_llama()
    st = sess.create_state(max_length=128, budget=16 * 128 * 2 * 2 * 16 * 4 * 2, layout="paged")
    ids = np.array([[1, 2, 3]])
    out = sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)}, state=st)[0]
    assert np.isfinite(out).all() and st.length == 3
