"""onnx_light_kv.Engine (continuous batching): every request gets exactly the tokens generate()
gives it alone (greedy and seeded sampling, stop rules, requests joining and leaving mid-run,
abort, budget pressure), with one model call per step over all running requests."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

import _fixtures as fx
import _ort_compare as oc
from _gen_common import ours

olkv = pytest.importorskip("onnx_light_kv")
from onnx_light_kv.serve import Engine  # noqa: E402

MODEL = "llama-mask"

#: (prompt, options) of requests that differ in length, new tokens, sampling and stop rules
REQUESTS: List[Dict[str, Any]] = [
    dict(input_ids=[3, 17, 42, 5, 99, 7, 250], max_new_tokens=12),
    dict(input_ids=[1, 1, 2, 3], max_new_tokens=5),
    dict(input_ids=[200, 9], max_new_tokens=9, do_sample=True, temperature=0.9, top_p=0.9, seed=7),
    dict(input_ids=[8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 4], max_new_tokens=7, do_sample=True, top_k=20, seed=3),
    dict(input_ids=[11, 12, 13], max_new_tokens=10, repetition_penalty=1.3),
    dict(input_ids=[60, 61], max_new_tokens=8, do_sample=True, min_p=0.05, seed=11),
    dict(input_ids=[5, 6, 7], max_new_tokens=10, no_repeat_ngram_size=2),
    dict(input_ids=[3, 17, 42], max_new_tokens=8, bad_words_ids=[[75], [23, 99]], suppress_tokens=[189],
         sequence_bias={(223,): -2.0, (99, 27): 1.5}),
    dict(input_ids=[40, 41, 42, 43], max_new_tokens=4, do_sample=True, seed=4, typical_p=0.9, epsilon_cutoff=0.001,
         eta_cutoff=0.001, begin_suppress_tokens=[23], forced_eos_token_id=7, eos_token_id=[7, 75],
         exponential_decay_length_penalty=(3, 1.5)),
]


def _alone(sess: Any, req: Dict[str, Any]) -> List[int]:
    """The request's new tokens from generate() on its own, up to where it stopped."""
    kw = dict(req)
    ids = np.array(kw.pop("input_ids"))
    out = olkv.generate(sess, ids, **kw)
    new = [int(t) for t in out.new_tokens[0]]
    stop = olkv.generation.StopCondition.of(kw.get("eos_token_id"), kw.get("stop_sequences"))
    seq = list(ids)
    for i, t in enumerate(new):
        seq.append(t)
        if stop.hit(np.array(seq)):
            return new[:i + 1]
    return new


def _with_stops(sess: Any) -> List[Dict[str, Any]]:
    """REQUESTS plus stop rules taken from their own greedy/sampled runs (so they do fire)."""
    reqs = [dict(r) for r in REQUESTS]
    first = _alone(sess, reqs[0])
    reqs[0]["eos_token_id"] = [first[5]]           # stops at (the first occurrence of) token 6
    third = _alone(sess, reqs[4])
    reqs[4]["stop_sequences"] = [third[2:4], [255, 254, 253]]
    return reqs


def _run(engine: Engine, reqs: List[Dict[str, Any]], add_at: Dict[int, int]) -> Dict[int, List[int]]:
    """Step the engine, adding request i at step add_at[i]; returns the tokens by request index,
    checking that the step outputs stream exactly the request's tokens."""
    assert set(add_at) == set(range(len(reqs))), "every request needs its step"
    ids: Dict[int, int] = {}
    streamed: Dict[int, List[int]] = {}
    finished: Dict[int, bool] = {}
    step = 0
    while len(ids) < len(reqs) or engine.has_work():
        for i, at in add_at.items():
            if at == step:
                kw = dict(reqs[i])
                ids[engine.add_request(np.array(kw.pop("input_ids")), **kw)] = i
        for out in engine.step():
            assert not finished.get(out.request_id), "output after the finished one"
            streamed.setdefault(out.request_id, []).extend(out.tokens)
            finished[out.request_id] = out.finished
        step += 1
        assert step < 500
    assert all(finished.values()) and set(finished) == set(ids)
    got = {}
    for rid, i in ids.items():
        assert engine.request(rid).tokens == streamed[rid]
        got[i] = streamed[rid]
    return got


@pytest.mark.parametrize("max_batch", [1, 3, 16])
def test_concurrent_requests_equal_generate_alone(max_batch: int) -> None:
    sess = ours(MODEL)
    reqs = _with_stops(sess)
    want = [_alone(sess, r) for r in reqs]
    assert len(want[0]) == 6 and len(want[4]) <= 4  # the stop rules fire
    with Engine(sess, max_batch=max_batch, max_length=64) as eng:
        got = _run(eng, reqs, {i: 0 for i in range(len(reqs))})
        st = eng.stats()
    for i in range(len(reqs)):
        assert got[i] == want[i], f"request {i}"
    assert st["running"] == st["queued"] == st["prefilling"] == 0
    # requests 0 and 4 stop on their stop rules, the last on an eos id (its length penalty
    # raises them; the forced eos is one too)
    assert st["finished"]["stop"] == 3 and st["finished"]["length"] == len(reqs) - 3
    assert want[-1][-1] in (7, 75)
    assert st["generated_tokens"] == sum(len(w) for w in want)


def test_min_new_tokens_holds_back_eos_as_generate_does() -> None:
    sess = ours(MODEL)
    first = _alone(sess, dict(input_ids=[3, 17, 42], max_new_tokens=8))
    reqs = [dict(input_ids=[3, 17, 42], max_new_tokens=8, eos_token_id=first[1], min_new_tokens=m) for m in (0, 2, 5)]
    want = [_alone(sess, r) for r in reqs]
    assert len(want[0]) == 2 and first[1] not in want[2][:5]  # the eos fires at once without the rule
    with Engine(sess, max_batch=3, max_length=32) as eng:
        got = _run(eng, reqs, {0: 0, 1: 0, 2: 1})
    assert [got[i] for i in range(3)] == want


@pytest.mark.parametrize("block_size,prefix_cache", [(16, False), (16, True), (None, True)])
def test_paged_engine_equals_generate_alone(block_size: Any, prefix_cache: bool) -> None:
    """On the paged layout (with and without the prefix cache) requests joining at different
    steps get generate()'s tokens; with the prefix cache, requests sharing a long prompt prefix
    attach it instead of prefilling it, and the blocks gauges are filled."""
    sess = ours(MODEL)
    reqs = _with_stops(sess)
    shared = list(range(30, 70))  # 40 tokens: two full 16-token blocks
    reqs += [dict(input_ids=shared + [5, 6], max_new_tokens=6), dict(input_ids=shared + [7], max_new_tokens=5),
             dict(input_ids=shared + [8, 9, 10], max_new_tokens=4, do_sample=True, seed=5)]
    want = [_alone(sess, r) for r in reqs]
    with Engine(sess, max_batch=4, max_length=64, block_size=block_size, prefix_cache=prefix_cache) as eng:
        assert eng.paged and (eng.block_size == 16 or block_size is None)
        got = _run(eng, reqs, {0: 0, 1: 0, 2: 2, 3: 3, 4: 9, 5: 10, 6: 5, 7: 0, 8: 12, 9: 14, 10: 6, 11: 3})
        st = eng.stats()
        reused = [eng.request(rid).reused_tokens for rid in sorted(eng._requests)]
    assert st["running"] == 0 and st["cache_blocks_used"] == 0 and st["cache_blocks_free"] is None  # idle
    for i in range(len(reqs)):
        assert got[i] == want[i], f"request {i}"
    if prefix_cache:
        bs = eng.block_size
        assert st["prefix_tokens"] >= 2 * (len(shared) // bs) * bs and max(reused) >= (len(shared) // bs) * bs
    else:
        assert st["prefix_tokens"] == 0 and not any(reused)


def test_paged_engine_budget_counts_blocks_not_max_length() -> None:
    """Paged admission counts prompt + max_new_tokens in whole blocks: a budget that cannot hold
    max_length positions still runs short requests; add_request refuses a request bigger than
    the whole budget (the requests beside it run on), and creation a budget below one block."""
    sess = ours(MODEL)
    with Engine(sess, max_length=64) as eng:
        per_position = eng.stats()["request_bytes"] // 64
    req = dict(input_ids=[3, 17, 42, 5], max_new_tokens=4)  # 8 positions: one 16-token block
    want = _alone(sess, req)
    with Engine(sess, max_length=64, block_size=16, budget=2 * 16 * per_position) as eng:
        got = _run(eng, [req, req, req], {0: 0, 1: 0, 2: 0})
        assert eng.stats()["admission_paused"] > 0  # two fit at once, the third waited
    assert got == {0: want, 1: want, 2: want}
    with Engine(sess, max_length=64, block_size=16, budget=16 * per_position) as eng:
        rid = eng.add_request(**req)
        with pytest.raises(ValueError, match="can never fit.*budget"):
            eng.add_request(list(range(20)), max_new_tokens=4)  # 24 positions: two blocks
        eng.run_until_done()
        assert eng.request(rid).tokens == want and eng.stats()["requests"] == 1
    with pytest.raises(olkv.BudgetError, match="one block of 16 positions"):
        Engine(sess, max_length=64, block_size=16, budget=16 * per_position - 1)


class _Failing:
    """A session proxy whose runs fail (RuntimeError) where ``when(input_ids)`` holds, once."""

    def __init__(self, sess: Any, when: Any) -> None:
        self._sess, self._when = sess, when
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)

    def run(self, names: Any, feeds: Any, state: Any = None) -> Any:
        if not self.failed and state is not None and self._when(feeds["input_ids"]):
            self.failed = True
            raise RuntimeError("the model call failed")
        return self._sess.run(names, feeds, state=state)


@pytest.mark.parametrize("call,failed", [
    ("decode", {0, 1}),  # the batched call of the two running requests: both end
    ("prefill", {2}),    # one request's prefill (a state of its own): it alone ends
    ("admission", {2}),  # its state cannot be made: it alone ends
])
def test_a_failed_model_call_ends_only_the_requests_it_ran(call: str, failed: Any) -> None:
    """Requests 0 and 1 run; 2 is prefilled in the step of the failing decode call and 3 waits
    for a free slot. The requests the failed call ran end with finish_reason "error" and no
    more tokens; the others get generate()'s tokens, and the engine keeps serving."""
    sess = ours(MODEL)
    reqs = [dict(r, max_new_tokens=6) for r in REQUESTS[:4]]
    want = [_alone(sess, r) for r in reqs]
    when = {"decode": lambda ids: ids.shape == (2, 1), "prefill": lambda ids: ids.shape == (1, 2),
            "admission": None}[call]  # (request 2's prompt is the only one of 2 tokens)
    failing = _Failing(sess, when or (lambda ids: False))
    with Engine(failing, max_batch=3, max_length=64) as eng:
        if call == "admission":
            from onnx_light_kv.serve import engine as engine_module

            made = engine_module.StateRunner

            def runner(*a: Any, **kw: Any) -> Any:
                if len(eng._rows) == 2:  # request 2's state, with 0 and 1 running
                    engine_module.StateRunner = made
                    raise RuntimeError("the state cannot be made")
                return made(*a, **kw)

            engine_module.StateRunner = runner
        try:
            ids = [eng.add_request(**r) for r in reqs[:2]]
            eng.step()
            ids += [eng.add_request(**r) for r in reqs[2:]]
            while eng.has_work():
                eng.step()
        finally:
            if call == "admission":
                engine_module.StateRunner = made
        for i, rid in enumerate(ids):
            r = eng.request(rid)
            if i in failed:
                assert r.finish_reason == "error" and r.error and r.tokens == want[i][:len(r.tokens)], i
                assert len(r.tokens) <= 1, i
            else:
                assert r.tokens == want[i] and r.finish_reason == "length", i
        assert eng.stats()["finished"]["error"] == len(failed)
        rid = eng.add_request(**reqs[0])
        eng.run_until_done()
        assert eng.request(rid).tokens == want[0]


def test_close_aborts_every_request_and_stops_the_engine() -> None:
    """close() ends the running, the queued and the just-added requests with "abort"; after
    it the engine takes no request and runs no step; request ids are never reused."""
    sess = ours(MODEL)
    eng = Engine(sess, max_batch=1, max_length=64)
    running = eng.add_request([3, 17, 42], max_new_tokens=8)
    queued = eng.add_request([1, 2], max_new_tokens=8)
    eng.step()
    added = eng.add_request([5, 6], max_new_tokens=8)  # still in the inbox
    assert eng.stats()["running"] == 1 and eng.stats()["queued"] == 2
    eng.close()
    assert [eng.request(r).finish_reason for r in (running, queued, added)] == ["abort"] * 3
    st = eng.stats()
    assert not eng.has_work() and st["requests"] == 3 and st["finished"]["abort"] == 3 and st["queued"] == 0
    with pytest.raises(ValueError, match="closed"):
        eng.step()
    with pytest.raises(ValueError, match="closed"):
        eng.add_request([1, 2], max_new_tokens=2)
    eng.close()  # again: nothing happens
    with Engine(sess, max_length=64) as other:
        assert other.add_request([1, 2], max_new_tokens=2) > added


def test_engine_refuses_pickling_and_copies() -> None:
    """A copy used to share the engine's requests and generation state (closing the copy aborted
    the original's requests and closed its caches); pickling failed on a lock, naming neither."""
    import copy
    import pickle

    sess = ours(MODEL)
    with Engine(sess, max_length=32) as eng:
        rid = eng.add_request([3, 17, 42], max_new_tokens=4)
        eng.step()
        with pytest.raises(TypeError, match="Engine cannot be pickled: it holds native memory"):
            pickle.dumps(eng)
        for fn in (copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="Engine cannot be copied.*fresh\\(\\)"):
                fn(eng)
        eng.run_until_done()
        assert eng.request(rid).finish_reason == "length" and len(eng.request(rid).tokens) == 4


def test_requests_join_and_leave_mid_run() -> None:
    sess = ours(MODEL)
    reqs = _with_stops(sess)
    want = [_alone(sess, r) for r in reqs]
    with Engine(sess, max_batch=4, max_length=64) as eng:
        got = _run(eng, reqs, {0: 0, 1: 0, 2: 2, 3: 3, 4: 9, 5: 10, 6: 4, 7: 6, 8: 2})
    for i in range(len(reqs)):
        assert got[i] == want[i], f"request {i}"


def test_chunked_prefill_equals_generate() -> None:
    sess = ours(MODEL)
    reqs = [dict(r) for r in REQUESTS[:4]]
    want = [_alone(sess, r) for r in reqs]
    with Engine(sess, max_batch=4, max_tokens_per_step=3, max_length=64) as eng:
        got = _run(eng, reqs, {0: 0, 1: 0, 2: 1, 3: 1})
        assert eng.stats()["prompt_tokens"] == sum(len(r["input_ids"]) for r in reqs)
    for i in range(len(reqs)):
        assert got[i] == want[i], f"request {i}"


class _Counting:
    """A session proxy that records the batch of every state run."""

    def __init__(self, sess: Any) -> None:
        self._sess = sess
        self.batches: List[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)

    def run(self, names: Any, feeds: Any, state: Any = None) -> Any:
        self.batches.append(feeds["input_ids"].shape[0])
        return self._sess.run(names, feeds, state=state)


def test_one_model_call_per_step_over_all_running_rows() -> None:
    sess = _Counting(ours(MODEL))
    with Engine(sess, max_batch=8, max_length=64) as eng:
        for r in REQUESTS[:4]:
            kw = dict(r)
            kw.update(max_new_tokens=6)
            eng.add_request(kw.pop("input_ids"), **kw)
        eng.step()  # the four prefills (batch 1 each)
        assert sess.batches == [1, 1, 1, 1]
        sess.batches.clear()
        outs = eng.step()
        assert sess.batches == [4] and len(outs) == 4 and all(len(o.tokens) == 1 for o in outs)
        assert eng.stats()["running"] == 4
        info = eng._state.info()["totals"]
        assert info["copy_bytes"] == 0  # joins moved the rows, nothing was copied


def test_abort() -> None:
    sess = ours(MODEL)
    reqs = [dict(r, max_new_tokens=10) for r in REQUESTS[:3]]
    want = [_alone(sess, r) for r in reqs]
    with Engine(sess, max_batch=4, max_length=64) as eng:
        rids = [eng.add_request(np.array(r["input_ids"]), **{k: v for k, v in r.items() if k != "input_ids"})
                for r in reqs]
        queued = eng.add_request([5, 6, 7], max_new_tokens=4)
        assert eng.abort(queued)
        streamed: Dict[int, List[int]] = {r: [] for r in rids}
        for _ in range(3):
            for o in eng.step():
                assert o.request_id != queued or (o.finished and not o.tokens)
                if o.request_id in streamed:
                    streamed[o.request_id].extend(o.tokens)
        assert eng.abort(rids[1]) and not eng.abort(rids[1] + 100)
        outs = eng.step()
        ab = [o for o in outs if o.request_id == rids[1]]
        assert ab == [(rids[1], [], True)]
        assert eng.stats()["running"] == 2
        for o in outs:
            if o.request_id in streamed:
                streamed[o.request_id].extend(o.tokens)
        while eng.has_work():
            for o in eng.step():
                streamed[o.request_id].extend(o.tokens)
        assert eng.request(rids[1]).finish_reason == "abort"
        assert not eng.abort(rids[1])
    assert streamed[rids[0]] == want[0] and streamed[rids[2]] == want[2]
    assert streamed[rids[1]] == want[1][:len(streamed[rids[1]])] and len(streamed[rids[1]]) == 3


def test_budget_pressure_queues_instead_of_failing() -> None:
    sess = ours(MODEL)
    reqs = [dict(r) for r in REQUESTS]
    want = [_alone(sess, r) for r in reqs]
    probe = Engine(sess, max_length=64)
    per = probe.stats()["request_bytes"]
    probe.close()
    assert per > 0
    with Engine(sess, max_batch=16, max_length=64, budget=2 * per + per // 2) as eng:
        ids = {eng.add_request(np.array(r["input_ids"]), **{k: v for k, v in r.items() if k != "input_ids"}): i
               for i, r in enumerate(reqs)}
        got: Dict[int, List[int]] = {i: [] for i in ids.values()}
        peak = 0
        while eng.has_work():
            for o in eng.step():
                got[ids[o.request_id]].extend(o.tokens)
            st = eng.stats()
            peak = max(peak, st["running"] + st["prefilling"])
            assert st["cache_reserved_bytes"] <= eng.budget
        assert peak == 2 and eng.stats()["admission_paused"] > 0
    for i in range(len(reqs)):
        assert got[i] == want[i], f"request {i}"


def test_refusals() -> None:
    sess = ours(MODEL)
    with Engine(sess, max_length=16) as eng:
        with pytest.raises(ValueError, match="can never fit"):
            eng.add_request(list(range(10)), max_new_tokens=7)
        with pytest.raises(TypeError):
            eng.add_request(np.array([1.5, 2.0]))
        with pytest.raises(ValueError):
            eng.add_request([])
        with pytest.raises(ValueError):
            eng.add_request([1, 2], temperature=0.0, do_sample=True)
        with pytest.raises(ValueError):
            eng.add_request([1, 2], max_new_tokens=0)
        with pytest.raises(ValueError, match="vocabulary"):  # the model fixes 256 logits
            eng.add_request([1, 256], max_new_tokens=4)
        with pytest.raises(TypeError, match="top_k"):
            eng.add_request([1, 2], max_new_tokens=4, top_k=2.5)
        per = eng.stats()["request_bytes"]
    with pytest.raises(olkv.BudgetError, match="max_length=16"):
        Engine(sess, max_length=16, budget=per - 1)
    with pytest.raises(ValueError, match="block_size"):
        Engine(sess, block_size=24)
    with pytest.raises(TypeError, match="prefix_cache"):
        Engine(sess, prefix_cache="yes")
    with pytest.raises(ValueError, match="layout"):
        Engine(sess, state_options={"layout": "paged"})
    with pytest.raises(NotImplementedError, match="attention_mask"):
        Engine(ours("llama"))
    with pytest.raises(NotImplementedError, match="cache path"):
        Engine(oc.ort(_gen_model()))


def _gen_model() -> Any:
    from _gen_common import model

    return model(MODEL)


def test_logprobs_are_the_model_log_softmax() -> None:
    sess = ours(MODEL)
    prompt = np.array(REQUESTS[0]["input_ids"])
    ref = olkv.generate(sess, prompt, max_new_tokens=5, return_scores=True)
    with Engine(sess, max_length=64) as eng:
        rid = eng.add_request(prompt, max_new_tokens=5, logprobs=3)
        eng.run_until_done()
        req = eng.request(rid)
    assert req.tokens == [int(t) for t in ref.new_tokens[0]]
    for t, (tok, lp, top) in enumerate(zip(req.tokens, req.token_logprobs, req.top_logprobs)):
        scores = ref.scores[t][0]
        assert lp == pytest.approx(float(scores[tok]), abs=1e-5)
        assert len(top) == 3 and tok in top  # greedy: the chosen token is the most probable
        assert max(top.values()) == pytest.approx(lp, abs=1e-6)


FIXTURES = ["llama-dynamo", "qwen2-optimum", "gpt2-torchscript"]


@pytest.mark.parametrize("name", [n for n in FIXTURES if n in fx.names()])
def test_fixture_models(name: str) -> None:
    try:
        sess = oc.ours(fx.model_path(name))
    except NotImplementedError as e:
        pytest.skip(f"{name}: {e}")
    io = olkv.generation.DecoderIO.from_session(sess)
    if io.attention_mask is None or not olkv.generation.runner.cache_path_available(sess):
        pytest.skip(f"{name}: no attention_mask input or no cache path")
    reqs = [dict(input_ids=[5, 17, 42, 99, 7, 130], max_new_tokens=8),
            dict(input_ids=[1, 2, 3], max_new_tokens=6, do_sample=True, seed=5, top_k=10),
            dict(input_ids=[200, 9, 9, 4, 8], max_new_tokens=7)]
    want = [_alone(sess, r) for r in reqs]
    with Engine(sess, max_batch=3, max_length=32) as eng:
        got = _run(eng, reqs, {0: 0, 1: 2, 2: 3})
    for i in range(len(reqs)):
        assert got[i] == want[i], f"{name} request {i}"


def test_state_select_and_adopt() -> None:
    sess = ours(MODEL)
    feeds = lambda n: {"input_ids": np.arange(1, n + 1)[None], "position_ids": np.arange(n)[None],  # noqa: E731
                       "attention_mask": np.ones((1, n), np.int64)}
    a, b = sess.create_state(max_length=32), sess.create_state(max_length=32)
    sess.run(["logits"], feeds(4), state=a)
    sess.run(["logits"], feeds(6), state=b)
    with pytest.raises(TypeError):
        a.adopt("x")
    with pytest.raises(ValueError):
        a.adopt(a)
    odd = sess.create_state(max_length=16)
    sess.run(["logits"], feeds(2), state=odd)
    with pytest.raises(ValueError, match="max_length"):
        a.adopt(odd)
    assert not odd.closed and a.batch == 1
    a.adopt(b)
    assert b.closed and a.batch == 2 and a.length == 6 and a.lengths.tolist() == [4, 6]
    with pytest.raises(ValueError, match="twice"):
        a.select([1, 1])
    with pytest.raises(IndexError):
        a.select([2])
    a.select([1])
    assert a.batch == 1 and a.length == 6 and a.lengths.tolist() == [6]
    assert a.info()["totals"]["copy_bytes"] == 0


@pytest.mark.parametrize("name, refused", [("gemma2-optimum", True), ("gemma3-optimum", True), ("granite-genai", False)])
def test_models_positioned_by_slot_are_refused(name: str, refused: bool) -> None:
    """Exports without position_ids take positions from the slot: a request joining a longer
    batch gained left padding and was run at shifted positions (the shorter request's tokens
    differed from generate alone from its first decode step). Refused; a GroupQueryAttention
    export (each row's length) and models with position_ids are served."""
    if name not in fx.names():
        pytest.skip(f"fixture {name} missing")
    sess = oc.ours(fx.model_path(name))
    if refused:
        with pytest.raises(NotImplementedError, match="takes position_ids"):
            Engine(sess, max_length=64)
        return
    prompts = [np.arange(3, 8), np.arange(20, 37)]
    with Engine(sess, max_batch=4, max_length=64) as eng:
        ids = [eng.add_request(p, max_new_tokens=6) for p in prompts]
        eng.run_until_done()
        for rid, p in zip(ids, prompts):
            assert eng.request(rid).tokens == [int(t) for t in olkv.generate(sess, p, max_new_tokens=6).new_tokens[0]]


TABLE = "gpt2-torchscript"  # learned positions: a 128-row table


@pytest.mark.skipif(TABLE not in fx.names(), reason=f"fixture {TABLE} missing")
def test_position_table_counts_the_positions_run() -> None:
    """The last new token is chosen from the logits of the position before it and never run,
    so a request may end exactly one token past the position table (as a Generator does)."""
    sess = oc.ours(fx.model_path(TABLE))
    rows = olkv.generation.DecoderIO.from_session(sess).max_positions
    assert rows == 128
    prompt = (np.arange(rows - 8) * 7) % 256
    g = olkv.Generator(sess)
    g.append_tokens(prompt)
    for _ in range(9):
        g.generate_next_token()
    with Engine(sess, max_length=2 * rows) as eng:
        assert eng.max_length == rows + 1  # lowered to what the model can serve
        with pytest.raises(ValueError, match=f"exceed the engine's max_length={rows + 1}"):
            eng.add_request(prompt, max_new_tokens=10)
        rid = eng.add_request(prompt, max_new_tokens=9)  # runs all 128 positions
        eng.run_until_done()
        assert eng.request(rid).tokens == [int(t) for t in g.sequences[0, prompt.size:]]


def test_steps_from_two_threads_and_close_during_a_step() -> None:
    """Two threads stepping one engine run one step at a time (they raised IndexError and left a
    request unfinished); every request equals generate() alone. A close() from another thread
    waits for the step in progress instead of failing it."""
    import threading

    sess = ours(MODEL)
    eng = Engine(sess, max_batch=4, max_length=64)
    ids = [eng.add_request(**r) for r in REQUESTS]
    errors: List[BaseException] = []

    def stepper() -> None:
        try:
            while eng.has_work():
                eng.step()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=stepper) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for rid, req in zip(ids, REQUESTS):
        assert eng.request(rid).tokens == _alone(sess, req), req
    eng.add_request(**REQUESTS[0])
    real = eng._step
    entered = threading.Event()

    def slow() -> Any:
        entered.set()
        import time

        time.sleep(0.2)
        return real()

    eng._step = slow  # type: ignore[method-assign]
    t = threading.Thread(target=stepper)
    t.start()
    assert entered.wait(30)
    eng.close()  # waits for that step
    t.join(30)
    assert errors == [] or all(isinstance(e, ValueError) and "closed" in str(e) for e in errors), errors
    assert eng.stats()["running"] == 0


def test_a_request_whose_prompt_fails_ends_alone() -> None:
    """A prompt the model refuses (a token id beyond a vocabulary the engine could not check
    up front) ends that request with finish_reason "error"; the others run on unharmed."""
    sess = ours(MODEL)
    want = _alone(sess, REQUESTS[0])
    with Engine(sess, max_length=64) as eng:
        a = eng.add_request(**REQUESTS[0])
        eng.step()
        eng._vocab = None  # as for a model whose logits have a symbolic vocabulary
        b = eng.add_request([7, 9999], max_new_tokens=4)
        while eng.has_work():
            eng.step()
        assert eng.request(a).tokens == want and eng.request(a).finish_reason in ("stop", "length")
        rb = eng.request(b)
        assert rb.finish_reason == "error" and "9999" in rb.error and rb.tokens == []
        assert eng.stats()["finished"]["error"] == 1


GENAI = "llama3-genai"  # a GroupQueryAttention export: its K/V head size is symbolic


@pytest.mark.skipif(GENAI not in fx.names(), reason=f"fixture {GENAI} missing")
def test_cache_geometry_from_the_first_run_is_known_at_creation() -> None:
    """A model whose states learn their K/V geometry from the first run (the genai exports'
    symbolic head size) still gets its block size and per-request bytes at creation: the paged
    layout starts, and the budget holds as many requests as it has room for."""
    sess = oc.ours(fx.model_path(GENAI))
    with Engine(sess, max_length=32) as eng:
        per = eng.stats()["request_bytes"]
    assert per > 0
    with Engine(sess, max_length=32, block_size=16, prefix_cache=True) as eng:
        assert eng.block_size == 16 and eng.paged
    reqs = [dict(input_ids=[3 + i, 9, 4, 8], max_new_tokens=5) for i in range(5)]
    want = [_alone(sess, r) for r in reqs]
    with Engine(sess, max_batch=8, max_length=32, budget=2 * per) as eng:
        ids = {eng.add_request(**r): i for i, r in enumerate(reqs)}
        peak = 0
        while eng.has_work():
            eng.step()
            st = eng.stats()
            peak = max(peak, st["running"] + st["prefilling"])
            assert st["cache_reserved_bytes"] <= eng.budget
        assert peak == 2 and st["admission_paused"] > 0
        assert {i: eng.request(rid).tokens for rid, i in ids.items()} == dict(enumerate(want))


def test_prefix_hits_count_since_the_start() -> None:
    """prefix_hits (served as a Prometheus counter) counts the requests that attached a prefix,
    and keeps its value while no request runs."""
    sess = ours(MODEL)
    shared = [(11 * i + 5) % 256 for i in range(40)]  # a prompt no other test registers
    with Engine(sess, max_length=64, block_size=16, prefix_cache=True) as eng:
        seen, reused = [], []
        for k in range(3):
            rid = eng.add_request(shared + [k], max_new_tokens=3)
            while eng.has_work():
                eng.step()
                seen.append(eng.stats()["prefix_hits"])
            reused.append(eng.request(rid).reused_tokens)
        st = eng.stats()
    assert reused == [0, 32, 32]
    assert st["prefix_hits"] == 2 and st["prefix_tokens"] == 64 and seen == sorted(seen) and seen[-1] == 2


@pytest.mark.parametrize("opts", [dict(quant="int8", residual=0), dict(quant="int4", residual=16),
                                  dict(quant="int8")])
def test_quantized_paged_engine_keeps_its_caches_within_the_budget(opts: Dict[str, Any]) -> None:
    """A quantized paged state commits its native ring (residual + quant_group rows) when it is
    created, whatever its length, and a sealed block per quant_group positions beyond the residual
    window: admission counts both, so the caches committed never exceed what the engine counts,
    nor that the budget (it counted only the positions in whole blocks, and the caches committed up
    to five times the budget)."""
    sess = ours(MODEL)
    with Engine(sess, max_length=128, block_size=32, state_options=opts) as probe:
        one = probe._cost(40)
    budget = 3 * one + one // 2
    with Engine(sess, max_batch=16, max_length=128, block_size=32, budget=budget, state_options=opts) as eng:
        rng = np.random.default_rng(0)
        for _ in range(10):
            eng.add_request(rng.integers(0, 200, 20), max_new_tokens=20)
        peak = 0
        while eng.has_work():
            eng.step()
            st = eng.stats()
            assert st["cache_committed_bytes"] <= st["cache_reserved_bytes"] <= budget, st
            peak = max(peak, st["running"] + st["prefilling"])
        assert peak == 3


@pytest.mark.parametrize("block_size", [None, 16], ids=["contiguous", "paged"])
def test_requests_adopt_on_a_machine_too_small_to_reserve_max_length(monkeypatch: Any, block_size: Any) -> None:
    """The Engine gives each request's state its max_length, even where generate() would not
    reserve that much (a quarter of the machine's memory, simulated small here): requests join
    one state, which needs one fixed max_length."""
    from onnx_light_kv import _system

    monkeypatch.setattr(_system, "physical_memory", lambda: 1 << 16)  # a quarter holds 32 positions
    sess = ours(MODEL)
    eng = Engine(sess, max_length=256, max_batch=4, block_size=block_size)
    reqs = [{"input_ids": np.arange(1, 9), "max_new_tokens": 4}, {"input_ids": np.arange(3, 7), "max_new_tokens": 4}]
    try:
        got = _run(eng, reqs, {0: 0, 1: 1})
    finally:
        eng.close()
    for i, r in enumerate(reqs):
        assert got[i] == _alone(sess, r)


def test_a_quantized_paged_requests_ring_is_counted_up_to_max_length() -> None:
    """A quantized paged state's native ring holds at most max_length rows: the engine counts a
    request's cost so (it counted residual + quant_group rows, 2.5x here), and a budget of two
    full requests is accepted."""
    sess = ours(MODEL)
    so = {"quant": "int8"}  # residual 128 + group 32 > max_length 64
    with sess.create_state(max_length=64, layout="paged", block_size=32, **so) as st:
        n = 63
        sess.run(["logits"], {"input_ids": np.arange(1, n + 1)[None], "position_ids": np.arange(n)[None],
                              "attention_mask": np.ones((1, n), np.int64)}, state=st)
        full = st.info()["totals"]["committed_bytes"]
    with Engine(sess, max_length=64, block_size=32, budget=2 * full, state_options=so) as eng:
        assert eng._cost(64) <= full


def test_a_request_whose_token_cannot_be_chosen_ends_alone() -> None:
    """A request whose logits leave nothing to sample (no_repeat_ngram_size=1 after every id was
    used: generate() alone raises ValueError) ends with finish_reason "error", at its first token
    or later; the others get every token, as generate() alone gives them."""
    sess = ours(MODEL)
    bad = dict(max_new_tokens=4, do_sample=True, seed=0, no_repeat_ngram_size=1)
    with pytest.raises(ValueError, match="cannot sample"):
        olkv.generate(sess, np.arange(256), **bad)
    good = dict(input_ids=[3, 17, 42], max_new_tokens=12)
    want = _alone(sess, good)
    for prompt in (np.arange(256), np.arange(1, 256)):  # fails at the first token, at the second
        with Engine(sess, max_batch=4, max_length=300) as eng:
            g = eng.add_request(np.array(good["input_ids"]), max_new_tokens=12)
            b = eng.add_request(prompt, **bad)
            streamed: Dict[int, List[int]] = {}
            for _ in range(40):
                for out in eng.step():
                    streamed.setdefault(out.request_id, []).extend(out.tokens)
                if not eng.has_work():
                    break
            assert not eng.has_work()
            assert eng.request(b).finish_reason == "error" and "cannot sample" in eng.request(b).error
            assert eng.request(g).tokens == streamed[g] == want and eng.request(g).finish_reason == "length"
            assert len(eng.request(b).tokens) == (0 if prompt.size == 256 else 1)


def test_a_model_branching_on_the_mask_width_runs_one_request_at_a_time() -> None:
    """The genai LongRoPE export picks its rope factors from the attention mask's width: rows run
    together would take the longest row's; the Engine warns and runs one request at a time, and
    each gets generate()'s tokens."""
    sess = olkv.InferenceSession(fx.model_path("phi3longrope-genai"), threads=1)
    rng = np.random.default_rng(0)
    reqs = [dict(input_ids=list(rng.integers(0, 256, 40)), max_new_tokens=6),
            dict(input_ids=list(rng.integers(0, 256, 4)), max_new_tokens=12)]
    want = [_alone(sess, r) for r in reqs]
    for kw in (dict(max_batch=4), dict(max_batch=1, max_tokens_per_step=8)):  # batched rows; a prompt in chunks
        with pytest.warns(RuntimeWarning, match="one request at a time"):
            eng = Engine(sess, max_length=64, **kw)
        with eng:
            assert eng.max_batch == 1 and eng.max_tokens_per_step >= 64
            got = _run(eng, reqs, {0: 0, 1: 0})
        assert [got[0], got[1]] == want
    with pytest.raises(NotImplementedError, match="prefix_cache=False"):
        Engine(sess, max_length=64, prefix_cache=True)


class _InterruptAfterRun:
    """A session whose run sends this process a SIGINT once, after the real call returned: where a
    Ctrl-C pressed during a native call arrives."""

    def __init__(self, sess: Any, after: int) -> None:
        self._sess, self._after = sess, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)

    def run(self, *a: Any, **kw: Any) -> Any:
        import os
        import signal

        out = self._sess.run(*a, **kw)
        self._after -= 1
        if self._after == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return out


@pytest.mark.parametrize("after", [1, 2, 4])
def test_ctrl_c_during_a_step_leaves_the_engine_consistent(after: int) -> None:
    """A Ctrl-C arriving as a step's model call returns is raised at the step's end: the shared
    state and the rows stay together, and resuming gives generate()'s tokens (the resumed run
    failed every running request: the state was a position ahead)."""
    sess = ours(MODEL)
    reqs = [dict(input_ids=[3, 17, 42, 5], max_new_tokens=8), dict(input_ids=[9, 8], max_new_tokens=6)]
    want = [_alone(sess, r) for r in reqs]
    eng = Engine(sess, max_batch=4, max_length=64)
    with eng:
        ids = [eng.add_request(np.array(r["input_ids"]), max_new_tokens=r["max_new_tokens"]) for r in reqs]
        eng.session = _InterruptAfterRun(sess, after)
        with pytest.raises(KeyboardInterrupt):
            eng.run_until_done()
        eng.session = sess
        eng.run_until_done()
        assert [eng.request(i).tokens for i in ids] == want
        assert all(eng.request(i).finish_reason == "length" for i in ids)


def test_ctrl_c_during_generate_next_token_leaves_the_generator_as_one() -> None:
    """The Generator's rows, random stream and state move together: a Ctrl-C arriving inside
    generate_next_token is raised at its end, and the sampled tokens equal an uninterrupted run."""
    import os
    import signal

    sess = ours(MODEL)

    def tokens(interrupt_at: int) -> List[int]:
        g = olkv.Generator(sess, max_length=20, do_sample=True, seed=3, top_k=0)
        g.append_tokens(np.array([3, 17, 42]))
        step = 0
        real = g._runner.run

        def run(*a: Any, **kw: Any) -> Any:
            out = real(*a, **kw)
            if step == interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)
            return out

        g._runner.run = run
        while not g.is_done():
            try:
                g.generate_next_token()
            except KeyboardInterrupt:
                assert g.sequences.shape == g.attention_mask.shape
            step += 1
        out = g.get_sequence(0).tolist()
        g.close()
        return out

    want = tokens(-1)
    for at in (1, 4):
        assert tokens(at) == want
